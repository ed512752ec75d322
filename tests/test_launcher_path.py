"""Flower's own commands are found from the running interpreter, venv activated or not."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from fedbn_med.federation.launcher import LocalFederation

pytestmark = pytest.mark.integration


def test_superlink_starts_without_the_venv_on_path(tmp_path: Path, monkeypatch) -> None:
    # As `.venv/bin/python pipelines/abide_fedbn.py` without activating the venv: the
    # SuperLink starts flower-superexec by name, which must come from this interpreter.
    bin_dir = str(Path(sys.executable).parent)
    bare = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != Path(bin_dir).resolve())
    monkeypatch.setenv("PATH", bare or "/usr/bin:/bin")
    with LocalFederation(tmp_path) as fed:
        fed.start_superlink()
        time.sleep(3)  # Flower starts its executor once the app is up
        log = fed.log_tail("superlink")
        assert fed.processes["superlink"].poll() is None, log
        assert "Application startup failed" not in log and "No such file" not in log
