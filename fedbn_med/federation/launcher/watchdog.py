"""Stop a launcher's processes when the launcher dies, however it dies.

A launcher that gets SIGTERM or Ctrl-C stops its processes itself
(:meth:`fedbn_med.federation.launcher.LocalFederation.stop`). One killed with SIGKILL,
or crashing in C, cannot: its SuperLink, gate and ServerApp would go on serving the
public port with no one watching. So the launcher starts this watchdog first, in a
session of its own, and tells it each process it starts on a pipe::

    + PID CREATE_TIME      a process the launcher started (it leads a session)
    - PID                  one the launcher has stopped itself
    done                   the launcher stopped everything; exit quietly

When the pipe closes without ``done`` (the launcher is gone), the watchdog stops every
process it was told of that still runs with the same start time (a PID the system
gave to another process since is left alone), with its children and its session:
SIGTERM, then SIGKILL after a grace period.

It runs as a script (``python watchdog.py``), importing only the standard library and
psutil, so it starts in a few milliseconds.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import psutil

__all__ = ["family", "main", "terminate_tree"]

logger = logging.getLogger("fedbn_med.watchdog")


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def family(pid: int) -> list[psutil.Process]:
    """Return a process, its children and the rest of its session (when it leads one)."""
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    # Processes we start lead sessions of their own; anything left in that session (the
    # SuperLink's executor and ServerApp) belongs to them. Never sweep our own session.
    sid = _sid(pid)
    if sid == pid and sid != _sid(0):
        members += [p for p in psutil.process_iter() if p.pid != pid
                    and _sid(p.pid) == sid and p not in members]
    return [p for p in members if p.pid != os.getpid()]


def _ended(proc: psutil.Process) -> bool:
    """Return whether a process has exited (a zombie has: only its parent's wait is left)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_ended(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited or ``timeout`` passed; return those still running.

    Not :func:`psutil.wait_procs`: a process that is not our child counts for it as running
    until its parent has reaped it, and the ServerApp's parent (the SuperLink's executor)
    is stopped at the same time, so it waited up to 2 s for processes 0.2 s gone.
    """
    deadline = time.monotonic() + timeout
    running = [p for p in processes if not _ended(p)]
    while running and time.monotonic() < deadline:
        time.sleep(0.02)
        running = [p for p in running if not _ended(p)]
    return running


def _reap_ours(processes: list[psutil.Process]) -> None:
    """Reap those of ``processes`` that are this process's children (their exit status)."""
    ours = []
    for proc in processes:
        try:
            if proc.ppid() == os.getpid():
                ours.append(proc)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(ours, timeout=1.0)


def stop_all(processes: list[psutil.Process], sig: int, grace: float) -> None:
    """Send ``sig`` to every process; kill what outlives ``grace``."""
    for proc in processes:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            continue
    alive = _wait_ended(processes, grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    _wait_ended(alive, grace)
    _reap_ours(processes)


def terminate_tree(pid: int, sig: int, grace: float) -> None:
    """Send ``sig`` to a process, its children and its session; kill what outlives ``grace``."""
    stop_all(family(pid), sig, grace)


def _same(pid: int, created: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - created) < 0.05
    except psutil.NoSuchProcess:
        return False


def main() -> None:
    """Read the launcher's pipe on stdin; stop its processes if it closes unannounced."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for sig in (signal.SIGINT, signal.SIGHUP):  # the terminal's signals are the launcher's
        signal.signal(sig, signal.SIG_IGN)
    launcher = os.getppid()
    watched: dict[int, float] = {}
    for line in sys.stdin:
        words = line.split()
        if words == ["done"]:
            return
        if len(words) == 3 and words[0] == "+":
            watched[int(words[1])] = float(words[2])
        elif len(words) == 2 and words[0] == "-":
            watched.pop(int(words[1]), None)
    # The launcher is gone: last started, first stopped (sites before the server).
    pids = [pid for pid, created in reversed(watched.items()) if _same(pid, created)]
    if not pids:
        return
    logger.warning("Launcher %d ended without stopping its processes; stopping %s",
                   launcher, pids)
    members: list[psutil.Process] = []
    for pid in pids:
        members += [p for p in family(pid) if p not in members]
    stop_all(members, signal.SIGTERM, 5.0)


if __name__ == "__main__":
    main()
