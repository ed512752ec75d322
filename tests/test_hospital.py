"""Hospital mode attacked as an outsider, an impostor site and a dishonest server would.

One consortium server (``--serve --tls-dir``, node authentication on) runs as the README
says, on 127.0.0.1, with sites started by their own command lines.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from fedbn_med.federation.config import NodeSettings
from fedbn_med.federation.consortium import create_consortium
from fedbn_med.federation.events import (
    Event,
    Joined,
    ServerStarted,
    SiteError,
    SiteRefused,
    Trained,
    UpdateRefused,
    read_events,
)
from fedbn_med.federation.launcher import TlsFiles, free_port
from fedbn_med.federation.launcher.flower_cli import connection_config, register_key
from fedbn_med.federation.launcher.processes import terminate_tree
from fedbn_med.federation.run import run_site
from fedbn_med.paths import repo_root
from fedbn_med.spec import RunSpec

from .keyed import keyed_federation, run_federation, start_honest, start_wrapped, stop_nodes
from .stores import sqlite_store

pytestmark = pytest.mark.integration

PIPELINE = str(repo_root() / "pipelines" / "abide_fedbn.py")


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, PIPELINE, *cmd], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=log.parent)


def _events(workdir: Path) -> list[Event]:
    path = workdir / "progress.jsonl"
    if not path.exists():
        return []
    return read_events(path)


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def consortium(small_cohort, tmp_path_factory):
    """The README's server: keys made for a DNS name only, ``--serve --tls-dir``."""
    root = tmp_path_factory.mktemp("hospital")
    keys = create_consortium(root / "keys", ["fl.consortium.example"], ["NYU", "UM"])
    port = free_port()
    server = _start(["--serve", "--listen", f"127.0.0.1:{port}", "--tls-dir",
                     str(root / "keys"), "--sites", "NYU,UM", "--rounds", "2",
                     "--wait-timeout", "400", "--round-timeout", "60",
                     "--workdir", str(root / "server"), "--data-dir", str(small_cohort),
                     "--tracking-uri", sqlite_store(root / "mlflow.db"), "--quiet"],
                    root / "server.log")
    sites: list[subprocess.Popen] = []
    try:
        _wait(lambda: _listening(port), 120, "the public port", server)
        yield {"root": root, "keys": keys, "port": port, "server": server, "sites": sites,
               "workdir": root / "server", "cohort": small_cohort}
    finally:
        for proc in [*sites, server]:
            terminate_tree(proc.pid, signal.SIGTERM, 10.0)


def _site(c: dict, name: str, key: str, *extra: str) -> subprocess.Popen:
    proc = _start(["--site", name, "--superlink", f"127.0.0.1:{c['port']}",
                   "--root-certificates", str(c["keys"].ca_cert),
                   "--auth-key", str(c["keys"].site_keys[key][0]), "--device", "cpu",
                   "--data-dir", str(c["cohort"]), "--state-dir",
                   str(c["root"] / f"state-{name}-{key}"), *extra],
                  c["root"] / f"site-{name}-{key}.log")
    c["sites"].append(proc)
    return proc


def test_outsider_with_the_ca_reaches_only_the_fleet_api(consortium, tmp_path):
    c = consortium
    eve = create_consortium(tmp_path / "eve", ["127.0.0.1"], ["EVE"])
    home = tmp_path / "flwr_home"
    home.mkdir()
    tls = TlsFiles(c["keys"].ca_cert, eve.server_cert, eve.server_key)  # only ca.pem is used
    (home / "config.toml").write_text(connection_config(f"127.0.0.1:{c['port']}", tls))
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0"}
    # Flower's own CLI, as the outsider would use it: no key of its own gets registered
    with pytest.raises(RuntimeError, match="Could not register"):
        register_key(eve.site_keys["EVE"][1], env=env, cwd=tmp_path)
    context = ssl.create_default_context(cafile=str(c["keys"].ca_cert))
    with httpx.Client(base_url=f"https://127.0.0.1:{c['port']}", verify=context) as client:
        for path in ("/v1/control/list-runs", "/v1/control/start-run",
                     "/v1/control/register-node", "/v1/runtime/pull-task-input",
                     "/v1/fleet/../control/list-runs", "/docs"):
            answer = client.post(path, content=b"")
            assert answer.status_code == 404, (path, answer.status_code)
    # nor can it join as a node with its own key
    with pytest.raises(ConnectionError, match="could not reach"):
        run_site("EVE", f"127.0.0.1:{c['port']}", state_dir=tmp_path / "eve-state",
                 root_certificates=c["keys"].ca_cert, auth_key=eve.site_keys["EVE"][0],
                 max_wait_time=2.0)


def test_a_reply_larger_than_the_model_is_refused_before_it_is_read(consortium):
    c = consortium
    limit_file = c["workdir"] / "server" / "max_body"
    _wait(limit_file.exists, 120, "the ServerApp's reply bound", c["server"])
    limit = int(limit_file.read_text())
    assert limit < 16 << 20
    context = ssl.create_default_context(cafile=str(c["keys"].ca_cert))
    with socket.create_connection(("127.0.0.1", c["port"]), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"POST /v1/fleet/push-object HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/protobuf\r\n"
                    b"Content-Length: 268435456\r\n\r\n" + b"\0" * 1024)
        status = tls.recv(4096).split(b"\r\n", 1)[0]
    assert b" 413 " in status, status


def test_a_node_is_the_site_its_key_says(consortium):
    c = consortium
    impostor = _site(c, "UM", "NYU")  # NYU's key, says it is UM
    events = _wait(lambda: [e for e in _events(c["workdir"]) if isinstance(e, SiteRefused)],
                   240, "the impostor's refusal", c["server"])
    assert "holds the key of site 'NYU'" in events[0].reason
    assert not [e for e in _events(c["workdir"]) if isinstance(e, Joined)]  # or Rejoined
    terminate_tree(impostor.pid, signal.SIGTERM, 10.0)
    _site(c, "NYU", "NYU")
    _site(c, "UM", "UM")
    assert c["server"].wait(timeout=400) == 0, (c["root"] / "server.log").read_text()[-3000:]
    results = json.loads((c["workdir"] / "results.json").read_text())
    assert set(results["final"]) == {"NYU", "UM"}
    joined = {e.site: e.node for e in _events(c["workdir"]) if type(e) is Joined}
    assert set(joined) == {"NYU", "UM"}


def test_sigterm_stops_every_process_of_the_server(tmp_path, small_cohort):
    port = free_port()
    server = _start(["--serve", "--listen", f"127.0.0.1:{port}", "--sites", "NYU,UM",
                     "--rounds", "1", "--wait-timeout", "300", "--workdir",
                     str(tmp_path / "server"), "--data-dir", str(small_cohort),
                     "--tracking-uri", sqlite_store(tmp_path / "mlflow.db"), "--quiet"],
                    tmp_path / "server.log")
    try:
        _wait(lambda: any(isinstance(e, ServerStarted)
                          for e in _events(tmp_path / "server")), 180, "the ServerApp", server)
        family = [server.pid, *(p.pid for p in psutil.Process(server.pid).children(True))]
        assert len(family) >= 4  # SuperLink, gate, flwr run, SuperExec/ServerApp
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 130
        time.sleep(0.5)
        alive = [p for p in family if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not alive, alive
        assert not _listening(port)
    finally:
        terminate_tree(server.pid, signal.SIGKILL, 5.0)


# ------------------------------------------------ dishonest, silent and stray site nodes
FAULTY_NODE = Path(__file__).with_name("faulty_node.py")


@pytest.fixture(scope="module")
def keyed_fed(small_cohort, tmp_path_factory):
    """A SuperLink with TLS and node authentication, and five nodes holding consortium keys.

    NYU and UM are honest; USM lies about its numbers; UCLA answers who it is but never
    trains; LURKER holds a key of the consortium, is in no run, and never answers.
    """
    root = tmp_path_factory.mktemp("keyed")
    faults = {"USM": "lies", "UCLA": "silent-train", "LURKER": "mute"}
    with keyed_federation(root, ["NYU", "UM", *faults]) as c:
        faulty = []
        try:
            for site, fault in faults.items():
                faulty.append(start_wrapped(c, FAULTY_NODE, site, small_cohort, fault))
            start_honest(c, ("NYU", "UM"), small_cohort)
            c.fed.wait_sites_ready(["NYU", "UM"], timeout=180)
            _wait(lambda: all((root / f"{s}.log").read_text().count("connected to")
                              for s in faults), 180, "the faulty nodes")
            yield {"c": c, "fed": c.fed, "root": root, "cohort": small_cohort}
        finally:
            # a silent or mute node only goes when killed (its own exit timer is 10 s)
            stop_nodes(faulty, grace=2.0)


def _keyed_run(k: dict, name: str, sites: tuple[str, ...], rounds: int,
               strategy: str = "fedbn", **server):
    spec = RunSpec(strategy=strategy, rounds=rounds, sites=sites, data_dir=k["cohort"])
    results, events, _ = run_federation(k["c"], name, spec, timeout=240, **server)
    return results, events


def test_bad_numbers_from_a_site_are_refused_and_rounds_go_on(keyed_fed):
    k = keyed_fed
    # default min-sites: a majority of NYU, UM, USM
    results, events = _keyed_run(k, "lies", ("NYU", "UM", "USM"), 3)
    assert "error" not in results, results
    refused = {e.round: e.reason for e in events if isinstance(e, UpdateRefused)}
    assert set(refused) == {1, 2, 3}, events
    assert "num-examples inf" in refused[1] and "num-examples -5" in refused[2]
    assert "names a metric 'bad metric!'" in refused[3]
    trained = [e for e in events if isinstance(e, Trained)]
    assert [e.sites for e in trained] == [["NYU", "UM"]] * 3
    assert set(results["final"]) >= {"NYU", "UM"}
    # the MLflow store took every round of the honest sites
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{k['root'] / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("abide-fedbn").experiment_id],
                              "tags.site = 'NYU'")
    assert runs and runs[0].data.metrics
    # UCLA (not in the run) and LURKER (no site of the run) were never asked anything
    for site in ("UCLA", "LURKER"):
        assert "faulty node got" not in (k["root"] / f"{site}.log").read_text(), site
    # nor waited for: no round stood still for a query's timeout (5 s)
    times = [e.t for e in trained]
    assert max(b - a for a, b in zip(times, times[1:])) < 5.0, times


def test_one_refused_site_under_the_default_min_sites_says_refused(keyed_fed):
    # two sites: a majority is both, so USM's refused update ends the run, and says why
    results, _ = _keyed_run(keyed_fed, "lies-two", ("NYU", "USM"), 1)
    assert "only 1 sites' updates were accepted (at least 2 needed). USM refused: it " \
           "reports num-examples inf" in results.get("error", ""), results


def test_round_timeout_bounds_a_site_that_never_answers(keyed_fed):
    k = keyed_fed
    results, events = _keyed_run(k, "silent", ("NYU", "UCLA"), 1, round_timeout=3.0,
                                 min_sites=1)
    assert "error" not in results, results
    (trained,) = [e for e in events if isinstance(e, Trained)]
    assert trained.missing == ["UCLA"] and trained.sites == ["NYU"]
    assert 3.0 <= trained.seconds < 15.0
    assert "faulty node got a train message" in (k["root"] / "UCLA.log").read_text()


def test_a_reply_is_bounded_in_time_bytes_and_objects_before_it_is_read(small_cohort, tmp_path):
    # UCLA answers round 1 with a reply whose head reached the SuperLink and whose
    # contents never follow (its link died mid-upload): the server waits for them only
    # until the round's deadline (flwr alone retries for about 100 s, and hid NYU's reply
    # behind it). Round 2's reply is three times the model's size, round 3's names
    # thousands of objects: each is refused before more than its bound is read.
    with keyed_federation(tmp_path, ["NYU", "UCLA"]) as c:
        hostile = start_wrapped(c, FAULTY_NODE, "UCLA", small_cohort, "hostile-upload")
        try:
            start_honest(c, ("NYU",), small_cohort)
            c.fed.wait_sites_ready(["NYU"], timeout=180)
            _wait(lambda: "connected to" in (tmp_path / "UCLA.log").read_text(), 180,
                  "the hostile node")
            spec = RunSpec(strategy="fedbn", rounds=3, sites=("NYU", "UCLA"),
                           data_dir=small_cohort)
            results, events, _ = run_federation(c, "hostile", spec, timeout=240,
                                                round_timeout=4.0, min_sites=1)
        finally:
            stop_nodes([hostile], grace=2.0)
    assert "error" not in results, results
    trained = [e for e in events if isinstance(e, Trained)]
    assert [e.round for e in trained] == [1, 2, 3]
    for event in trained:
        assert event.missing == ["UCLA"] and event.sites == ["NYU"], event
        assert event.seconds < 4.0 + 10.0, event
    refused = {e.round: e.reason for e in events
               if isinstance(e, UpdateRefused) and e.site == "UCLA"}
    assert "not all uploaded within 4 s" in refused[1], refused
    assert "bytes a reply may hold" in refused[2], refused
    assert "objects, more than the" in refused[3], refused
    assert set(results["final"]) == {"NYU"}
    assert (tmp_path / "UCLA.log").read_text().count("faulty node got a train message") == 3


def test_a_site_refuses_a_run_that_would_take_its_private_layers(keyed_fed, tmp_path):
    # whatever the server sends, the site's own policy decides, and it writes only
    # under its own state folder
    node = NodeSettings(site="NYU", state_dir=tmp_path / "state")
    for bad in ("/etc/evil", "../up", "a/b", ""):
        with pytest.raises(ValueError, match="Refused federation id"):
            node.state_path(bad)
    assert node.state_path("f-1").is_relative_to((tmp_path / "state").resolve())
    # NYU of the shared keyed federation: an honest node started as every site is
    k = keyed_fed
    results, events = _keyed_run(k, "f-1", ("NYU",), 1, strategy="fedavg", wait_timeout=8.0)
    assert "error" in results, results
    errors = [e for e in events if isinstance(e, SiteError)]
    assert errors and "refuses strategy 'fedavg'" in errors[0].reason
    # nothing of this run was written at the site (its runs' states lie by federation id)
    sites = k["fed"].workdir / "sites"
    assert not list(sites.glob("f-1*")) and not list(sites.rglob("f-1/*.safetensors"))
