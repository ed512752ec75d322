"""A ServerApp host: load the server's stack once, fork one ServerApp process per run.

Flower's SuperExec starts a fresh ``flwr-serverapp`` process for every run, and that
process spends about 5 s of CPU importing Flower, torch, MLflow and matplotlib before it
can ask for its first reply. A local comparison (several runs on one federation) pays it
for every run, and every run waits for it. This host imports that stack once, while the
sites start, and forks: each run's ServerApp is still its own process, running Flower's
own ``flwr-serverapp`` entry point with the arguments, environment, working folder and
standard streams the SuperExec gave it.

How a run reaches it: the launcher puts a small ``flwr-serverapp`` of its own first on the
SuperLink's PATH (:func:`write_shim`; the code is
:mod:`~fedbn_med.federation.launcher.serverapp_shim`). The SuperExec starts that; it
sends its request over this host's Unix socket, in a folder only this user may enter::

    -> 4-byte length, JSON {"argv": [...], "env": {...}, "cwd": "..."}, and the
       caller's stdin, stdout and stderr (SCM_RIGHTS)
    <- "pid N"      the ServerApp process was forked
    <- "exit CODE"  it ended (written by the ServerApp itself, just before it exits)
    <- "refused: REASON"   instead of both: the caller runs Flower's own command

A request is checked before anything is forked: the caller's user ID (the socket's peer
credentials) must be this process's, the request at most :data:`MAX_REQUEST` bytes of
the shape above, with exactly three descriptors. Each ServerApp dies with the host
(Linux ``PR_SET_PDEATHSIG``); the host is one of the launcher's processes, stopped with
the federation. The host never initialises CUDA (the server averages on the CPU).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
from pathlib import Path

__all__ = ["MAX_REQUEST", "PRELOAD", "main", "write_shim"]

#: The modules a ServerApp imports, in the order its process would (the numeric code path
#: is pinned before numpy loads; matplotlib as the convergence plot sets it up).
PRELOAD = ("fedbn_med.numerics.pinned", "flwr.superlink.cli", "fedbn_med.federation.server_app",
           "fedbn_med.tracking", "mlflow.store.tracking.sqlalchemy_store", "matplotlib")
#: The largest request (arguments and environment) the host reads.
MAX_REQUEST = 1 << 20
_PR_SET_PDEATHSIG = 1
SHIM = Path(__file__).resolve().with_name("serverapp_shim.py")


def write_shim(folder: Path, socket_path: Path, real: str) -> Path:
    """Write the ``flwr-serverapp`` that hands runs to the host at ``socket_path``.

    Returns ``folder``, to put first on the SuperLink's PATH.
    """
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    script = folder / "flwr-serverapp"
    words = " ".join(_sh_quote(w) for w in (sys.executable, "-I", "-S", str(SHIM),
                                            str(socket_path), real))
    script.write_text(f'#!/bin/sh\nexec {words} "$@"\n', encoding="utf-8")
    os.chmod(script, 0o700)
    return folder


def _sh_quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """Return the caller's request and descriptors; raise ValueError if it is not one."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    try:
        if len(fds) != 3:
            raise ValueError(f"expected 3 descriptors (stdin, stdout, stderr), got {len(fds)}")
        if len(data) < 4:
            raise ValueError("the request ended before its length")
        size = int.from_bytes(data[:4], "big")
        if size > MAX_REQUEST:
            raise ValueError(f"a request of {size} bytes; at most {MAX_REQUEST} are read")
        body = bytearray(data[4:])
        while len(body) < size:
            chunk = conn.recv(min(65536, size - len(body)))
            if not chunk:
                raise ValueError(f"the request ended after {len(body)} of {size} bytes")
            body += chunk
        request = json.loads(bytes(body[:size]))
        _check(request)
        return request, fds
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise


def _check(request: object) -> None:
    if not isinstance(request, dict) or set(request) != {"argv", "env", "cwd"}:
        raise ValueError("expected an object with argv, env and cwd")
    argv, env, cwd = request["argv"], request["env"], request["cwd"]
    if not (isinstance(argv, list) and all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise ValueError("argv must be a list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) and k
                                          and "=" not in k and "\0" not in k + v
                                          for k, v in env.items())):
        raise ValueError("env must map names to strings")
    if not (isinstance(cwd, str) and os.path.isdir(cwd)):
        raise ValueError(f"cwd {str(cwd)[:200]!r} is not a folder")


def _serve(listener: socket.socket) -> None:
    """Answer requests until the launcher stops this host (a child returns from here)."""
    while True:
        ready, _, _ = select.select([listener], [], [], 1.0)
        _reap()
        if not ready:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        try:
            if _peer_uid(conn) != os.getuid():
                conn.sendall(b"refused: another user\n")
                continue
            conn.settimeout(10.0)
            try:
                request, fds = _read_request(conn)
            except (ValueError, OSError) as err:  # a malformed or too large request
                print(f"ServerApp host: refused a request: {err}", file=sys.stderr,
                      flush=True)
                conn.sendall(f"refused: {str(err)[:200]}\n".encode())
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                _become_serverapp(conn, request, fds)  # never returns
            for fd in fds:
                os.close(fd)
            print(f"ServerApp host: forked process {pid} for {request['argv'][:1]}",
                  file=sys.stderr, flush=True)
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            pass  # the caller went away; its child (if any) runs on or ends by itself
        finally:
            conn.close()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_serverapp(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: run Flower's ``flwr-serverapp`` as the request says, then exit."""
    code = 1
    host = os.getppid()
    try:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if os.getppid() != host:  # the host ended before the call took effect
            os._exit(1)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT
                          else signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        threads = request["env"].get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            import torch

            torch.set_num_threads(int(threads))
        from flwr.superlink.cli import flwr_serverapp

        sys.argv = ["flwr-serverapp", *request["argv"]]
        flwr_serverapp()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - said on the run's stderr, then exit
        import traceback

        traceback.print_exc()
    _wind_down()
    try:
        conn.sendall(f"exit {code}\n".encode())
    except OSError:
        pass
    os._exit(code)


def _wind_down() -> None:
    """End as the interpreter ends a process: its threads, its exit handlers, its output."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(timeout=30.0)
    try:
        atexit._run_exitfuncs()
    except Exception:  # noqa: BLE001 - as at the end of any process: said, not raised
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def main(argv: list[str] | None = None) -> None:
    """Import the ServerApp's stack, then fork a ServerApp for each request."""
    parser = argparse.ArgumentParser(description="fedbn-med ServerApp host")
    parser.add_argument("--socket", type=Path, required=True,
                        help="the Unix socket to listen on (its folder must be private)")
    args = parser.parse_args(argv)
    folder = args.socket.parent
    if folder.stat().st_mode & 0o077:
        parser.error(f"{folder} may be entered by other users; the socket's folder must "
                     "be private (mode 0700)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Listen first: a run that comes while the stack loads waits in the backlog (a fresh
    # flwr-serverapp would load the same stack, and started later).
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    args.socket.unlink(missing_ok=True)
    listener.bind(str(args.socket))
    os.chmod(args.socket, 0o600)
    listener.listen(16)
    for module in PRELOAD:
        importlib.import_module(module)
    import matplotlib

    matplotlib.use("Agg")
    importlib.import_module("matplotlib.pyplot")
    print(f"ServerApp host {os.getpid()} ready on {args.socket}", file=sys.stderr, flush=True)
    _serve(listener)


if __name__ == "__main__":
    main()
