"""Processes a federation owns: how they are started, watched, and stopped with their children.

Every process the launcher starts leads a session of its own, so stopping it stops what
it started too (the SuperLink's executor and ServerApp, say), and is told to a
:class:`Watchdog`, which stops it should the launcher die without doing so. What a process does is
learnt from the typed events it writes on a pipe (:mod:`fedbn_med.federation.events`),
read here on a thread per pipe; never from its log text.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psutil

from fedbn_med.federation.events import Event, NodeFailed, NodeLost, NodeReady, decode
from fedbn_med.federation.launcher.watchdog import terminate_tree

__all__ = ["EventReader", "FederationError", "ForkedSite", "SiteStatus", "Watchdog",
           "free_port", "port_taken", "terminate_tree"]

logger = logging.getLogger(__name__)


class FederationError(RuntimeError):
    """Raised when a federated run fails; the message says where and why."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_taken(host: str, port: int) -> bool:
    """Return whether another socket is bound to ``host:port`` (a server listening there).

    Binds as a server would (``SO_REUSEADDR``), so connections of an earlier server that
    linger in TIME_WAIT do not count; a listening socket does.
    """
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError:
            return True
    return False


class Watchdog:
    """The launcher's side of :mod:`fedbn_med.federation.launcher.watchdog`.

    Started with the first process it is told of; every process the launcher starts is
    then stopped by it if the launcher dies without stopping them (SIGKILL, a crash).
    """

    def __init__(self, log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.env = env
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None:
                with open(self.log, "ab") as out:
                    self._proc = subprocess.Popen(
                        [sys.executable, "-P", str(Path(__file__).with_name("watchdog.py"))],
                        stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True, text=True, env=self.env)
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()
            except (OSError, ValueError):
                logger.warning("The watchdog is gone; %r not passed on", line)

    def watch(self, pid: int) -> None:
        """Have the watchdog stop ``pid`` (with its children) should the launcher die."""
        try:
            created = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            return
        self._send(f"+ {pid} {created!r}")

    def forget(self, pid: int) -> None:
        """Tell the watchdog the launcher has stopped ``pid`` itself."""
        if self._proc is not None:
            self._send(f"- {pid}")

    def close(self) -> None:
        """Tell the watchdog everything is stopped; wait for it to end."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write("done\n")
            proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class SiteStatus:
    """What one site process has reported about itself (set by the event reader)."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.node_id: int | None = None
        self.failure: str | None = None
        self.lost: str | None = None

    def note(self, event: Event) -> None:
        """Take in one of the site's own events."""
        if isinstance(event, NodeReady):
            self.node_id = event.node_id
            self.lost = None
            self.ready.set()
        elif isinstance(event, NodeLost):
            self.lost = event.reason
        elif isinstance(event, NodeFailed):
            self.failure = event.reason


class ForkedSite:
    """A site process forked by the site host, with the parts of ``Popen`` we use.

    The host reports the process's exit code as a :class:`~fedbn_med.federation.events.
    SiteExited` event; the launcher's reader hands it over with :meth:`exited`.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status = SiteStatus()
        self._reported: int | None = None
        self._ended = threading.Event()
        self.returncode: int | None = None

    def exited(self, code: int) -> None:
        """Record the exit code the site host reported."""
        self._reported = code
        self._ended.set()

    def poll(self) -> int | None:
        """Return the exit code once the process has ended, else None."""
        if self.returncode is not None:
            return self.returncode
        if not self._ended.is_set():
            try:
                if psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE:
                    return None
            except psutil.NoSuchProcess:
                pass
            # It has ended: the host reports the code as it reaps. A host that is gone
            # reports nothing; the process then counts as killed.
            self._ended.wait(timeout=1.0)
        self.returncode = self._reported if self._reported is not None else -signal.SIGKILL
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


class EventReader:
    """Read typed events from a pipe on a daemon thread and hand each to ``handle``.

    A line that is not an event (a library printing to the pipe) is logged and skipped.
    The thread ends, calling ``on_close``, when every writer has closed the pipe.
    """

    def __init__(self, stream: IO[str], handle: Callable[[Event], None], name: str,
                 on_close: Callable[[], None] | None = None) -> None:
        self.stream = stream
        self.handle = handle
        self.name = name
        self.on_close = on_close
        self.thread = threading.Thread(target=self._run, name=f"events-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for line in self.stream:
                if not line.strip():
                    continue
                try:
                    event = decode(line)
                except ValueError as err:
                    logger.warning("%s wrote a line that is not an event (%s): %s", self.name,
                                   err, line.strip()[:200])
                    continue
                self.handle(event)
        except (OSError, ValueError):  # closed under us while stopping
            pass
        finally:
            if self.on_close is not None:
                self.on_close()
