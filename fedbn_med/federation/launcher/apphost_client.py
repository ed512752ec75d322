"""The launcher's side of the host of Flower's commands (:mod:`.apphost`).

:func:`write_shims` writes the commands a federation puts first on Flower's PATH (and
runs its own ``flwr`` through); :func:`socket_folder` makes the private folder of a
host's socket; :func:`share` and :func:`shared` let the federations of one process use
one host; :func:`stop_runs` stops one federation's processes in a shared host.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import fedbn_med.federation.launcher.flower_cli as flower_cli
from fedbn_med.federation.launcher.apphost import TOOLS

if TYPE_CHECKING:
    from fedbn_med.federation.launcher.supervisor import Supervisor

__all__ = ["ENV_VAR", "SHIM", "TOOLS", "prepare", "share", "shared", "socket_folder", "start",
           "stop_runs", "write_shims"]

SHIM = Path(__file__).resolve().with_name("command_shim.py")
#: ``off``: Flower starts each of its commands afresh. The path of a running host's socket:
#: the federations of this process, and of the commands it starts, share that host.
#: Unset: each federation starts a host of its own.
ENV_VAR = "FEDBN_MED_SERVERAPP_HOST"
_shared: Path | None = None


def prepare(workdir: Path, may_share: bool = True) -> tuple[Path | None, Path, Path]:
    """Return where a federation in ``workdir`` finds its host of Flower's commands.

    That is the host this process shares (:func:`shared`) where ``may_share``, else one
    of its own, in a private folder (``serverapp-host/``, started by :func:`start`).
    Returns that folder (None for a shared host), the host's socket, and the folder of
    the commands that hand themselves to it (``flower-bin/``, :func:`write_shims`).

    Raises
    ------
    ValueError
        When :data:`ENV_VAR` names no socket (see :func:`shared`).
    """
    socket_path = shared() if may_share else None
    own = None
    if socket_path is None:
        own = socket_folder(workdir / "serverapp-host")
        socket_path = own / "serverapp.sock"
    real = {tool: flower_cli.flwr_tool(tool) for tool in TOOLS}  # Flower's own
    return own, socket_path, write_shims(workdir / "flower-bin", socket_path, real)


def start(supervisor: Supervisor, folder: Path, prefix: Sequence[str] = (),
          timeout: float = 60.0) -> None:
    """Start a host listening in ``folder`` as the supervisor's ``serverapp-host``.

    Returns once it listens (it loads its stack afterwards, serving requests between two
    modules).
    """
    sock = folder / "serverapp.sock"
    sock.unlink(missing_ok=True)
    supervisor.spawn("serverapp-host", [sys.executable, "-m",
                                        "fedbn_med.federation.launcher.apphost",
                                        "--socket", str(sock)], prefix=prefix)
    supervisor.wait_until("serverapp-host", sock.is_socket, timeout, every=0.02,
                          exited="The ServerApp host ended at start-up",
                          late=f"The ServerApp host did not listen within {timeout:.0f} s.")


def write_shims(folder: Path, socket_path: Path, real: dict[str, str]) -> Path:
    """Write the commands that hand themselves to the host at ``socket_path``.

    ``real`` maps each name of :data:`TOOLS` to write to Flower's own command, which runs
    where the host does not. Returns ``folder``, to put first on Flower's PATH.
    """
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    for name, command in real.items():
        if name not in TOOLS:
            raise ValueError(f"The host runs {', '.join(TOOLS)}, not {name!r}.")
        words = " ".join(_sh_quote(w) for w in (sys.executable, "-I", "-S", str(SHIM),
                                                str(socket_path), name, command))
        (folder / name).write_text(f'#!/bin/sh\nexec {words} "$@"\n', encoding="utf-8")
        os.chmod(folder / name, 0o700)
    return folder


def socket_folder(wanted: Path) -> Path:
    """Return ``wanted``, made private (0700), as the folder of a host's socket.

    A private temporary folder instead where the socket's path would be too long.
    """
    if len(os.fsencode(wanted / "serverapp.sock")) < 100:
        wanted.mkdir(mode=0o700, exist_ok=True)
        os.chmod(wanted, 0o700)
        return wanted
    return Path(tempfile.mkdtemp(prefix="fedbn-apphost-"))


def share(socket_path: Path | None) -> None:
    """Have every later :class:`~.federation.LocalFederation` of this process use one host.

    A process that runs many federations one after another (a test session, a study) then
    loads the ServerApp's stack once, not once per federation. The caller starts the host
    (``python -m fedbn_med.federation.launcher.apphost --socket PATH``) and stops it; None
    ends this call's sharing (:data:`ENV_VAR` may still name a host). Each federation
    still stops its own processes in it (:func:`stop_runs`) when it stops its SuperLink.
    """
    global _shared
    _shared = None if socket_path is None else Path(socket_path)


def shared() -> Path | None:
    """Return the socket of the host this process's federations share (None: each its own).

    That is the one :func:`share` named, else the one :data:`ENV_VAR` names.

    Raises
    ------
    ValueError
        When :data:`ENV_VAR` is neither ``off`` nor the socket of a running host.
    """
    if _shared is not None:
        return _shared
    value = os.environ.get(ENV_VAR, "")
    if not value or value.lower() == "off":
        return None
    if not Path(value).is_socket():
        raise ValueError(f"{ENV_VAR}={value!r}: expected 'off' or the socket of a running "
                         "host (python -m fedbn_med.federation.launcher.apphost --socket "
                         "PATH)")
    return Path(value)


def stop_runs(socket_path: Path, group: str, sig: int = signal.SIGTERM,
              timeout: float = 30.0) -> int:
    """Stop the processes the host forked for the federation whose FLWR_HOME is ``group``.

    Returns how many were running; 0 when the host is gone (its processes went with it).
    Returns once they have ended.
    """
    body = json.dumps({"stop": group, "signal": int(sig)}).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(socket_path))
            conn.sendall(len(body).to_bytes(4, "big") + body)
            answer = conn.makefile("rb").readline()
    except (FileNotFoundError, ConnectionRefusedError):
        return 0
    if not answer.startswith(b"stopped "):
        raise RuntimeError(f"The ServerApp host at {socket_path} did not stop the runs of "
                           f"{group}: {answer.decode(errors='replace').strip()!r}")
    return int(answer.split()[1])


def _sh_quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"

