"""The Flower adapter: the only package of fedbn_med that imports flwr.

- :mod:`.config`: what Flower carries for us (the run spec and server settings as one JSON
  value in the run config; a site's :class:`~.config.NodeSettings` in its node config).
- :mod:`.client_app`: the ClientApp that wraps a site's
  :class:`~fedbn_med.training.trainer.SiteTrainer`.
- :mod:`.server_app` and :mod:`.server`: the ServerApp; site discovery, the rounds
  (:mod:`fedbn_med.fl.rounds`), checkpoints and results.
- :mod:`.node`: a long-lived site node speaking Flower's Fleet API (one process per site).
- :mod:`.launcher`: starts and stops a SuperLink, the site host, site nodes and runs on
  127.0.0.1, and reads their typed :mod:`.events` from pipes.
- :mod:`.telemetry`: MLflow's and Flower's usage reports off in every command and every
  process it starts.
- :mod:`._flwr_compat`: every use of a non-public flwr API, behind a version check at
  import (flwr is pinned to 1.42.0) and a contract test (``tests/test_flwr_compat.py``).
"""
