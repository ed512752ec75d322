"""A host of Flower's commands: load the server's stack once, fork a process per command.

Flower's SuperExec starts a fresh ``flwr-serverapp`` process for every run, and that
process spends about 5 s of CPU importing Flower, torch, MLflow and matplotlib before it
can ask for its first reply. A local comparison (several runs on one federation) pays it
for every run, and every run waits for it. The other Flower commands a federation runs
(``flower-superlink`` and ``flower-superexec`` once, ``flwr run`` per run, ``flwr
supernode register`` per site) import Flower afresh too, about a CPU-second each. This
host imports that stack once, Flower first, while the sites start, and forks: each
command is still its own process, running Flower's own entry point (:data:`TOOLS`) with
the arguments, environment, working folder and standard streams its caller gave it.

How a command reaches it: the launcher puts small scripts of the same names first on
PATH (:func:`.apphost_client.write_shims`; the code is
:mod:`~fedbn_med.federation.launcher.command_shim`) and runs its own commands through
them. Each sends its request over this host's Unix socket, in a folder only this user
may enter::

    -> 4-byte length, JSON {"tool": NAME, "argv": [...], "env": {...}, "cwd": "..."},
       and the caller's stdin, stdout and stderr (SCM_RIGHTS)
    <- "pid N"      the process was forked
    <- "exit CODE"  it ended (written by the process itself, just before it exits)
    <- "refused: REASON"   instead of both: the caller runs Flower's own command

The caller keeps the connection open while the process runs: once it closes (the caller
was killed), the process is killed too.

A request is checked before anything is forked: the caller's user ID (the socket's peer
credentials) must be this process's, the request at most :data:`MAX_REQUEST` bytes of
the shape above, with exactly three descriptors, and its start-up settings
(:data:`STARTUP_VARS`, the numeric code path) the host's own. The launcher stops a
federation's commands with ``{"stop": FLWR_HOME, "signal": N}`` (no descriptors), answered
``stopped COUNT`` once they have ended (:func:`.apphost_client.stop_runs`).

A federation starts a host of its own, stopped with it; a process that runs many
federations may share one (:func:`.apphost_client.share`). Each forked process dies with
the host (Linux ``PR_SET_PDEATHSIG``), and the host with the process that started it. The
host never initialises CUDA (the server averages on the CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import fedbn_med.federation.launcher.flower_cli as flower_cli
from fedbn_med.federation.launcher.sitehost import die_with

__all__ = ["MAX_REQUEST", "PRELOAD", "STARTUP_VARS", "TOOLS", "main"]

#: The modules the commands import: the numeric code path pinned before numpy loads, then
#: Flower's commands, then the ServerApp's stack; a request that comes while they load is
#: served between two modules (a SuperLink need not wait for MLflow).
PRELOAD = ("fedbn_med.numerics.pinned", "flwr.superlink.cli", "flwr.supercore.cli",
           "flwr.cli.app", "fedbn_med.federation.server_app", "fedbn_med.tracking",
           "mlflow.store.tracking.sqlalchemy_store", "matplotlib", "matplotlib.pyplot")
#: Flower's commands the host runs, by their console-script names (flwr's own metadata
#: says which function each one is).
TOOLS = ("flower-superlink", "flwr-serverapp", "flower-superexec", "flwr")
#: The largest request (arguments and environment) the host reads.
MAX_REQUEST = 1 << 20
_STOP_SIGNALS = frozenset({int(signal.SIGTERM), int(signal.SIGKILL), int(signal.SIGINT)})
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # the host's, then the child's
#: Variables a process reads as it starts or loads its libraries (the import path, thread
#: pools, devices, the numeric code path): a run whose values differ from the host's is
#: refused, and Flower's own command starts it afresh.
STARTUP_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
                "PYTHONUSERBASE", "PYTHONOPTIMIZE", "PYTHONWARNINGS", "PYTHONDEVMODE",
                "PYTHONUTF8", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "CUDA_VISIBLE_DEVICES",
                # read once, as flwr 1.42 and MLflow 3 load (telemetry, service addresses)
                "FLWR_TELEMETRY_ENABLED", "FLWR_TELEMETRY_LOGGING", "FLWR_SUPERGRID_API_URL",
                "FLWR_SUPERGRID_ADDRESS", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT",
                "FLWR_LOCAL_CONTROL_API_PORT", "FLWR_LOG_LEVEL", "MLFLOW_DISABLE_TELEMETRY",
                "DO_NOT_TRACK", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONIOENCODING")


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """Return the caller's request and descriptors; raise ValueError if it is not one."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    try:
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
        wanted = 0 if "stop" in request else 3
        if len(fds) != wanted:
            raise ValueError(f"expected {wanted} descriptors (a run: stdin, stdout, stderr), "
                             f"got {len(fds)}")
        return request, fds
    except BaseException:  # refused, or the caller went away: keep none of its streams
        for fd in fds:
            os.close(fd)
        raise


def _check(request: object) -> None:
    if isinstance(request, dict) and set(request) == {"stop", "signal"}:
        if not (isinstance(request["stop"], str) and type(request["signal"]) is int
                and request["signal"] in _STOP_SIGNALS):
            raise ValueError(f"a stop request names a group and one of the signals "
                             f"{sorted(_STOP_SIGNALS)}")
        return
    if not isinstance(request, dict) or set(request) != {"tool", "argv", "env", "cwd"}:
        raise ValueError("expected an object with tool, argv, env and cwd (or stop and "
                         "signal)")
    if request["tool"] not in TOOLS:
        raise ValueError(f"tool must be one of {', '.join(TOOLS)}")
    argv, env, cwd = request["argv"], request["env"], request["cwd"]
    if not (isinstance(argv, list) and all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise ValueError("argv must be a list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) and k
                                          and "=" not in k and "\0" not in k + v
                                          for k, v in env.items())):
        raise ValueError("env must map names to strings")
    if not (isinstance(cwd, str) and os.path.isdir(cwd)):
        raise ValueError(f"cwd {str(cwd)[:200]!r} is not a folder")


def _startup(env: dict[str, str]) -> dict[str, str | None]:
    """Return what a process started with ``env`` would read as it starts (see above)."""
    from fedbn_med.numerics import PINNED, SWITCH, pin

    effective = dict(env)
    pin(effective)  # what fedbn_med.numerics.pinned would set in that process
    return {k: effective.get(k) for k in (*STARTUP_VARS, SWITCH, *PINNED)}


def _serve(listener: socket.socket, preload: tuple[str, ...]) -> None:
    """Answer requests until the launcher stops this host (a forked child returns never).

    The modules of ``preload`` are loaded first, one between two looks for a request.
    Stopped (SIGTERM) or failing, the host ends what it forked first, and waits for it.
    """
    host = os.getpid()
    groups: dict[int, str] = {}  # each running process's group: its FLWR_HOME
    try:
        _answer(listener, preload, groups)
    finally:
        if os.getpid() == host:
            _stop_group(groups, None, signal.SIGTERM, grace=4.0)


def _answer(listener: socket.socket, preload: tuple[str, ...], groups: dict[int, str]
            ) -> None:
    launcher = os.getppid()
    own = _startup(dict(os.environ))
    pending = list(preload)
    while True:
        if pending:
            name = pending.pop(0)
            try:
                module = importlib.import_module(name)
                if name == "matplotlib":
                    module.use("Agg")  # as the convergence plot sets it up
            except Exception as err:  # noqa: BLE001 - a forked command loads it itself
                print(f"ServerApp host: could not load {name}: {err!r}", file=sys.stderr,
                      flush=True)
            if not pending:
                print(f"ServerApp host {os.getpid()} ready", file=sys.stderr, flush=True)
        ready, _, _ = select.select([listener], [], [], 0.0 if pending else 1.0)
        for pid in _reap():
            groups.pop(pid, None)
        if os.getppid() != launcher:  # the process that started this host is gone
            raise SystemExit(0)  # _serve ends what it forked
        if not ready:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        try:
            _handle(conn, listener, groups, own)
        except Exception as err:  # noqa: BLE001 - one failed request never stops the host
            print(f"ServerApp host: a request failed: {err!r}", file=sys.stderr, flush=True)
        finally:
            conn.close()


def _handle(conn: socket.socket, listener: socket.socket, groups: dict[int, str],
            own: dict[str, str | None]) -> None:
    """Answer one caller: refuse it, stop a group's processes, or fork its command."""
    if _peer_uid(conn) != os.getuid():
        conn.sendall(b"refused: another user\n")
        return
    conn.settimeout(10.0)
    try:
        request, fds = _read_request(conn)
    except (ValueError, OSError) as err:  # a malformed or too large request
        print(f"ServerApp host: refused a request: {err}", file=sys.stderr, flush=True)
        conn.sendall(f"refused: {str(err)[:200]}\n".encode())
        return
    if "stop" in request:
        stopped = _stop_group(groups, request["stop"], request["signal"])
        conn.sendall(f"stopped {stopped}\n".encode())
        return
    try:  # the caller's streams stay open in the forked child only
        try:
            differ = sorted(k for k, v in _startup(request["env"]).items() if own[k] != v)
        except ValueError as err:  # a numeric-path switch no process would start with
            differ = [str(err)[:200]]
        if differ:
            conn.sendall(f"refused: the run starts with other {', '.join(differ)}\n"
                         .encode())
            return
        entry = flower_cli.entry_point(request["tool"])  # read once per host, not per fork
        sys.stdout.flush()
        sys.stderr.flush()
        # What the host loaded is the child's too, copy-on-write: kept out of the
        # collector's passes, which would touch (and copy) every page of it.
        gc.freeze()
        # The child takes the signals its command handles, never the host's handlers.
        signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            pid = os.fork()
            if pid == 0:
                _become(conn, request, entry, fds, listener)  # never returns
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
        groups[pid] = request["env"].get("FLWR_HOME", "")
        print(f"ServerApp host: forked process {pid} for {request['tool']}",
              file=sys.stderr, flush=True)
        conn.sendall(f"pid {pid}\n".encode())
    finally:
        for fd in fds:
            os.close(fd)


def _reap() -> list[int]:
    ended: list[int] = []
    with contextlib.suppress(ChildProcessError):
        while (pid := os.waitpid(-1, os.WNOHANG)[0]) != 0:
            ended.append(pid)
    return ended


def _stop_group(groups: dict[int, str], group: str | None, sig: int,
                grace: float = 5.0) -> int:
    """Signal the processes of ``group`` (all with None) and wait until they have ended.

    Those still running after ``grace`` seconds are killed. Returns how many there were.
    """
    pids = [pid for pid, g in groups.items() if group is None or g == group]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    left = set(pids)
    while left:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.discard(pid)
                groups.pop(pid, None)
        if left and time.monotonic() > deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        elif left:
            time.sleep(0.02)
    return len(pids)


def _become(conn: socket.socket, request: dict, entry: str, fds: list[int],
            listener: socket.socket) -> None:
    """In the forked child: run the Flower command ``entry`` as the request says, exit."""
    code = 1
    try:
        listener.close()
        for signum in (*_HANDLED, signal.SIGCHLD):  # blocked since before the fork
            signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT
                          else signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
        die_with(os.getppid())
        conn.settimeout(None)
        if request["tool"] == "flower-superlink":  # tuned as a fresh one (flower_cli)
            gc.set_threshold(*flower_cli.SUPERLINK_GC)
        threading.Thread(target=_die_with_caller, args=(conn,), daemon=True).start()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        module, _, name = entry.partition(":")
        command = getattr(importlib.import_module(module), name)
        sys.argv = [request["tool"], *request["argv"]]
        command()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):  # as the interpreter says it
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - said on the run's stderr, then exit
        import traceback

        traceback.print_exc()
    _wind_down()
    with contextlib.suppress(OSError):
        conn.sendall(f"exit {code}\n".encode())
    os._exit(code)


def _die_with_caller(conn: socket.socket) -> None:
    """Kill this process once the caller's end of ``conn`` closes (it sends nothing more)."""
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _wind_down() -> None:
    """End as the interpreter ends a process: its threads, its exit handlers, its output."""
    import atexit

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
    print(f"ServerApp host {os.getpid()} listening on {args.socket}", file=sys.stderr,
          flush=True)
    _serve(listener, PRELOAD)


if __name__ == "__main__":
    main()
