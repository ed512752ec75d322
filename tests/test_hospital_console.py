"""Hospital mode as an operator lives it: the deployment guide's commands, relative paths.

The key tool, one server and two sites run as separate command lines from one folder,
with the relative paths a person types (``--tls-dir keys/``, ``keys/ca.pem``). The
server prints its run folder, the MLflow address and the onboarding command; each site
says that it joined and what left it each round (names, counts, bytes; no BN layer), and
exits 0 when the federation ends.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedbn_med.federation.launcher import free_port
from fedbn_med.federation.launcher.processes import terminate_tree
from fedbn_med.fl.partition import partition_model
from fedbn_med.paths import repo_root
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.build import build_model

from .stores import sqlite_store

pytestmark = pytest.mark.integration

PIPELINES = repo_root() / "pipelines"


def _run(cmd: list[str], cwd: Path, log: str) -> subprocess.Popen:
    out = open(cwd / log, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, *cmd], cwd=cwd, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_server_and_two_sites_with_relative_paths_print_and_exit(small_cohort, tmp_path):
    keys = subprocess.run([sys.executable, str(PIPELINES / "consortium_keys.py"), "--out",
                           "keys/", "--server-host", "127.0.0.1", "--sites", "NYU,UM"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert keys.returncode == 0, keys.stderr
    port = free_port()
    pipeline = str(PIPELINES / "abide_fedbn.py")
    server = _run([pipeline, "--serve", "--listen", f"127.0.0.1:{port}", "--tls-dir", "keys/",
                   "--sites", "NYU,UM", "--rounds", "2", "--wait-timeout", "300",
                   "--data-dir", str(small_cohort), "--workdir", "server-run",
                   "--tracking-uri", sqlite_store(tmp_path / "mlflow.db"), "--quiet"],
                  tmp_path, "server.log")
    sites = {name: _run([pipeline, "--site", name, "--superlink", f"127.0.0.1:{port}",
                         "--root-certificates", "keys/ca.pem", "--auth-key", f"keys/{name}.key",
                         "--device", "cpu", "--data-dir", str(small_cohort),
                         "--state-dir", f"state/{name}", "--wait-timeout", "300"],
                        tmp_path, f"{name}.log")
             for name in ("NYU", "UM")}
    try:
        assert server.wait(timeout=400) == 0, (tmp_path / "server.log").read_text()
        for name, proc in sites.items():
            assert proc.wait(timeout=60) == 0, (tmp_path / f"{name}.log").read_text()
    finally:
        for proc in [*sites.values(), server]:
            terminate_tree(proc.pid, signal.SIGTERM, 10.0)

    said = (tmp_path / "server.log").read_text()
    run_folder = tmp_path / "server-run"
    assert f"Run folder:     {run_folder}" in said
    assert "MLflow:         sqlite:///" in said
    onboard = re.search(r"python pipelines/onboard_site.py .*--checkpoint (\S+)", said)
    assert onboard is not None, said
    assert Path(onboard.group(1)) == run_folder / "server" / "global.safetensors"
    assert Path(onboard.group(1)).is_file()

    private = partition_model(build_model(16, RunSpec.for_task("abide"))).private
    for name in ("NYU", "UM"):
        log = (tmp_path / f"{name}.log").read_text()
        assert f"[{name}] joined the federation at 127.0.0.1:{port}" in log
        assert re.search(rf"\[{name}\] round 1: trained; sent \d+ tensors \([\d.]+ KiB\)", log)
        assert f"[{name}] round 2: scored the final model" in log
        assert f"[{name}] the federation has ended" in log
        sent = [line.split("tensors sent: ", 1)[1].split(", ")
                for line in log.splitlines() if "tensors sent: " in line]
        assert sent and sent[0], log
        assert not set(sent[0]) & set(private), "a BN key was announced as sent"
        # each site kept its own state, in its own folder
        assert list((tmp_path / "state" / name).rglob(f"{name}*.safetensors"))
