"""No usage report leaves a hospital: MLflow's and Flower's telemetry off in our processes.

MLflow 3 reports usage to its maintainers unless ``MLFLOW_DISABLE_TELEMETRY`` (or
``DO_NOT_TRACK``) is set: each process that uses it fetches a configuration from
``config.mlflow-telemetry.io`` and then sends records of the calls it made (their names,
durations and status, an installation ID kept in the home folder); ``mlflow ui`` sends
the browser's events the same way. Flower has a report of its own, off with
``FLWR_TELEMETRY_ENABLED=0``. A hospital's server or site should open no connection its
firewall rules did not plan for, and make no call it does not need (the records cost a
site's MLflow thread about a second of CPU per run).

:func:`telemetry_off` sets both variables where the user has not set them: every command
(:func:`fedbn_med.cli.main`, onboarding) calls it first, so the processes it starts
(SuperLink, ServerApp, sites) inherit it, and the federation launcher passes it to its
processes whoever started them. A researcher's own script that imports :mod:`fedbn_med`
keeps its process as it is; it can call :func:`telemetry_off` itself. The ``mlflow ui``
command a run prints sets ``MLFLOW_DISABLE_TELEMETRY=true`` in front.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["TELEMETRY_OFF", "telemetry_off"]

#: The variables that turn each library's report off, and their values.
TELEMETRY_OFF: dict[str, str] = {"MLFLOW_DISABLE_TELEMETRY": "true",
                                 "FLWR_TELEMETRY_ENABLED": "0"}


def telemetry_off(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Turn MLflow's and Flower's usage reports off in ``environ`` (default: this process).

    A variable already set (the user's own choice, either way) is left as it is.

    Returns
    -------
    dict of str to str
        The variables this call set.
    """
    env = os.environ if environ is None else environ
    chosen = {name: value for name, value in TELEMETRY_OFF.items() if name not in env}
    env.update(chosen)
    return chosen
