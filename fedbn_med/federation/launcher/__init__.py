"""Start, watch and stop the processes of a federation on this host.

- :mod:`.federation`: :class:`LocalFederation`, which owns a SuperLink, site nodes and runs.
- :mod:`.processes`: process handles, event pipes, stopping a process with its children.
- :mod:`.flower_cli`: Flower's command lines (SuperLink, ``flwr run``, key registration).
- :mod:`.sitehost`: the site host, which loads the training stack once and forks sites.
- :mod:`.devices`: which GPU each local site trains on.
- :mod:`.fleet_gate`: the server's public port (Fleet API only, signed, bounded).
- :mod:`.watchdog`: stops the launcher's processes if the launcher dies unannounced.
"""

from __future__ import annotations

from fedbn_med.federation.launcher.devices import site_device, site_devices
from fedbn_med.federation.launcher.federation import LocalFederation
from fedbn_med.federation.launcher.flower_cli import APP_DIR, TlsFiles
from fedbn_med.federation.launcher.processes import FederationError, ForkedSite, free_port

__all__ = ["APP_DIR", "FederationError", "ForkedSite", "LocalFederation", "TlsFiles",
           "free_port", "site_device", "site_devices"]
