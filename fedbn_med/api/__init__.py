"""The library's public face, re-exported by :mod:`fedbn_med` (``fedbn_med.run``, ...).

- :mod:`fedbn_med.api.run`: :func:`~fedbn_med.api.run.run`, one call for a federation
  (a registered task's spec, or a researcher's own network and datasets; in this process
  or over Flower), returning a typed :class:`~fedbn_med.api.result.FederationResult`;
- :mod:`fedbn_med.api.sites`: a site's data from MONAI datasets and a site's trainer
  from a spec, for a task's ``build_site``;
- :mod:`fedbn_med.api.checks`: :func:`~fedbn_med.api.checks.check_task`, the conformance
  checks a task passes.

Importing this package imports nothing heavy; its modules import torch.
"""
