"""Follow a submitted run: its ``progress.jsonl``, read as it grows, until the run ends.

The ServerApp appends one event per line to the run's ``progress.jsonl``
(:func:`fedbn_med.federation.events.append_event`). :class:`ProgressTail` keeps the file
open and reads only the bytes appended since its last read; a line is handed on once it
is complete. When the run's process ends, what it wrote last is read before
:func:`follow` returns, so no round it completed is missed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from fedbn_med.federation.events import Done, Event, RunFailed, decode
from fedbn_med.federation.launcher.processes import FederationError

__all__ = ["ProgressTail", "SubmittedRun", "follow"]


class ProgressTail:
    """The complete lines appended to a file since a byte offset, a read at a time.

    The file may not exist yet (the run has not started writing). Should it be replaced
    (a new file under the same name), the new one is read from its start.
    """

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = Path(path)
        self.offset = offset
        self._handle: IO[bytes] | None = None
        self._partial = b""

    def _open(self) -> IO[bytes] | None:
        try:
            seen = os.stat(self.path)
        except FileNotFoundError:
            return self._handle
        handle = self._handle
        if handle is not None and os.fstat(handle.fileno()).st_ino != seen.st_ino:
            handle.close()  # replaced: the new file from its start
            handle, self.offset, self._partial = None, 0, b""
        if handle is None:
            handle = open(self.path, "rb")  # noqa: SIM115 - kept open across reads
            handle.seek(self.offset)
            self._handle = handle
        return handle

    def lines(self) -> list[str]:
        """Return the lines completed since the last call."""
        handle = self._open()
        if handle is None:
            return []
        data = handle.read()
        if not data:
            return []
        self.offset += len(data)
        *whole, self._partial = (self._partial + data).split(b"\n")
        return [line.decode("utf-8", errors="replace") for line in whole]

    def close(self) -> None:
        """Close the file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


@dataclass(frozen=True)
class SubmittedRun:
    """A run handed to Flower: its ``flwr run`` process and where its events go.

    Attributes
    ----------
    proc : Popen
        The ``flwr run --stream`` process; it ends with the run.
    name : str
        Its process (and log) name.
    results_dir : Path
        Holds the run's ``progress.jsonl`` and ``results.json``.
    progress_from : int
        Size of ``progress.jsonl`` at submission: an earlier run's events (a resumed
        federation's workdir) lie before it and are never read as this run's.
    submitted : float
        Wall time of submission: a ``results.json`` older than that is an earlier run's.
    """

    proc: subprocess.Popen
    name: str
    results_dir: Path
    progress_from: int
    submitted: float

    @property
    def pid(self) -> int:
        """Return the PID of the ``flwr run`` process."""
        return self.proc.pid

    def poll(self) -> int | None:
        """Return the exit code of the ``flwr run`` process once it has ended, else None."""
        return self.proc.poll()


def follow(run: SubmittedRun, *, on_event: Callable[[Event], None] | None = None,
           timeout: float = 3600.0, server_gone: Callable[[], str | None] = lambda: None,
           log_tail: Callable[[str, int], str] = lambda name, lines: "",
           every: float = 0.1, until_done: bool = False) -> dict:
    """Hand each progress event of ``run`` to ``on_event`` until it ends; return its results.

    ``on_event`` gets the typed :class:`~fedbn_med.federation.events.Event`; a line of an
    unknown kind, or whose fields do not fit its class, comes as
    :class:`~fedbn_med.federation.events.Unknown`.

    ``server_gone`` returns why the server can no longer finish the run (None while it
    can); ``log_tail`` gives the end of a process's log for an error message.

    The run has ended when its ``flwr run`` process has. With ``until_done``, it has ended
    as soon as the server reported :class:`~fedbn_med.federation.events.Done`, after its
    results, its checkpoint and its MLflow runs were written and every site had answered
    its last message: ``flwr run`` notices 1 to 2 s later (the ServerApp's exit, then
    Flower's log stream, polled every 0.5 s). For a caller that stops the federation next,
    or submits its next run (the SuperLink starts it while Flower winds this one down).

    Raises
    ------
    FederationError
        When the run fails, the server goes, or ``timeout`` passes first.
    """
    tail = ProgressTail(run.results_dir / "progress.jsonl", run.progress_from)
    deadline = time.monotonic() + timeout
    done: Done | None = None
    failed: RunFailed | None = None
    try:
        while True:
            ended = run.poll() is not None
            for line in tail.lines():
                if not line.strip():
                    continue
                event = decode(line, strict=False)
                done = event if isinstance(event, Done) else done
                failed = event if isinstance(event, RunFailed) else failed
                if on_event is not None:
                    on_event(event)
            if ended or (until_done and done is not None):
                break
            if time.monotonic() > deadline:
                raise FederationError(f"The run did not finish within {timeout:.0f} s.")
            reason = server_gone()
            if reason is not None:
                raise FederationError(reason)
            time.sleep(every)
    finally:
        tail.close()
    results = run.results_dir / "results.json"
    if done is None or not results.exists() or results.stat().st_mtime < run.submitted - 1:
        reason = failed.reason if failed is not None else log_tail(run.name, 40)
        raise FederationError("The federated run failed on the server:\n" + reason)
    return dict(json.loads(results.read_text()))
