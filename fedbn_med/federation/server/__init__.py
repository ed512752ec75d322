"""The federation server's parts, by job; :mod:`fedbn_med.federation.server_app` runs them.

- :mod:`.rounds`: :class:`FederationServer`, the round loop (:mod:`fedbn_med.fl.rounds`
  decides what a round is); it owns the model's state, a registry and a recorder;
- :mod:`.registry`: :class:`~.registry.SiteRegistry`, which site is behind which node, and
  a bounded wait for them;
- :mod:`.recorder`: :class:`~.recorder.RunRecorder`, the run's events, checkpoints and
  resume, its rows to MLflow (off the round's path) and its results at the end;
- :mod:`.checks`: every reply a site sends, decoded and checked;
- :mod:`.grid`: sending messages and collecting replies at the right times.
"""

from fedbn_med.federation.server.grid import FastGrid
from fedbn_med.federation.server.rounds import FederationServer

__all__ = ["FastGrid", "FederationServer"]
