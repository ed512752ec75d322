"""The federation server's parts, by job; :mod:`fedbn_med.federation.server_app` runs them.

- :mod:`.grid`: sending messages and collecting replies at the right times;
- :mod:`.discovery`: which site is behind which node, and a bounded wait for them;
- :mod:`.rounds`: the rounds themselves (:mod:`fedbn_med.fl.rounds` decides what a round
  is), checkpoints and resume;
- :mod:`.results`: each round's metrics to MLflow, and the run's results at the end.
"""

from fedbn_med.federation.server.grid import FastGrid
from fedbn_med.federation.server.rounds import FederationServer

__all__ = ["FastGrid", "FederationServer"]
