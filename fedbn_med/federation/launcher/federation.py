"""Start, watch and stop the processes of a federation.

:class:`LocalFederation` owns every process it starts (SuperLink, site host, site nodes,
the ``flwr run`` client) and stops them all on exit, on error and on Ctrl-C, children
included; should this process die without doing so (SIGKILL), its watchdog
(:mod:`fedbn_med.federation.launcher.watchdog`) does. Servers bind 127.0.0.1 unless a
caller passes another host explicitly. It learns readiness, progress and exits from typed
events (:mod:`fedbn_med.federation.events`): the sites' on pipes, the run's in its
``progress.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import fedbn_med.federation.launcher.flower_cli as flower_cli
from fedbn_med.federation.config import NodeSettings, seal_run_config
from fedbn_med.federation.events import (
    Done,
    Event,
    ForkRequest,
    HostReady,
    HostRefused,
    NodeFailed,
    NodeLost,
    NodeReady,
    RunFailed,
    SiteExited,
    SiteForked,
    decode,
    encode,
)
from fedbn_med.federation.launcher.fleet_gate import GateLimits
from fedbn_med.federation.launcher.flower_cli import TlsFiles
from fedbn_med.federation.launcher.processes import (
    EventReader,
    FederationError,
    ForkedSite,
    SiteStatus,
    Watchdog,
    free_port,
    port_taken,
    terminate_tree,
)
from fedbn_med.spec import RUN_CONFIG_KEY

__all__ = ["LocalFederation"]

logger = logging.getLogger(__name__)

_SITE_EVENTS = (NodeReady, NodeLost, NodeFailed)


class LocalFederation:
    """A SuperLink, site nodes and runs, as child processes of this one.

    Parameters
    ----------
    workdir : path
        Where logs, Flower's home, checkpoints and results go.
    host : str
        Address the SuperLink binds (127.0.0.1 unless asked otherwise).
    port : int, optional
        Port of the SuperLink (free port when omitted).
    tls : TlsFiles, optional
        Serve the Fleet and Control APIs over TLS with these files.
    node_auth : bool
        Admit only site nodes whose public key was registered.
    netns : str, optional
        Run the server side inside this network namespace.
    """

    def __init__(self, workdir: str | Path, host: str = "127.0.0.1", port: int | None = None,
                 tls: TlsFiles | None = None, node_auth: bool = False,
                 netns: str | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.host = host
        self.port = port or free_port(host if host != "0.0.0.0" else "127.0.0.1")
        self.tls = tls
        self.node_auth = node_auth
        self.netns = netns
        self.processes: dict[str, subprocess.Popen | ForkedSite] = {}
        self.site_status: dict[str, SiteStatus] = {}
        self._runs = 0
        self._host: subprocess.Popen | None = None
        self.host_ready: HostReady | None = None
        self._host_answers: queue.Queue[Event | ForkedSite | None] = queue.Queue()
        self._forked: dict[int, ForkedSite] = {}
        self._early: dict[int, list[Event]] = {}
        self._lock = threading.Lock()
        self._site_keys: list[Path] = []
        self._progress_from: dict[int, int] = {}
        self.flwr_home = self.workdir / "flwr_home"
        self.flwr_home.mkdir(exist_ok=True)
        # Flower's processes start further Flower commands by name (the SuperLink runs
        # flower-superexec): they must find the ones installed with this Python.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = {**os.environ, "PATH": path, "FLWR_HOME": str(self.flwr_home),
                    "FLWR_TELEMETRY_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        (self.flwr_home / "config.toml").write_text(
            flower_cli.connection_config(self.address, self.tls))
        # Stops what we start should this process die without stopping it (SIGKILL).
        self.watchdog = Watchdog(self.workdir / "logs" / "watchdog.log", env=self.env)

    @property
    def address(self) -> str:
        """Return ``HOST:PORT`` of the SuperLink."""
        return f"{self.host}:{self.port}"

    # -- processes -----------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], extra_env: Mapping[str, str] | None = None,
               netns: str | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
        if netns is not None:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        env = {**self.env, **(extra_env or {})}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=self.workdir, start_new_session=True,
                                pass_fds=tuple(pass_fds))
        log.close()
        self.processes[name] = proc
        self.watchdog.watch(proc.pid)
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        """Return the last lines of a process's log."""
        path = self.workdir / "logs" / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def start_superlink(self, timeout: float = 60.0) -> None:
        """Start the SuperLink and wait until it accepts connections."""
        cmd = flower_cli.superlink_command(self.host, self.port, self.tls, self.node_auth)
        proc = self._spawn("superlink", cmd, netns=self.netns)
        probe = "127.0.0.1" if self.host == "0.0.0.0" else self.host
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FederationError("The SuperLink exited at start-up:\n"
                                      + self.log_tail("superlink"))
            if self._listening(probe):
                return
            time.sleep(0.2)
        raise FederationError(f"The SuperLink did not listen on {self.address} within "
                              f"{timeout:.0f} s.")

    def start_gate(self, host: str, port: int, *, max_body: int = 64 << 20,
                   max_body_file: Path | None = None, limits: GateLimits | None = None,
                   fd_limit: int | None = None, timeout: float = 60.0) -> str:
        """Open the public port: Flower's Fleet API only, forwarded to this SuperLink.

        The SuperLink must bind 127.0.0.1; ``host:port`` is what the sites dial. With node
        authentication, only the keys registered so far (:meth:`register_site_key`) pass
        the gate. ``limits`` bounds what a client may take of it; ``fd_limit`` lowers its
        descriptor limit. See :mod:`fedbn_med.federation.launcher.fleet_gate`. Returns
        ``HOST:PORT``.

        Raises
        ------
        FederationError
            When another process (an earlier server, say) holds ``host:port``, or the
            gate does not open it.
        """
        if self.host != "127.0.0.1":
            raise ValueError(f"The gate fronts a SuperLink on 127.0.0.1, not {self.host}.")
        if port_taken(host, port):
            raise FederationError(
                f"Port {host}:{port} is in use by another process (an earlier federation "
                "server that is still running?): stop it first, or choose another --listen.")
        ready = self.workdir / "logs" / "gate.ready"
        ready.unlink(missing_ok=True)
        # Run as a script: it needs none of fedbn_med (nor torch), only its own imports.
        cmd = [sys.executable, "-P", str(Path(__file__).with_name("fleet_gate.py")),
               "--listen", f"{host}:{port}", "--upstream", self.address,
               "--max-body", str(max_body), "--ready-file", str(ready)]
        if max_body_file is not None:
            cmd += ["--max-body-file", str(max_body_file)]
        if self.tls is not None:
            cmd += ["--ssl-certfile", str(self.tls.server_cert), "--ssl-keyfile",
                    str(self.tls.server_key), "--ssl-ca-certfile", str(self.tls.ca_cert)]
        if self.node_auth:
            for key in self._site_keys:
                cmd += ["--allowed-key", str(key)]
        for name, value in (limits or GateLimits()).__dict__.items():
            cmd += [f"--{name.replace('_', '-')}", str(value)]
        if fd_limit is not None:
            cmd += ["--fd-limit", str(fd_limit)]
        proc = self._spawn("gate", cmd)
        deadline = time.monotonic() + timeout
        # Ready when *this* gate has bound the port (it writes the file), not when
        # something answers there.
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FederationError("The server's public port did not open:\n"
                                      + self.log_tail("gate"))
            if ready.exists():
                return f"{host}:{port}"
            time.sleep(0.1)
        raise FederationError(f"The server's public port {host}:{port} did not open within "
                              f"{timeout:.0f} s.")

    def _listening(self, host: str) -> bool:
        if self.netns is None:
            try:
                with socket.create_connection((host, self.port), timeout=0.5):
                    return True
            except OSError:
                return False
        probe = (f"import socket; socket.create_connection(({host!r}, {self.port}), "
                 "timeout=0.5)")
        return subprocess.run(["ip", "netns", "exec", self.netns, sys.executable, "-c", probe],
                              capture_output=True, timeout=30, check=False).returncode == 0

    def register_site_key(self, public_key: Path) -> int:
        """Register a site's public key with the SuperLink; return the node ID it gets."""
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        try:
            node_id = flower_cli.register_key(public_key, env=self.env, cwd=self.workdir,
                                              prefix=prefix)
        except RuntimeError as err:
            raise FederationError(str(err)) from err
        self._site_keys.append(Path(public_key))
        return node_id

    def node_command(self, site: str, state_dir: Path, data_dir: Path | None = None,
                     device: str = "auto", auth_key: Path | None = None,
                     max_wait_time: float = 60.0, superlink: str | None = None) -> list[str]:
        """Return the command that runs one site's node against this SuperLink."""
        return [sys.executable, "-m", "fedbn_med.federation.node",
                *self._node_args(site, state_dir, data_dir, device, auth_key, max_wait_time,
                                 superlink)]

    def _node_args(self, site: str, state_dir: Path, data_dir: Path | None, device: str,
                   auth_key: Path | None, max_wait_time: float, superlink: str | None,
                   share_private: bool = False) -> list[str]:
        node = NodeSettings(site=site, state_dir=state_dir, data_dir=data_dir, device=device,
                            share_private=share_private)
        local = f"{'127.0.0.1' if self.host == '0.0.0.0' else self.host}:{self.port}"
        args = ["--superlink", superlink or local,
                "--node-settings", node.to_node_config()[RUN_CONFIG_KEY],
                "--max-wait-time", str(max_wait_time)]
        if self.tls is None:
            args.append("--insecure")
        else:
            args += ["--root-certificates", str(self.tls.ca_cert)]
        if auth_key is not None:
            args += ["--auth-key", str(auth_key)]
        return args

    # -- the site host -------------------------------------------------------------------
    def start_site_host(self, threads: int | None = None,
                        preload: Sequence[str] | None = None) -> None:
        """Start the site host, which loads the training stack once for every local site.

        Sites started afterwards (without ``netns``) are forked from it instead of
        importing torch, MONAI and Flower each on their own. ``preload`` names the tasks
        whose modules it imports too (default: every registered task). See
        :mod:`fedbn_med.federation.launcher.sitehost`.
        """
        if self._host is not None and self._host.poll() is None:
            return
        if preload is None:
            from fedbn_med.tasks import TASK_NAMES

            preload = TASK_NAMES
        env = {**self.env}
        if threads is not None:  # the libraries size their thread pools as they load
            env.update({k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                   "OPENBLAS_NUM_THREADS")})
        cmd = [sys.executable, "-m", "fedbn_med.federation.launcher.sitehost"]
        for task in preload:
            cmd += ["--preload", task]
        log = open(self.workdir / "logs" / "site-host.log", "ab")  # noqa: SIM115
        self._host = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
            cwd=self.workdir, text=True, bufsize=1, start_new_session=True)
        log.close()
        self.host_ready = None
        self._host_answers = queue.Queue()
        self.watchdog.watch(self._host.pid)
        assert self._host.stdout is not None
        answers = self._host_answers
        EventReader(self._host.stdout, self._on_host_event, "site-host",
                    on_close=lambda: answers.put(None))
        self.processes["site-host"] = self._host

    def _on_host_event(self, event: Event) -> None:
        # On the reader thread, in the order the pipe carries them. A site's exit always
        # comes after the answer that named it (the host blocks reaping until then).
        with self._lock:
            if isinstance(event, SiteForked):
                self.watchdog.watch(event.pid)
                proc = ForkedSite(event.pid)
                for early in self._early.pop(event.pid, []):
                    proc.status.note(early)
                self._forked[event.pid] = proc
                self._host_answers.put(proc)
            elif isinstance(event, (HostReady, HostRefused)):
                self._host_answers.put(event)
            elif isinstance(event, SiteExited):
                gone = self._forked.pop(event.pid, None)
                if gone is not None:
                    gone.exited(event.code)
            elif isinstance(event, _SITE_EVENTS):
                known = self._forked.get(event.pid)
                if known is not None:
                    known.status.note(event)
                else:  # written before the host's answer naming it was read
                    self._early.setdefault(event.pid, []).append(event)

    def _host_answer(self, timeout: float = 600.0) -> Event | ForkedSite:
        try:
            answer = self._host_answers.get(timeout=timeout)
        except queue.Empty:
            raise FederationError(f"The site host did not answer within {timeout:.0f} s:\n"
                                  + self.log_tail("site-host")) from None
        if answer is None:
            self._host_answers.put(None)  # every later ask sees the host gone too
            raise FederationError("The site host stopped:\n" + self.log_tail("site-host"))
        return answer

    def _fork_site(self, name: str, argv: list[str], env: Mapping[str, str] | None
                   ) -> ForkedSite:
        assert self._host is not None and self._host.stdin is not None
        if self.host_ready is None:
            ready = self._host_answer()
            if not isinstance(ready, HostReady):
                raise FederationError(f"The site host did not start: {ready}")
            self.host_ready = ready
        request = ForkRequest(argv=argv, log=str(self.workdir / "logs" / f"{name}.log"),
                              env=dict(env or {}))
        self._host.stdin.write(encode(request))
        self._host.stdin.flush()
        proc = self._host_answer()
        if not isinstance(proc, ForkedSite):
            raise FederationError(f"The site host could not start {name}: {proc}")
        self.processes[name] = proc
        self.site_status[name] = proc.status
        return proc

    # -- sites ---------------------------------------------------------------------------
    def start_site(self, site: str, *, data_dir: Path | None = None, device: str = "auto",
                   auth_key: Path | None = None, threads: int | None = None,
                   superlink: str | None = None, netns: str | None = None,
                   max_wait_time: float = 60.0, share_private: bool = False
                   ) -> subprocess.Popen | ForkedSite:
        """Start one site's node process (its own OS process).

        ``threads`` caps the site's CPU threads, so several sites on one host share its
        cores instead of fighting over them. ``superlink`` overrides the address the site
        dials (a relay or a proxy in front of the SuperLink). With a site host running
        (:meth:`start_site_host`) the process is forked from it, unless it must run in a
        network namespace. ``device`` is passed as given; spread ``auto`` over the local
        GPUs first with :func:`fedbn_med.federation.launcher.devices.site_devices`.
        ``share_private`` is the site's own policy (may its private layers leave it?).
        """
        state_dir = self.workdir / "sites"
        name = f"site-{site}"
        env = None
        if threads is not None:
            env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        args = self._node_args(site, state_dir, data_dir, device, auth_key, max_wait_time,
                               superlink, share_private)
        if netns is None and self._host is not None and self._host.poll() is None:
            return self._fork_site(name, args, env)
        read_end, write_end = os.pipe()
        try:
            proc = self._spawn(name, [sys.executable, "-m", "fedbn_med.federation.node", *args,
                                      "--events-fd", str(write_end)],
                               extra_env=env, netns=netns, pass_fds=(write_end,))
        finally:
            os.close(write_end)
        status = SiteStatus()
        self.site_status[name] = status
        EventReader(os.fdopen(read_end, encoding="utf-8"), status.note, name)
        return proc

    def wait_sites_ready(self, sites: list[str], timeout: float = 120.0) -> float:
        """Wait until every site's node has connected; return the seconds it took."""
        start = time.monotonic()
        pending = set(sites)
        while pending:
            for site in list(pending):
                name = f"site-{site}"
                status = self.site_status[name]
                if status.ready.is_set():
                    pending.discard(site)
                elif self.processes[name].poll() is not None or status.failure is not None:
                    reason = status.failure or self.log_tail(name)
                    raise FederationError(f"Site {site} exited at start-up:\n{reason}")
            if time.monotonic() - start > timeout:
                raise FederationError(f"Sites {sorted(pending)} did not connect within "
                                      f"{timeout:.0f} s.")
            if pending:
                time.sleep(0.1)
        return time.monotonic() - start

    # -- runs ----------------------------------------------------------------------------
    def submit(self, run_config: Mapping[str, object], results_dir: Path | None = None
               ) -> subprocess.Popen:
        """Submit a run (``flwr run --stream``) with the given run-config overrides."""
        results_dir = Path(results_dir or self.workdir)
        results_dir.mkdir(parents=True, exist_ok=True)
        # Flower sends the run config to every site: the server's settings stay here.
        run_config = seal_run_config(run_config, self.flwr_home)
        overrides = flower_cli.write_run_config(results_dir / "run_config.toml", run_config)
        self._runs += 1
        # This run's events are what its ServerApp appends from now on: an earlier run's
        # (a resumed federation's workdir) are never read as this one's.
        progress = results_dir / "progress.jsonl"
        offset = progress.stat().st_size if progress.exists() else 0
        submitted = time.time()
        proc = self._spawn(f"run-{self._runs}", flower_cli.run_command(overrides),
                           netns=self.netns)
        proc.log_name = f"run-{self._runs}"  # type: ignore[attr-defined]
        proc.progress_from = (offset, submitted)  # type: ignore[attr-defined]
        return proc

    def watch(self, run: subprocess.Popen, on_event: Callable[[dict], None] | None = None,
              timeout: float = 3600.0, results_dir: Path | None = None) -> dict:
        """Follow the run's progress events until it ends; return its results.

        ``on_event`` gets each event of the run's ``progress.jsonl`` as a dict (see
        :meth:`fedbn_med.federation.events.Event.as_dict`). The run succeeded when the
        server reported :class:`~fedbn_med.federation.events.Done`.
        """
        results_dir = Path(results_dir or self.workdir)
        offset, submitted = getattr(run, "progress_from", (0, 0.0))
        tail = _Tail(results_dir / "progress.jsonl", offset)
        deadline = time.monotonic() + timeout
        done: Done | None = None
        failed: RunFailed | None = None
        while True:
            ended = run.poll() is not None
            for line in tail.lines():
                if not line.strip():
                    continue
                event = decode(line, strict=False)
                done = event if isinstance(event, Done) else done
                failed = event if isinstance(event, RunFailed) else failed
                if on_event is not None:
                    on_event(event.as_dict())
            if ended:
                break
            if time.monotonic() > deadline:
                raise FederationError(f"The run did not finish within {timeout:.0f} s.")
            superlink = self.processes.get("superlink")
            if superlink is not None and superlink.poll() is not None:
                raise FederationError("The SuperLink stopped during the run:\n"
                                      + self.log_tail("superlink"))
            time.sleep(0.1)
        results = results_dir / "results.json"
        if done is None or not results.exists() or results.stat().st_mtime < submitted - 1:
            reason = failed.reason if failed is not None else \
                self.log_tail(getattr(run, "log_name", "run"), 40)
            raise FederationError("The federated run failed on the server:\n" + reason)
        return json.loads(results.read_text())

    # -- stopping ------------------------------------------------------------------------
    def stop_process(self, name: str, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
        """Stop one process and every process it started."""
        proc = self.processes.pop(name, None)
        if proc is None:
            return
        if proc.poll() is not None:  # gone already: its PID may belong to another process now
            return
        terminate_tree(proc.pid, sig, grace)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:  # pragma: no cover - killed above
            proc.kill()
        self.watchdog.forget(proc.pid)

    def stop(self) -> None:
        """Stop every process this federation started (sites first, then the server)."""
        for name in [n for n in self.processes
                     if n not in ("superlink", "site-host", "gate")]:
            self.stop_process(name)
        if self._host is not None and self._host.stdin is not None:
            try:
                self._host.stdin.close()  # the host forks no more sites and ends
            except OSError:
                pass
        self.stop_process("site-host")
        self.stop_process("gate")
        self.stop_process("superlink")
        self.watchdog.close()

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Tail:
    """Read a growing file's new complete lines from a byte offset, a read at a time."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._partial = b""

    def lines(self) -> list[str]:
        """Return the lines completed since the last call."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *whole, self._partial = (self._partial + data).split(b"\n")
        return [line.decode("utf-8", errors="replace") for line in whole]
