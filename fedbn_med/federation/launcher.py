"""Start, watch and stop the processes of a federation.

:class:`LocalFederation` owns every process it starts (SuperLink, site nodes, the
``flwr run`` client) and stops them all on exit, on error and on Ctrl-C, children
included. Servers bind 127.0.0.1 unless a caller passes another host explicitly.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["APP_DIR", "FederationError", "LocalFederation", "TlsFiles", "free_port"]

logger = logging.getLogger(__name__)

APP_DIR = Path(__file__).resolve().parent / "flower_app"
_BIN = Path(sys.executable).parent


class FederationError(RuntimeError):
    """Raised when a federated run fails; the message says where and why."""


@dataclass(frozen=True)
class TlsFiles:
    """The consortium's TLS files as the server uses them."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ForkedSite:
    """A site process forked by the site host, with the parts of ``Popen`` we use."""

    def __init__(self, pid: int, exit_file: Path) -> None:
        self.pid = pid
        self.exit_file = exit_file
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Return the exit code once the process has ended, else None."""
        if self.returncode is not None:
            return self.returncode
        try:
            if psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE:
                return None
        except psutil.NoSuchProcess:
            pass
        deadline = time.monotonic() + 1.0  # the host writes the code as it reaps
        while not self.exit_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            self.returncode = int(self.exit_file.read_text().strip())
        except (OSError, ValueError):
            self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end; raise ``subprocess.TimeoutExpired`` after timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"site process {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        return code

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` unless the process has ended."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        """Send SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send SIGKILL."""
        self.send_signal(signal.SIGKILL)


# The SuperLink is Flower's own ``flower-superlink`` entry point, started with the
# collector tuned the way long-running Python servers often are: its start-up objects
# frozen out of collection and fewer young-generation passes. Every message of a round
# goes through this one process, so its per-request cost sets the pace of a round; the
# tuning took about a tenth off its CPU time per round here (benchmarks/
# federation_overhead.py). Flower's code is untouched.
_SUPERLINK_GC = ("import gc, sys; gc.set_threshold(50000, 50, 100); "
                 "from flwr.superlink.cli import flower_superlink; gc.collect(); gc.freeze(); "
                 "sys.argv[0] = 'flower-superlink'; sys.exit(flower_superlink())")


def _tool(name: str) -> str:
    candidate = _BIN / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"Flower's '{name}' command was not found (is flwr installed?).")
    return found


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


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
        self.netns = netns  # run the server side inside this network namespace
        self.processes: dict[str, subprocess.Popen | ForkedSite] = {}
        self._runs = 0
        self._host: subprocess.Popen | None = None
        self._host_ready = False
        self.flwr_home = self.workdir / "flwr_home"
        self.flwr_home.mkdir(exist_ok=True)
        self.env = {**os.environ, "FLWR_HOME": str(self.flwr_home),
                    "FLWR_TELEMETRY_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        self._write_connection()

    @property
    def address(self) -> str:
        """Return ``HOST:PORT`` of the SuperLink."""
        return f"{self.host}:{self.port}"

    def _write_connection(self) -> None:
        lines = ["[superlink]", 'default = "fedbn"', "", "[superlink.fedbn]",
                 f'address = "{self.address}"']
        if self.tls is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{self.tls.ca_cert}"')
        (self.flwr_home / "config.toml").write_text("\n".join(lines) + "\n")

    # -- processes -----------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], extra_env: Mapping[str, str] | None = None,
               netns: str | None = None) -> subprocess.Popen:
        if netns is not None:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        env = {**self.env, **(extra_env or {})}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=self.workdir, start_new_session=True)
        log.close()
        self.processes[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        """Return the last lines of a process's log."""
        path = self.workdir / "logs" / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def start_superlink(self, timeout: float = 60.0) -> None:
        """Start the SuperLink and wait until it accepts connections."""
        cmd = [sys.executable, "-c", _SUPERLINK_GC, "--host", self.host, "--port", str(self.port),
               "--disable-runtime-dependency-installation"]
        if self.tls is None:
            cmd.append("--insecure")
        else:
            cmd += ["--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile",
                    str(self.tls.server_cert), "--ssl-keyfile", str(self.tls.server_key)]
        if self.node_auth:
            cmd.append("--enable-supernode-auth")
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

    def register_site_key(self, public_key: Path) -> None:
        """Register a site's public key with the SuperLink (node authentication)."""
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        out = subprocess.run([*prefix, _tool("flwr"), "supernode", "register", str(public_key),
                              "fedbn"],
                             env=self.env, cwd=self.workdir, capture_output=True, text=True,
                             timeout=120, check=False)
        if out.returncode != 0 or "rror" in out.stdout + out.stderr:
            raise FederationError(f"Could not register {public_key}: "
                                  f"{(out.stdout + out.stderr).strip()[-800:]}")

    def node_command(self, site: str, state_dir: Path, data_dir: Path | None = None,
                     device: str = "auto", auth_key: Path | None = None,
                     max_wait_time: float = 60.0, superlink: str | None = None) -> list[str]:
        """Return the command that runs one site's node against this SuperLink."""
        return [sys.executable, "-m", "fedbn_med.federation.node",
                *self._node_args(site, state_dir, data_dir, device, auth_key, max_wait_time,
                                 superlink)]

    def _node_args(self, site: str, state_dir: Path, data_dir: Path | None, device: str,
                   auth_key: Path | None, max_wait_time: float, superlink: str | None
                   ) -> list[str]:
        cfg = f"site='{site}' state-dir='{state_dir}' device='{device}'"
        if data_dir is not None:
            cfg += f" data-dir='{data_dir}'"
        local = f"{'127.0.0.1' if self.host == '0.0.0.0' else self.host}:{self.port}"
        args = ["--superlink", superlink or local, "--node-config", cfg,
                "--max-wait-time", str(max_wait_time)]
        if self.tls is None:
            args.append("--insecure")
        else:
            args += ["--root-certificates", str(self.tls.ca_cert)]
        if auth_key is not None:
            args += ["--auth-key", str(auth_key)]
        return args

    def start_site_host(self, threads: int | None = None) -> None:
        """Start the site host, which loads the training stack once for every local site.

        Sites started afterwards (without ``netns``) are forked from it instead of
        importing torch, MONAI and Flower each on their own. See
        :mod:`fedbn_med.federation.sitehost`.
        """
        if self._host is not None and self._host.poll() is None:
            return
        env = {**self.env}
        if threads is not None:  # the libraries size their thread pools as they load
            env.update({k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                   "OPENBLAS_NUM_THREADS")})
        log = open(self.workdir / "logs" / "site-host.log", "ab")  # noqa: SIM115
        self._host = subprocess.Popen(
            [sys.executable, "-m", "fedbn_med.federation.sitehost"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log, env=env, cwd=self.workdir, text=True,
            bufsize=1, start_new_session=True)
        log.close()
        self._host_ready = False
        self.processes["site-host"] = self._host

    def _host_reply(self) -> dict:
        assert self._host is not None and self._host.stdout is not None
        line = self._host.stdout.readline()
        if not line:
            raise FederationError("The site host stopped:\n" + self.log_tail("site-host"))
        return json.loads(line)

    def _fork_site(self, name: str, argv: list[str], env: Mapping[str, str] | None
                   ) -> ForkedSite:
        assert self._host is not None and self._host.stdin is not None
        if not self._host_ready:
            reply = self._host_reply()
            if not reply.get("ready"):
                raise FederationError(f"The site host did not start: {reply}")
            self._host_ready = True
        logs = self.workdir / "logs"
        exit_file = logs / f"{name}.exit"
        exit_file.unlink(missing_ok=True)
        request = {"argv": argv, "log": str(logs / f"{name}.log"), "exit": str(exit_file),
                   "env": dict(env or {})}
        self._host.stdin.write(json.dumps(request) + "\n")
        self._host.stdin.flush()
        reply = self._host_reply()
        if "pid" not in reply:
            raise FederationError(f"The site host could not start {name}: {reply}")
        proc = ForkedSite(int(reply["pid"]), exit_file)
        self.processes[name] = proc
        return proc

    def start_site(self, site: str, *, data_dir: Path | None = None, device: str = "auto",
                   auth_key: Path | None = None, threads: int | None = None,
                   superlink: str | None = None, netns: str | None = None,
                   max_wait_time: float = 60.0) -> subprocess.Popen | ForkedSite:
        """Start one site's node process (its own OS process).

        ``threads`` caps the site's CPU threads, so several sites on one host share its
        cores instead of fighting over them. ``superlink`` overrides the address the site
        dials (a relay or a proxy in front of the SuperLink). With a site host running
        (:meth:`start_site_host`) the process is forked from it, unless it must run in a
        network namespace.
        """
        state_dir = self.workdir / "sites"
        env = None
        if threads is not None:
            env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        if netns is None and self._host is not None and self._host.poll() is None:
            args = self._node_args(site, state_dir, data_dir, device, auth_key, max_wait_time,
                                   superlink)
            return self._fork_site(f"site-{site}", args, env)
        cmd = self.node_command(site, state_dir, data_dir, device, auth_key,
                                max_wait_time=max_wait_time, superlink=superlink)
        return self._spawn(f"site-{site}", cmd, extra_env=env, netns=netns)

    def wait_sites_ready(self, sites: list[str], timeout: float = 120.0) -> float:
        """Wait until every site's node has connected; return the seconds it took."""
        start = time.monotonic()
        pending = set(sites)
        while pending:
            for site in list(pending):
                proc = self.processes[f"site-{site}"]
                if "fedbn-med node ready" in self.log_tail(f"site-{site}", 400):
                    pending.discard(site)
                elif proc.poll() is not None:
                    raise FederationError(f"Site {site} exited at start-up:\n"
                                          + self.log_tail(f"site-{site}"))
            if time.monotonic() - start > timeout:
                raise FederationError(f"Sites {sorted(pending)} did not connect within "
                                      f"{timeout:.0f} s.")
            time.sleep(0.1)
        return time.monotonic() - start

    def submit(self, run_config: Mapping[str, object], results_dir: Path | None = None
               ) -> subprocess.Popen:
        """Submit a run (``flwr run --stream``) with the given run-config overrides."""
        results_dir = Path(results_dir or self.workdir)
        results_dir.mkdir(parents=True, exist_ok=True)
        overrides = results_dir / "run_config.toml"
        overrides.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in run_config.items()))
        cmd = [_tool("flwr"), "run", str(APP_DIR), "fedbn", "--stream",
               "--run-config", str(overrides)]
        self._runs += 1
        proc = self._spawn(f"run-{self._runs}", cmd, netns=self.netns)
        proc.log_name = f"run-{self._runs}"  # type: ignore[attr-defined]
        return proc

    def watch(self, run: subprocess.Popen, on_event: Callable[[dict], None] | None = None,
              timeout: float = 3600.0, results_dir: Path | None = None) -> dict:
        """Follow the run's progress events until it ends; return its results."""
        results_dir = Path(results_dir or self.workdir)
        progress = results_dir / "progress.jsonl"
        seen = 0
        deadline = time.monotonic() + timeout
        while True:
            done = run.poll() is not None
            if progress.exists():
                lines = progress.read_text().splitlines()
                for line in lines[seen:]:
                    if on_event is not None and line.strip():
                        on_event(json.loads(line))
                seen = len(lines)
            if done:
                break
            if time.monotonic() > deadline:
                raise FederationError(f"The run did not finish within {timeout:.0f} s.")
            for name, proc in self.processes.items():
                if name == "superlink" and proc.poll() is not None:
                    raise FederationError("The SuperLink stopped during the run:\n"
                                          + self.log_tail("superlink"))
            time.sleep(0.1)
        results = results_dir / "results.json"
        log = self.log_tail(getattr(run, "log_name", "run"), 400)
        if "Exit Code:" in log or not results.exists():
            reason = [ln for ln in log.splitlines() if "Error" in ln or "error" in ln][-8:]
            raise FederationError("The federated run failed on the server:\n"
                                  + "\n".join(reason or log.splitlines()[-15:]))
        return json.loads(results.read_text())

    def stop_process(self, name: str, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
        """Stop one process and every process it started."""
        proc = self.processes.pop(name, None)
        if proc is None:
            return
        if proc.poll() is not None:  # gone already: its PID may belong to another process now
            return
        _terminate_tree(proc.pid, sig, grace)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:  # pragma: no cover - killed above
            proc.kill()

    def stop(self) -> None:
        """Stop every process this federation started (sites first, then the server)."""
        for name in [n for n in self.processes if n not in ("superlink", "site-host")]:
            self.stop_process(name)
        if self._host is not None and self._host.stdin is not None:
            try:
                self._host.stdin.close()  # the host forks no more sites and ends
            except OSError:
                pass
        self.stop_process("site-host")
        self.stop_process("superlink")

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate_tree(pid: int, sig: int, grace: float) -> None:
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    # Processes we start lead sessions of their own; anything left in that session (the
    # SuperLink's executor and ServerApp) belongs to them. Never sweep our own session.
    try:
        sid = os.getsid(pid)
        if sid == pid and sid != os.getsid(0):
            family += [p for p in psutil.process_iter() if p.pid != pid
                       and _sid(p.pid) == sid and p not in family]
    except OSError:
        pass
    family = [p for p in family if p.pid != os.getpid()]
    for proc in family:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(family, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=grace)


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
