"""The server's processes under faults: a launcher killed outright, a port still held, a
site restarted while the SuperLink still counts it as online.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from fedbn_med.federation.consortium import create_consortium
from fedbn_med.federation.launcher import LocalFederation, TlsFiles, free_port
from fedbn_med.federation.launcher.processes import terminate_tree
from fedbn_med.federation.node import _load_auth_keys
from fedbn_med.paths import repo_root

from .stores import sqlite_store

pytestmark = pytest.mark.integration

PIPELINE = str(repo_root() / "pipelines" / "abide_fedbn.py")


def _serve(workdir: Path, port: int, cohort: Path, *extra: str) -> subprocess.Popen:
    log = workdir.parent / f"{workdir.name}.log"
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, PIPELINE, "--serve", "--listen", f"127.0.0.1:{port}", "--sites",
             "NYU,UM", "--rounds", "2", "--wait-timeout", "300", "--workdir", str(workdir),
             "--data-dir", str(cohort), "--tracking-uri",
             sqlite_store(workdir.parent / "mlflow.db"), "--quiet", *extra],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_sigkill_of_the_server_stops_everything_and_resume_refuses_a_held_port(
        small_cohort, tmp_path):
    workdir = tmp_path / "server"
    workdir.mkdir()
    # an earlier run's events, as a resumed federation's workdir holds them
    (workdir / "progress.jsonl").write_text(
        json.dumps({"event": "ready", "sites": ["NYU", "UM"], "t": 1.0}) + "\n")
    port = free_port()
    server = _serve(workdir, port, small_cohort)
    try:
        deadline = time.monotonic() + 240
        while "server-started" not in (workdir / "progress.jsonl").read_text():
            assert server.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "server.log").read_text()[-2000:]
            time.sleep(0.3)
        family = [server.pid, *(p.pid for p in psutil.Process(server.pid).children(True))]
        assert len(family) >= 5  # watchdog, SuperLink, gate, flwr run, SuperExec/ServerApp
        assert _listening(port)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (_alive(family) or _listening(port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(family), [psutil.Process(p).cmdline()[:3] for p in _alive(family)]
        assert not _listening(port)
        # the old "ready" was not taken for this run's
        assert "sites ready" not in (tmp_path / "server.log").read_text()
    finally:
        terminate_tree(server.pid, signal.SIGKILL, 5.0)

    # a server (the one killed, had it survived) holds the port: resume refuses to start
    with socket.create_server(("127.0.0.1", port)):
        again = _serve(workdir, port, small_cohort, "--resume")
        try:
            assert again.wait(timeout=240) == 2
        finally:
            terminate_tree(again.pid, signal.SIGKILL, 5.0)
    log = (tmp_path / "server.log").read_text()
    assert f"Port 127.0.0.1:{port} is in use by another process" in log, log[-2000:]
    assert "sites ready" not in log


class _Zombie:
    """The site's earlier node, online at the SuperLink, as a killed site leaves it.

    A killed site's node stays online until it misses two heartbeats: a minute with the
    30 s our nodes ask for. Here it heartbeats (every 10 s, the shortest Flower takes)
    until :meth:`die`, then stays online 20 s more, as a site killed at that moment would.
    """

    def __init__(self, address: str, ca: Path, key: Path) -> None:
        from flwr.proto.fleet_pb2 import ActivateNodeRequest
        from flwr.supercore.primitives.asymmetric import public_key_to_bytes
        from flwr.supernode.fleet_http_client import FleetHttpClient
        from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

        private, public = _load_auth_keys(key)
        self.client = FleetHttpClient.from_server_address(
            address, False, ca.read_bytes(),
            interceptors=[NodeAuthHttpInterceptor(private, public)])
        self.node_id = self.client.ActivateNode(ActivateNodeRequest(
            public_key=public_key_to_bytes(public), heartbeat_interval=10)).node_id
        self.stop = threading.Event()
        self.died_at: float | None = None
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest
        from flwr.proto.node_pb2 import Node

        try:
            while not self.stop.wait(3.0):
                self.client.SendNodeHeartbeat(SendNodeHeartbeatRequest(
                    node=Node(node_id=self.node_id), heartbeat_interval=10))
        except Exception as err:  # noqa: BLE001 - reported by die()
            self.error = err

    def die(self) -> None:
        self.stop.set()
        self.thread.join()
        self.client.close()
        self.died_at = time.monotonic()
        assert self.error is None, f"the earlier node stopped heartbeating: {self.error!r}"


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_restarted_site_rejoins_once_the_server_lets_go(small_cohort, tmp_path):
    keys = create_consortium(tmp_path / "keys", ["127.0.0.1"], ["NYU"])
    tls = TlsFiles(keys.ca_cert, keys.server_cert, keys.server_key)
    with LocalFederation(tmp_path / "fed", tls=tls, node_auth=True) as fed:
        fed.start_superlink()
        fed.register_site_key(keys.site_keys["NYU"][1])
        address = fed.start_gate("127.0.0.1", free_port())
        key = keys.site_keys["NYU"][0]
        zombie = _Zombie(address, keys.ca_cert, key)
        log = tmp_path / "fed" / "logs" / "site-NYU.log"
        try:
            # the site restarted at once, twice: with a short wait bound and a long one
            short = fed.start_site("NYU", data_dir=small_cohort, device="cpu", threads=1,
                                   auth_key=key, superlink=address, max_wait_time=3.0)
            short_status = fed.site_status["site-NYU"]
            patient = fed.start_site("NYU", data_dir=small_cohort, device="cpu", threads=1,
                                     auth_key=key, superlink=address, max_wait_time=120.0)
            assert short.wait(timeout=240) == 2
            # it tried for its whole bound, and says so and why
            assert re.search(r"within 3 s \(it gave up after [3-9]\.\d s\)",
                             short_status.failure), short_status.failure
            assert "would not activate this site's node (HTTP 412)" in short_status.failure
            _wait_for(lambda: log.read_text().count("asking again") >= 3, 240,
                      "the patient site's retries")
        finally:
            zombie.die()
        fed.wait_sites_ready(["NYU"], timeout=120)
        # let in once the SuperLink let the old node go (two missed 10 s heartbeats)
        assert fed.site_status["site-NYU"].node_id == zombie.node_id
        assert time.monotonic() - zombie.died_at >= 10
        assert patient.poll() is None
