"""A site host: load the training stack once, then fork one process per site.

A site process spends seconds of CPU importing torch and Flower (an ABIDE site about
2.5 s; an imaging task's MONAI adds about 3 s more) before it can load a single subject.
A hospital runs one site and pays that once; a workstation that runs four sites (the
main job, the tests, the benchmarks) would pay it four times on the same cores. The host
imports everything once and forks: each site is still its own OS process, in its own
session, with its own data, model, device, private state and log; the forked processes
share only the code already loaded, copy-on-write.

The launcher and the host speak typed events (:mod:`fedbn_med.federation.events`), one
JSON line each, over the host's stdin and stdout::

    -> ForkRequest(argv=[...node arguments...], log="/path/site-NYU.log",
                   env={"OMP_NUM_THREADS": "1"})
    <- HostReady(pid, cuda_initialized)      once, when the stack is loaded
    <- SiteForked(pid, cuda_initialized)     the answer to each request
    <- HostRefused(reason)                   a request it cannot serve
    <- SiteExited(pid, code)                 when a site process ends

Each site writes its own events (:class:`~fedbn_med.federation.events.NodeReady`, ...)
to a copy of the host's stdout, so the launcher reads every site on one pipe. Lines are
written whole in one ``write`` each, which a pipe keeps apart. The host stops when its
stdin closes.

Each site dies with the host (Linux ``PR_SET_PDEATHSIG``), and the host with the
launcher (its :mod:`~fedbn_med.federation.launcher.watchdog`).

CUDA: the host never initialises CUDA (a forked child of a process that has cannot use
it); each site initialises it after the fork, on the device the launcher gave it (see
:mod:`fedbn_med.federation.launcher.devices`). ``cuda_initialized`` in the events above
reports ``torch.cuda.is_initialized()`` in the host just before it forks.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence

from fedbn_med.federation.events import (
    Event,
    ForkRequest,
    HostReady,
    HostRefused,
    SiteExited,
    SiteForked,
    decode,
    emit,
)

__all__ = ["die_with", "main"]

_OUT = 1  # the pipe to the launcher (a private copy of stdout, once main() starts)


def _preload(tasks: Sequence[str]) -> None:
    # Everything a site needs before its first message, in the order a site loads it.
    import torch  # noqa: F401

    import fedbn_med.federation.client_app
    import fedbn_med.federation.node
    import fedbn_med.training.trainer  # noqa: F401
    from fedbn_med.tasks import get_task

    for name in tasks:
        try:
            for module in get_task(name).preload:
                importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - the site will say it again, clearly
            print(f"site host: could not preload task {name!r}: {err}", file=sys.stderr,
                  flush=True)


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _send(event: Event) -> None:
    # One os.write per line, never Python's buffered stdout: _reap writes from a signal
    # handler, which may run while the main loop is writing.
    emit(_OUT, event)


def _reap(*_: object) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(SiteExited(pid=pid, code=os.waitstatus_to_exitcode(status)))


def die_with(parent: int) -> None:
    """In a forked child: have the kernel send SIGTERM when ``parent`` ends, however it ends.

    Linux only (elsewhere the launcher's watchdog stops the host with its children).
    Exits at once if ``parent`` ended before the call took effect.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the host ended before the call took effect
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def _run_site(request: ForkRequest) -> None:
    """In the forked child: become the site process and never return."""
    code = 1
    host = os.getppid()
    try:
        os.setsid()  # a session of its own, as the launcher gives every process it starts
        die_with(host)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        log = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        env = {str(k): str(v) for k, v in request.env.items()}
        os.environ.update(env)
        threads = env.get("OMP_NUM_THREADS")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        from fedbn_med.federation import node

        argv = [*request.argv, "--events-fd", str(_OUT)]  # its events: the launcher's pipe
        sys.argv = ["fedbn_med.federation.node", *argv]
        node.main(argv)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the site's log, then exit
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve fork requests from stdin until it closes."""
    parser = argparse.ArgumentParser(description="fedbn-med site host")
    parser.add_argument("--preload", action="append", default=[], metavar="TASK",
                        help="import this task's modules before forking (repeatable)")
    args = parser.parse_args(argv)
    global _OUT
    # Events go to a private copy of stdout; whatever a library prints lands in the log.
    _OUT = os.dup(1)
    os.dup2(2, 1)
    _preload(args.preload)
    signal.signal(signal.SIGCHLD, _reap)
    _send(HostReady(pid=os.getpid(), cuda_initialized=_cuda_initialized()))
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = decode(line)
            if not isinstance(request, ForkRequest):
                raise ValueError(f"expected a '{ForkRequest.kind}' event, got "
                                 f"'{request.kind}'")
        except ValueError as err:
            _send(HostRefused(reason=f"bad request {line.strip()[:200]!r}: {err}"))
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        cuda = _cuda_initialized()
        # No reaping between the fork and the answer naming the child: its exit event
        # must come after the answer.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
            if pid == 0:
                _run_site(request)
            _send(SiteForked(pid=pid, cuda_initialized=cuda))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


if __name__ == "__main__":
    main()
