"""Start, watch and stop the processes of a federation on this host.

- :mod:`.federation`: :class:`LocalFederation`, which owns a SuperLink, site nodes and runs.
- :mod:`.supervisor`: spawning named processes, waiting for a port, logs, stopping.
- :mod:`.processes`: process handles, event pipes, stopping a process with its children.
- :mod:`.progress`: following a submitted run's ``progress.jsonl`` as it grows.
- :mod:`.flower_cli`: Flower's command lines (SuperLink, ``flwr run``, key registration).
- :mod:`.sitehost`: the site host, which loads the training stack once and forks sites;
  :mod:`.sitehost_client`: the launcher's side of it.
- :mod:`.devices`: which GPU each local site trains on.
- :mod:`.fleet_gate`: the server's public port (Fleet API only, signed, bounded), with
  its rules in :mod:`.gate_rules` and its connections in :mod:`.gate_server`.
- :mod:`.watchdog`: stops the launcher's processes if the launcher dies unannounced.

The names below load on first use: the gate and the watchdog run as modules of this
package and must not import the training stack (torch) that :class:`LocalFederation`
pulls in through the run spec.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedbn_med.federation.launcher.devices import site_device, site_devices
    from fedbn_med.federation.launcher.federation import LocalFederation
    from fedbn_med.federation.launcher.flower_cli import APP_DIR, TlsFiles
    from fedbn_med.federation.launcher.processes import FederationError, ForkedSite, free_port

__all__ = ["APP_DIR", "FederationError", "ForkedSite", "LocalFederation", "TlsFiles",
           "free_port", "site_device", "site_devices"]

_HOME = {"site_device": "devices", "site_devices": "devices",
         "LocalFederation": "federation", "APP_DIR": "flower_cli", "TlsFiles": "flower_cli",
         "FederationError": "processes", "ForkedSite": "processes", "free_port": "processes"}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
