"""The launcher's side of the site host (:mod:`fedbn_med.federation.launcher.sitehost`).

:class:`SiteHostClient` starts the host under a :class:`~.supervisor.Supervisor`, asks it
to fork site processes, and reads the one pipe on which the host answers and every
forked site reports (readiness, failures, exits), in the order the pipe carries them.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedbn_med.federation.events import (
    Event,
    ForkRequest,
    HostReady,
    HostRefused,
    NodeFailed,
    NodeLost,
    NodeReady,
    SiteExited,
    SiteForked,
    encode,
)
from fedbn_med.federation.launcher.processes import EventReader, FederationError, ForkedSite
from fedbn_med.federation.launcher.supervisor import Supervisor

__all__ = ["SiteHostClient"]

NAME = "site-host"  # the host's process and log name
_SITE_EVENTS = (NodeReady, NodeLost, NodeFailed)


class SiteHostClient:
    """A running site host, and the sites it forked.

    Parameters
    ----------
    supervisor : Supervisor
        Starts and stops the host; every forked site is handed to it as well.
    threads : int, optional
        Caps the host's thread pools (the libraries size them as they load).
    preload : sequence of str
        Tasks whose modules the host imports before it forks.
    """

    def __init__(self, supervisor: Supervisor, threads: int | None,
                 preload: Sequence[str]) -> None:
        self.supervisor = supervisor
        self.ready: HostReady | None = None
        self._answers: queue.Queue[Event | ForkedSite | None] = queue.Queue()
        self._forked: dict[int, ForkedSite] = {}
        self._early: dict[int, list[Event]] = {}
        self._lock = threading.Lock()
        env = {}
        if threads is not None:
            env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                             "OPENBLAS_NUM_THREADS")}
        cmd = [sys.executable, "-m", "fedbn_med.federation.launcher.sitehost"]
        for task in preload:
            cmd += ["--preload", task]
        self.proc = supervisor.spawn(NAME, cmd, extra_env=env, pipe=True)
        if self.proc.stdout is None or self.proc.stdin is None:  # pragma: no cover
            raise FederationError("The site host was started without its pipes.")
        answers = self._answers
        EventReader(self.proc.stdout, self._on_event, NAME,
                    on_close=lambda: answers.put(None))

    def running(self) -> bool:
        """Return whether the host still runs."""
        return self.proc.poll() is None

    def _on_event(self, event: Event) -> None:
        # On the reader thread, in the order the pipe carries them. A site's exit always
        # comes after the answer that named it (the host blocks reaping until then).
        with self._lock:
            if isinstance(event, SiteForked):
                self.supervisor.watchdog.watch(event.pid)
                proc = ForkedSite(event.pid)
                for early in self._early.pop(event.pid, []):
                    proc.status.note(early)
                self._forked[event.pid] = proc
                self._answers.put(proc)
            elif isinstance(event, (HostReady, HostRefused)):
                self._answers.put(event)
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

    def _answer(self, timeout: float = 600.0) -> Event | ForkedSite:
        try:
            answer = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise FederationError(f"The site host did not answer within {timeout:.0f} s:\n"
                                  + self.supervisor.log_tail(NAME)) from None
        if answer is None:
            self._answers.put(None)  # every later ask sees the host gone too
            raise FederationError("The site host stopped:\n" + self.supervisor.log_tail(NAME))
        return answer

    def fork(self, name: str, argv: list[str], env: Mapping[str, str] | None) -> ForkedSite:
        """Have the host fork site process ``name`` running the node with ``argv``.

        Waits for the host to be ready first (it loads the training stack once). The
        site is handed to the supervisor under ``name``; its log is ``name``'s.
        """
        stdin = self.proc.stdin
        if stdin is None:  # pragma: no cover - spawned with pipes
            raise FederationError("The site host has no request pipe.")
        if self.ready is None:
            ready = self._answer()
            if not isinstance(ready, HostReady):
                raise FederationError(f"The site host did not start: {ready}")
            self.ready = ready
        log = Path(self.supervisor.log_path(name))
        stdin.write(encode(ForkRequest(argv=argv, log=str(log), env=dict(env or {}))))
        stdin.flush()
        proc = self._answer()
        if not isinstance(proc, ForkedSite):
            raise FederationError(f"The site host could not start {name}: {proc}")
        self.supervisor.processes[name] = proc  # the watchdog was told as it was forked
        return proc

    def close(self) -> None:
        """Ask the host to fork no more sites and end (the supervisor stops it after)."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
