"""Work that must happen, in order, but that nobody should wait for."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["SerialWorker"]


class SerialWorker:
    """Run calls one after another on a thread of their own, in the order given.

    The server (:mod:`fedbn_med.federation.server.recorder`) and an in-process run
    (:mod:`fedbn_med.api.engines`) hand their MLflow logging to one of these, so
    a round never waits for the store. :meth:`flush` waits for everything handed over
    and raises the first error a call met (so a store that fails still fails the run,
    only later).
    """

    def __init__(self, name: str = "fedbn-tracking") -> None:
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                fn, args = item
                if self._error is None:
                    fn(*args)
            except BaseException as err:  # noqa: BLE001 - re-raised by flush()
                self._error = err
            finally:
                self._queue.task_done()

    def submit(self, fn: Callable[..., object], *args: object) -> None:
        """Queue ``fn(*args)``; raise now if an earlier call failed."""
        self._raise()
        self._queue.put((fn, args))

    def flush(self) -> None:
        """Wait until every queued call has run; raise the first error met."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"A background task failed: {err}") from err
