"""The Flower commands the launcher puts first on PATH (standard library only).

Flower starts its own commands by name: the SuperExec ``flwr-serverapp ARGS`` for every
run, the SuperLink ``flower-superexec ARGS``; the launcher runs ``flwr run`` and ``flwr
supernode register``. Each of these scripts hands its command's name, ARGS, its
environment, its working folder and its three standard streams to the host
(:mod:`fedbn_med.federation.launcher.apphost`) over the host's Unix socket, then waits
for the forked process to end and exits with its code; the signals it gets go on to that
process, and the process ends should this script be killed. Where the host cannot be
reached, is not this user's, or refuses, it becomes Flower's own command instead
(``exec``), so no command depends on the host being there.

It runs as ``python -I -S command_shim.py SOCKET NAME REAL_COMMAND ARGS...``: no site
packages and no environment-driven imports, a few milliseconds of start-up.
"""

import json
import os
import signal
import socket
import struct
import sys


def _fall_back(name: str, real: str, args: list, why: str) -> None:
    print(f"fedbn-med: the host of Flower's commands did not take this {name} ({why}); "
          f"Flower's own {name} runs it", file=sys.stderr, flush=True)
    os.execv(real, [real, *args])


def _streams() -> list:
    """Return descriptors 0, 1 and 2, with /dev/null for any the caller left closed."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def main() -> None:
    """Hand this command to the host, wait for its process, exit with that process's code."""
    sock_path, name, real, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    request = json.dumps({"tool": name, "argv": args, "env": dict(os.environ),
                          "cwd": os.getcwd()}).encode()
    payload = len(request).to_bytes(4, "big") + request
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(120.0)  # the host answers between two of the modules it loads
        conn.connect(sock_path)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():  # our environment goes to it
            conn.close()
            _fall_back(name, real, args, "the host is another user's")
            return
        try:
            sent = socket.send_fds(conn, [payload], _streams())
            if sent < len(payload):
                conn.sendall(payload[sent:])
        except BrokenPipeError:
            pass  # the host answered (a refusal) before reading it all: its reason follows
        reader = conn.makefile("rb")
        first = reader.readline()
    except OSError as err:
        _fall_back(name, real, args, str(err))
        return
    if not first.startswith(b"pid "):  # refused: Flower's own command runs it
        conn.close()
        _fall_back(name, real, args, first.decode(errors="replace").strip() or "no answer")
        return
    pid = int(first.split()[1])
    conn.settimeout(None)  # the command takes as long as it takes

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    last = reader.readline()  # "exit CODE" when it ends; nothing if it was killed
    sys.exit(int(last.split()[1]) if last.startswith(b"exit ") else 1)


if __name__ == "__main__":
    main()
