"""A site host: load the training stack once, then fork one process per site.

A site process spends about 8 s of CPU importing torch, MONAI and Flower before it can
load a single subject. A hospital runs one site and pays that once; a workstation that
runs four sites (the main job, the tests, the benchmarks) would pay it four times on the
same cores. The host imports everything once and forks: each site is still its own OS
process, in its own session, with its own data, model, device, private state and log;
the forked processes share only the code already loaded, copy-on-write.

The launcher talks to the host over its stdin and stdout, one JSON object per line::

    -> {"argv": [...node arguments...], "log": "/path/site-NYU.log",
        "exit": "/path/site-NYU.exit", "env": {"OMP_NUM_THREADS": "1"}}
    <- {"pid": 12345}

The host writes each site's exit code to its ``exit`` file when the site ends, and stops
when its stdin closes. A request it cannot serve is answered ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path

__all__ = ["main"]


def _preload() -> None:
    # Everything a site needs before its first message, in the order a site loads it.
    import torch  # noqa: F401

    import fedbn_med.data.abide
    import fedbn_med.data.cohort
    import fedbn_med.data.splits
    import fedbn_med.federation.client_app
    import fedbn_med.federation.node
    import fedbn_med.trainer  # noqa: F401


_EXIT_FILES: dict[int, Path] = {}


def _reap(*_: object) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        path = _EXIT_FILES.pop(pid, None)
        if path is not None:
            try:
                path.write_text(f"{code}\n")
            except OSError:
                pass


def _run_site(request: dict) -> None:
    """In the forked child: become the site process and never return."""
    code = 1
    try:
        os.setsid()  # a session of its own, as the launcher gives every process it starts
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        env = {str(k): str(v) for k, v in request.get("env", {}).items()}
        os.environ.update(env)
        threads = env.get("OMP_NUM_THREADS")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        from fedbn_med.federation import node

        sys.argv = ["fedbn_med.federation.node", *request["argv"]]
        node.main(list(request["argv"]))
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


def main() -> None:
    """Serve fork requests from stdin until it closes."""
    _preload()
    signal.signal(signal.SIGCHLD, _reap)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            argv, log = list(request["argv"]), str(request["log"])
        except (ValueError, KeyError, TypeError) as err:
            print(json.dumps({"error": f"bad request {line.strip()[:200]!r}: {err}"}),
                  flush=True)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # No reaping between the fork and noting where the child's exit code goes.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
            if pid == 0:
                _run_site({**request, "argv": argv, "log": log})
            if request.get("exit"):
                _EXIT_FILES[pid] = Path(request["exit"])
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    main()
