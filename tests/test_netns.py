"""A network fault between hosts: the server and each site in a network namespace of its own.

The namespaces, a bridge in the server's and a veth link per site are made here and
removed after. One site's link is cut for a while, then restored: the round goes on
without it, the site reconnects and the run completes. Skipped where namespaces cannot
be made (not root, no iproute2).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from fedbn_med.federation.config import ServerSettings, run_config
from fedbn_med.federation.events import Event, Trained
from fedbn_med.federation.launcher import FederationError, LocalFederation, free_port
from fedbn_med.spec import RunSpec

from .stores import sqlite_store

pytestmark = pytest.mark.integration

SUBNET = "10.231.7"  # the namespaces' own addresses, on links made by this test
SITES = ("NYU", "UM")


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def _inside(ns: str) -> list[str]:
    """The command prefix that runs a process in network namespace ``ns``."""
    return ["ip", "netns", "exec", ns]


def _namespaces_work() -> bool:
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    probe = f"fbprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
        return True
    except (subprocess.CalledProcessError, OSError):
        return False


@pytest.fixture()
def network():
    if not _namespaces_work():
        pytest.skip("network namespaces are not available here (needs root and iproute2)")
    tag = str(os.getpid() % 10000)
    server, sites = f"fbs{tag}", {s: f"fb{s}{tag}" for s in SITES}
    made = []
    try:
        _ip("netns", "add", server)
        made.append(server)
        _ip("link", "set", "lo", "up", ns=server)
        _ip("link", "add", "br0", "type", "bridge", ns=server)
        _ip("addr", "add", f"{SUBNET}.1/24", "dev", "br0", ns=server)
        _ip("link", "set", "br0", "up", ns=server)
        for i, ns in enumerate(sites.values()):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "add", f"up{i}", "netns", server, "type", "veth", "peer", "name",
                "eth0", "netns", ns)
            _ip("link", "set", f"up{i}", "master", "br0", "up", ns=server)
            _ip("addr", "add", f"{SUBNET}.{10 + i}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
        yield server, sites
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30,
                           check=False)


def test_site_link_cut_for_a_while_then_restored(network, small_cohort, tmp_path):
    server_ns, site_ns = network
    config = RunSpec(strategy="fedbn", rounds=12, sites=SITES, data_dir=small_cohort)
    events: list[Event] = []
    cut = {}
    # the server namespace is new and empty: any port is free there
    with LocalFederation(tmp_path / "fed", host=f"{SUBNET}.1", port=free_port(),
                         prefix=_inside(server_ns)) as fed:
        fed.start_superlink()
        for site in SITES:
            fed.start_site(site, data_dir=small_cohort, device="cpu", threads=1,
                           prefix=_inside(site_ns[site]))
        fed.wait_sites_ready(list(SITES), timeout=180)

        def on_event(event):
            events.append(event)
            if isinstance(event, Trained) and event.round == 2 and not cut:
                _ip("link", "set", "up1", "down", ns=server_ns)  # UM's cable is pulled
                cut["at"] = time.monotonic()
            elif cut and "restored" not in cut and isinstance(event, Trained) \
                    and "UM" in event.missing:
                _ip("link", "set", "up1", "up", ns=server_ns)
                cut["restored"] = time.monotonic()

        rc = run_config(config, ServerSettings(
            workdir=tmp_path / "run", tracking_uri=sqlite_store(tmp_path / "mlflow.db"),
            federation_id="netns", min_sites=1, round_timeout=12.0))
        try:
            # until_done: the federation is stopped next, once its results are written
            results = fed.watch(fed.submit(rc, results_dir=tmp_path / "run"),
                                on_event=on_event, timeout=600, results_dir=tmp_path / "run",
                                until_done=True)
        except FederationError as err:  # say what each site saw, to tell a stall from a cut
            logs = "\n".join(f"--- site-{site}:\n{fed.log_tail(f'site-{site}', 30)}"
                             for site in SITES)
            raise AssertionError(f"{err}\n{logs}") from err

    assert "restored" in cut, "the cut showed as a round without UM"
    rounds = [e for e in events if isinstance(e, Trained)]
    assert [e.round for e in rounds] == list(range(1, 13))
    back = [e.round for e in rounds if "UM" in e.sites and
            e.round > min(r.round for r in rounds if "UM" in r.missing)]
    assert back, "UM took part again after its link came back"
    assert set(results["final"]) == set(SITES)
