"""No usage report leaves a site: MLflow's and Flower's telemetry are off in our processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedbn_med.federation.telemetry import TELEMETRY_OFF, telemetry_off

# What makes MLflow keep quiet on its own (a CI machine, a test run): left out of the
# child's environment, so that the child shows what a hospital's machine would do.
QUIET_ANYWAY = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "DO_NOT_TRACK",
                *TELEMETRY_OFF)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in QUIET_ANYWAY}


def test_telemetry_off_sets_what_the_user_left_unset() -> None:
    env: dict[str, str] = {}
    assert telemetry_off(env) == TELEMETRY_OFF and env == TELEMETRY_OFF
    assert telemetry_off(env) == {}  # a second call changes nothing
    mine = {"MLFLOW_DISABLE_TELEMETRY": "false"}  # a user who wants MLflow's report
    assert telemetry_off(mine) == {"FLWR_TELEMETRY_ENABLED": "0"}
    assert mine["MLFLOW_DISABLE_TELEMETRY"] == "false"


def test_mlflow_reports_usage_unless_turned_off() -> None:
    code = ("from mlflow.telemetry.utils import is_telemetry_disabled as off; "
            "before = off(); from fedbn_med.federation.telemetry import telemetry_off; "
            "telemetry_off(); "
            "print(before, off())")
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True,
                         text=True, check=True, timeout=120).stdout.split()
    # on: the control (MLflow would report from this machine); off once we say so
    assert out == ["False", "True"]


def test_every_command_and_every_process_it_starts_is_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedbn_med.cli import main
    from fedbn_med.federation.launcher.federation import LocalFederation

    for name in TELEMETRY_OFF:
        monkeypatch.setenv(name, "x")  # recorded, so the test's own environment comes back
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert {k: os.environ.get(k) for k in TELEMETRY_OFF} == TELEMETRY_OFF
    # a federation started from a script of one's own: its processes are told too
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY")
    fed = LocalFederation(tmp_path / "fed")
    assert fed.env["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert fed.env["FLWR_TELEMETRY_ENABLED"] == "0"
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")  # the user's own choice stands
    assert LocalFederation(tmp_path / "fed2").env["MLFLOW_DISABLE_TELEMETRY"] == "false"
