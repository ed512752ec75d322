"""A small process supervisor: spawn named processes, wait until they serve, tail logs, stop.

Every process it spawns leads a session of its own and is told to the
:class:`~fedbn_med.federation.launcher.processes.Watchdog`, so stopping it stops what it
started too (the SuperLink's executor and ServerApp), and the watchdog stops it should
the launcher die without doing so. Each writes to ``<workdir>/logs/<name>.log``.

A command may run under a prefix (``["ip", "netns", "exec", "NS"]``, say): the prefix
goes in front of the command, and a port is probed from under the same prefix.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from fedbn_med.federation.launcher.processes import FederationError, Watchdog, terminate_tree

__all__ = ["Child", "Supervisor"]


class Child(Protocol):
    """What the supervisor needs of a process: ``Popen`` and forked sites both have it."""

    pid: int

    def poll(self) -> int | None:
        """Return the exit code once the process has ended, else None."""

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end."""

    def kill(self) -> None:
        """Send SIGKILL."""


class Supervisor:
    """Named child processes of this one, each in a session of its own.

    Parameters
    ----------
    workdir : path
        The processes' working folder; logs go to its ``logs`` folder.
    env : mapping
        Environment of every process (each call may add to it).
    """

    def __init__(self, workdir: Path, env: Mapping[str, str]) -> None:
        self.workdir = Path(workdir)
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(env)
        self.processes: dict[str, Child] = {}
        # Stops what we start should this process die without stopping it (SIGKILL).
        self.watchdog = Watchdog(self.logs / "watchdog.log", env=self.env)

    def log_path(self, name: str) -> Path:
        """Return the log file of process ``name``."""
        return self.logs / f"{name}.log"

    def spawn(self, name: str, cmd: Sequence[str], *, prefix: Sequence[str] = (),
              extra_env: Mapping[str, str] | None = None, pass_fds: Sequence[int] = (),
              pipe: bool = False) -> subprocess.Popen:
        """Start ``prefix + cmd`` as process ``name``, its output going to its log.

        With ``pipe``, its stdin and stdout are text pipes to this process and only its
        stderr goes to the log.
        """
        env = {**self.env, **(extra_env or {})}
        with open(self.log_path(name), "ab") as log:
            proc = subprocess.Popen(
                [*prefix, *cmd], env=env, cwd=self.workdir, start_new_session=True,
                pass_fds=tuple(pass_fds), stderr=log if pipe else subprocess.STDOUT,
                stdin=subprocess.PIPE if pipe else None,
                stdout=subprocess.PIPE if pipe else log,
                text=pipe, bufsize=1 if pipe else -1)
        self.adopt(name, proc)
        return proc

    def adopt(self, name: str, proc: Child) -> None:
        """Own ``proc`` (started elsewhere, a forked site) under ``name``."""
        self.processes[name] = proc
        self.watchdog.watch(proc.pid)

    def running(self, name: str) -> bool:
        """Return whether process ``name`` was started and has not ended."""
        proc = self.processes.get(name)
        return proc is not None and proc.poll() is None

    def log_tail(self, name: str, lines: int = 15) -> str:
        """Return the last lines of a process's log."""
        path = self.log_path(name)
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def wait_until(self, name: str, ready: Callable[[], bool], timeout: float, *,
                   exited: str, late: str, every: float = 0.1) -> None:
        """Wait until ``ready()``; raise if process ``name`` ends or ``timeout`` passes.

        Raises
        ------
        FederationError
            ``exited`` and the end of the process's log when it ended; ``late`` when
            ``timeout`` passed first.
        """
        proc = self.processes[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FederationError(f"{exited}:\n{self.log_tail(name)}")
            if ready():
                return
            time.sleep(every)
        raise FederationError(late)

    def wait_for_port(self, name: str, host: str, port: int, timeout: float, *,
                      prefix: Sequence[str] = (), what: str | None = None) -> None:
        """Wait until ``host:port`` accepts connections, probed from under ``prefix``.

        ``what`` names the process in errors (default: its name).
        """
        what = what or name
        self.wait_until(name, lambda: listening(host, port, prefix), timeout, every=0.2,
                        exited=f"{what} exited at start-up",
                        late=f"{what} did not listen on {host}:{port} within {timeout:.0f} s.")

    def stop(self, name: str, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
        """Stop process ``name`` and every process it started."""
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

    def stop_all(self, last: Sequence[str] = ()) -> None:
        """Stop every process, those named in ``last`` last and in that order."""
        for name in [n for n in self.processes if n not in last]:
            self.stop(name)
        for name in last:
            self.stop(name)

    def close(self) -> None:
        """Stop every process, then tell the watchdog all is stopped."""
        self.stop_all()
        self.watchdog.close()


def listening(host: str, port: int, prefix: Sequence[str] = ()) -> bool:
    """Return whether ``host:port`` accepts a TCP connection, seen from under ``prefix``."""
    if not prefix:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=0.5)"
    return subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True,
                          timeout=30, check=False).returncode == 0
