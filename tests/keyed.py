"""The consortium set-up the attack tests share: TLS, node keys, honest and wrapped nodes.

:func:`keyed_federation` makes the consortium's keys, starts a SuperLink with TLS and
node authentication and a site host, and registers every site's key. Honest sites are
forked from the host (:func:`start_honest`); a misbehaving one is a real node process
whose ClientApp a script in ``tests/`` wraps (:func:`start_wrapped`, see
``tests/faulty_node.py``). :func:`run_federation` submits one run and follows it to its
end, returning its results (or the error it ended with) and its events.
"""

from __future__ import annotations

import importlib
import logging
import math
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedbn_med.federation.config import ServerSettings, run_config
from fedbn_med.federation.consortium import ConsortiumFiles, create_consortium
from fedbn_med.federation.events import Event
from fedbn_med.federation.launcher import LocalFederation, TlsFiles
from fedbn_med.federation.launcher.processes import FederationError
from fedbn_med.federation.launcher.watchdog import family, stop_all
from fedbn_med.spec import RunSpec

__all__ = ["Consortium", "keyed_federation", "preload_task", "run_federation",
           "start_honest", "start_wrapped", "stop_nodes"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Consortium:
    """A running keyed federation: its launcher, key files and node ID to site map."""

    fed: LocalFederation
    keys: ConsortiumFiles
    node_sites: dict[str, str]
    root: Path


@contextmanager
def keyed_federation(root: Path, names: Sequence[str],
                     counts: dict[str, int] | None = None) -> Iterator[Consortium]:
    """Start a SuperLink with TLS and node authentication, with every site's key registered.

    The site host preloads the ABIDE task only (the tests here train nothing else). The
    keys are registered side by side: each registration is a ``flwr`` CLI process of its
    own, which takes seconds to start. ``counts``: training examples registered with the
    sites' keys (the server reads them, :func:`run_federation`).
    """
    keys = create_consortium(root / "keys", ["127.0.0.1"], list(names), counts=counts)
    tls = TlsFiles(keys.ca_cert, keys.server_cert, keys.server_key)
    with LocalFederation(root / "fed", tls=tls, node_auth=True) as fed:
        fed.start_site_host(threads=1, preload=["abide"])
        fed.start_superlink()
        with ThreadPoolExecutor(len(names)) as pool:
            ids = list(pool.map(lambda s: fed.register_site_key(keys.site_keys[s][1]), names))
        yield Consortium(fed, keys, {str(i): s for i, s in zip(ids, names)}, root)


def start_honest(c: Consortium, sites: Sequence[str], data_dir: Path | None) -> None:
    """Fork one honest node per site from the site host (``data_dir`` None: its site file)."""
    for site in sites:
        c.fed.start_site(site, data_dir=data_dir, device="cpu", threads=1,
                         auth_key=c.keys.site_keys[site][0])


def start_wrapped(c: Consortium, script: Path, site: str, data_dir: Path | None,
                  *script_args: str) -> subprocess.Popen:
    """Start ``python SCRIPT SCRIPT-ARGS NODE-ARGS``: a real node holding ``site``'s key.

    Its output goes to ``<root>/<site>.log``. Start it before :func:`start_honest`: the
    forked sites wait for the site host, and this process loads its stack meanwhile.
    """
    cmd = c.fed.node_command(site, c.root / "state", data_dir, "cpu",
                             auth_key=c.keys.site_keys[site][0])
    with open(c.root / f"{site}.log", "ab") as log:
        return subprocess.Popen([sys.executable, str(script), *script_args, *cmd[3:]],
                                stdout=log, stderr=subprocess.STDOUT,
                                env={**c.fed.env, "OMP_NUM_THREADS": "1"},
                                start_new_session=True)


def stop_nodes(procs: Sequence[subprocess.Popen], grace: float = 10.0) -> None:
    """Send SIGTERM to every wrapped node at once; kill what outlives ``grace``.

    At once, not one after the other: a node stuck in its ClientApp (a silent one) only
    goes when it is killed, and each would cost the whole grace in turn.
    """
    stop_all([member for proc in procs for member in family(proc.pid)], signal.SIGTERM,
             grace)
    for proc in procs:
        proc.wait(timeout=grace)


def preload_task(name: str = "abide") -> None:
    """Import a task's modules, as the site host does before it forks a site.

    A wrapped node calls this before it connects, so its first message (the server's
    query, which loads the site's data) does not wait for these imports.
    """
    from fedbn_med.tasks import get_task

    for module in get_task(name).preload:
        importlib.import_module(module)


def run_federation(c: Consortium, name: str, spec: RunSpec, timeout: float = 300.0,
                   **server: object) -> tuple[dict, list[Event], ServerSettings]:
    """Run one federation ``name`` on ``c``; return its results, typed events and settings.

    ``server`` are :class:`ServerSettings` fields (``wait_timeout`` defaults to 60 s);
    the MLflow store is ``<root>/mlflow.db``. A run that fails gives ``{"error": ...}``.
    """
    from fedbn_med.federation.consortium import read_registered_counts

    from .stores import sqlite_store  # not at the top: a wrapped node imports this file

    workdir = c.root / name
    settings = ServerSettings(**{
        "workdir": workdir, "federation_id": name, "node_sites": c.node_sites,
        "registered_counts": read_registered_counts(c.keys.ca_cert.parent),
        "tracking_uri": sqlite_store(c.root / "mlflow.db"), "wait_timeout": 60.0,
        **server})
    events: list[Event] = []
    run = c.fed.submit(run_config(spec, settings), results_dir=workdir)
    try:
        results = c.fed.watch(run, on_event=events.append, timeout=timeout,
                              results_dir=workdir, until_done=True)
    except FederationError as err:
        results = {"error": str(err)}
    logger.warning("federation %s ended after %.1f s", name,
                   events[-1].t - events[0].t if events else math.nan)
    return results, events, settings
