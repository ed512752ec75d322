#!/usr/bin/env python
"""Baseline for ``federation_overhead.py``: the same ABIDE work on stock Flower, as shipped.

:func:`stock_flower_run` starts Flower's own ``flower-superlink`` and one
``flower-supernode`` per site with their default behaviour (a fresh ClientApp process per
message, the default polling, the SuperLink's default runtime dependency set-up), then
``flwr run benchmarks/stock_flower <connection> --stream``: a ServerApp that runs Flower's
Message-API ``FedAvg`` with its ``start`` loop over the project's ABIDE MLP. Figures come
from the ServerApp's own timestamps (``time.time()``, one JSON line per round).

    python benchmarks/_stock_flower.py --rounds 2

Every process started here, and every process below them, is stopped at the end, also on
error or timeout. Everything listens on 127.0.0.1 only; Flower's state and logs go to
``workdir`` (``FLWR_HOME`` is ``workdir/flwr_home``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

__all__ = ["APP_DIR", "stock_flower_run"]

APP_DIR = Path(__file__).resolve().parent / "stock_flower"
_BIN = Path(sys.executable).parent
_CONNECTION = "stock"  # the SuperLink connection's name in FLWR_HOME/config.toml
_HOST = "127.0.0.1"


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct loopback ports that are free now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((_HOST, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tool(name: str) -> str:
    path = _BIN / name
    if not path.exists():
        raise FileNotFoundError(f"Flower's '{name}' was not found next to {sys.executable}.")
    return str(path)


def _site_data_paths(sites: Sequence[str]) -> dict[str, Path]:
    """Return each site's data folder: its site file's, else the built-in cohort (made once).

    The same choice as the project's own runs make for the built-in cohort, done here once
    so that the ClientApp processes do not race to generate it.
    """
    from fedbn_med.tasks.abide.cohort import DEFAULT_SITE_IDS, ensure_cohort
    from fedbn_med.tasks.abide.settings import Settings
    from fedbn_med.tasks.abide.sites import load_sites

    configs = load_sites(list(sites))
    wanted = tuple(dict.fromkeys(
        (*DEFAULT_SITE_IDS, *(i for c in configs.values() for i in c.abide_site_ids))))
    builtin: Path | None = None
    paths = {}
    for name, config in configs.items():
        if config.data_dir is not None:
            paths[name] = Path(config.data_dir)
            continue
        if builtin is None:
            builtin = ensure_cohort(sites=wanted, site_effect=Settings().site_effect)
        paths[name] = builtin
    return paths


class _Processes:
    """The processes this run started, each in its own session; stops them and all below."""

    def __init__(self, logs: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.logs, self.env, self.cwd = logs, dict(env), cwd
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=self.cwd, start_new_session=True)
        self.started[name] = proc
        return proc

    def tail(self, name: str, lines: int = 20) -> str:
        path = self.logs / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """Stop every started process, its process group and its descendants.

        The SuperLink starts its executor in a session of its own, so descendants are
        collected (before anything is signalled) as well as process groups.
        """
        victims: dict[int, psutil.Process] = {}
        for proc in self.started.values():
            try:
                parent = psutil.Process(proc.pid)
                victims[parent.pid] = parent
                for child in parent.children(recursive=True):
                    victims[child.pid] = child
            except psutil.Error:
                continue
        for proc in self.started.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        for victim in victims.values():
            try:
                victim.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(list(victims.values()), timeout=grace)
        for proc in self.started.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for victim in alive:
            try:
                victim.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        for proc in self.started.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"The process listening on {_HOST}:{port} exited at start-up "
                               f"(code {proc.returncode}).")
        try:
            with socket.create_connection((_HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"Nothing listened on {_HOST}:{port} within {timeout:.0f} s.")


def _read_timeline(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stock_flower_run(rounds: int, sites: tuple[str, ...], workdir: Path,
                     timeout: float) -> dict[str, object]:
    """Run ``rounds`` of stock Flower FedAvg over ``sites`` and time it.

    Parameters
    ----------
    rounds : int
        Federated rounds (each: every site trains one round, then every site evaluates).
    sites : tuple of str
        Site names (``sites/<name>.toml``), one SuperNode each.
    workdir : pathlib.Path
        Folder for ``FLWR_HOME``, the logs and the ServerApp's timeline (created).
    timeout : float
        Seconds allowed from the SuperLink's start to the end of ``flwr run``.

    Returns
    -------
    dict
        ``rounds``; ``seconds_total`` (from starting the SuperLink until ``flwr run``
        returned); ``startup_seconds`` (from starting the SuperLink until round 1 began);
        ``seconds_per_round`` (rounds' wall time / rounds); also ``rounds_seconds``,
        ``round_seconds`` (each round) and ``nodes_ready_seconds`` (start until every
        SuperNode had connected).

    Raises
    ------
    TimeoutError
        When the run did not end within ``timeout``.
    RuntimeError
        When a Flower process failed or the timeline misses a round (with log tails).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}.")
    if not sites:
        raise ValueError("sites must name at least one site, e.g. ('NYU', 'UM').")
    workdir = Path(workdir).resolve()
    flwr_home, logs = workdir / "flwr_home", workdir / "logs"
    flwr_home.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    timeline = workdir / "timeline.jsonl"
    timeline.unlink(missing_ok=True)
    data_paths = _site_data_paths(sites)

    link_port, *node_ports = _free_ports(1 + len(sites))
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{_CONNECTION}"\n\n[superlink.{_CONNECTION}]\n'
        f'address = "{_HOST}:{link_port}"\ninsecure = true\n')
    overrides = workdir / "run_config.toml"
    overrides.write_text(f"num-server-rounds = {int(rounds)}\n"
                         f"sites = {json.dumps(','.join(sites))}\n"
                         f"timing-file = {json.dumps(str(timeline))}\n")
    env = {**os.environ, "FLWR_HOME": str(flwr_home), "FLWR_TELEMETRY_ENABLED": "0",
           "PYTHONUNBUFFERED": "1", "PATH": f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    procs = _Processes(logs, env, workdir)
    started = time.time()
    try:
        link = procs.spawn("superlink", [_tool("flower-superlink"), "--insecure",
                                         "--host", _HOST, "--port", str(link_port)])
        _wait_listening(link_port, link, timeout=min(60.0, timeout))
        for name, port in zip(sites, node_ports, strict=True):
            node_config = f"site={json.dumps(name)} data-path={json.dumps(str(data_paths[name]))}"
            procs.spawn(f"supernode-{name}", [
                _tool("flower-supernode"), "--insecure", "--superlink", f"{_HOST}:{link_port}",
                "--node-config", node_config, "--host", _HOST, "--port", str(port)])
        run = procs.spawn("flwr-run", [_tool("flwr"), "run", str(APP_DIR), _CONNECTION,
                                       "--stream", "--run-config", str(overrides)])
        try:
            run.wait(timeout=max(1.0, timeout - (time.time() - started)))
        except subprocess.TimeoutExpired as err:
            raise TimeoutError(f"stock Flower did not finish {rounds} round(s) within "
                               f"{timeout:.0f} s; flwr run log:\n{procs.tail('flwr-run')}"
                               ) from err
        ended = time.time()
        events = _read_timeline(timeline)
        marks = {int(e["round"]): float(e["time"]) for e in events if "round" in e}
        if run.returncode != 0 or any(r not in marks for r in range(rounds + 1)):
            raise RuntimeError(
                f"stock Flower run failed (flwr run exit {run.returncode}; rounds timed: "
                f"{sorted(marks)}).\nflwr run log:\n{procs.tail('flwr-run', 40)}\n"
                f"superlink log:\n{procs.tail('superlink')}")
    finally:
        procs.stop()
    ready = next((float(e["time"]) for e in events if e.get("event") == "nodes-ready"), None)
    per_round = [marks[r] - marks[r - 1] for r in range(1, rounds + 1)]
    return {
        "rounds": rounds,
        "seconds_total": round(ended - started, 2),
        "seconds_per_round": round((marks[rounds] - marks[0]) / rounds, 2),
        "startup_seconds": round(marks[0] - started, 2),
        "rounds_seconds": round(marks[rounds] - marks[0], 2),
        "round_seconds": [round(s, 2) for s in per_round],
        "nodes_ready_seconds": None if ready is None else round(ready - started, 2),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Run the baseline once and print its figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sites", default="NYU,UM,USM,UCLA",
                        help="comma-separated site names (default: NYU,UM,USM,UCLA)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds allowed for the whole run (default: 900)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="folder for FLWR_HOME, logs and timeline (default: a temp dir)")
    args = parser.parse_args(argv)
    sites = tuple(s.strip() for s in args.sites.split(",") if s.strip())
    if args.workdir is not None:
        print(json.dumps(stock_flower_run(args.rounds, sites, args.workdir, args.timeout)))
        return
    with tempfile.TemporaryDirectory(prefix="stock-flower-") as tmp:
        print(json.dumps(stock_flower_run(args.rounds, sites, Path(tmp), args.timeout)))


if __name__ == "__main__":
    main()
