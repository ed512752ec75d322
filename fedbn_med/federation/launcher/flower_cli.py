"""Flower's command lines as the launcher uses them: SuperLink, ``flwr run``, ``flwr supernode``.

Only documented commands and options appear here; their output is read as JSON
(``--format json``) where Flower offers it, never searched as text. The SuperLink is
Flower's own ``flower-superlink`` entry point (found in flwr's package metadata, see
:func:`superlink_entry_point`), started with the
collector tuned as long-running Python servers often are.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["APP_DIR", "SUPERLINK_GC", "TlsFiles", "connection_config", "entry_point",
           "flwr_tool", "register_key", "run_command", "superlink_command", "write_run_config"]

APP_DIR = Path(__file__).resolve().parent.parent / "flower_app"
_BIN = Path(sys.executable).parent
CONNECTION = "fedbn"  # the name of the SuperLink connection in FLWR_HOME/config.toml


@dataclass(frozen=True)
class TlsFiles:
    """The consortium's TLS files as the server uses them."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def flwr_tool(name: str) -> str:
    """Return the path of one of Flower's commands (``flwr``), next to this Python first."""
    candidate = _BIN / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"Flower's '{name}' command was not found (is flwr installed?).")
    return found


# Every message of a round goes through the SuperLink, so its per-request cost sets the
# pace of a round. Freezing its start-up objects out of collection and running fewer
# young-generation passes took about a tenth off its CPU time per round here
# (benchmarks/federation_overhead.py). Flower's code is untouched. The host of Flower's
# commands (.apphost) tunes the SuperLinks it forks the same way.
SUPERLINK_GC = (50000, 50, 100)
_SUPERLINK_MAIN = ("import gc, importlib, sys; gc.set_threshold(*{gc!r}); "
                   "module, _, name = {entry!r}.partition(':'); "
                   "main = getattr(importlib.import_module(module), name); gc.collect(); "
                   "gc.freeze(); sys.argv[0] = 'flower-superlink'; sys.exit(main())")


@functools.cache
def entry_point(name: str) -> str:
    """Return ``module:function`` of Flower's command ``name`` (``flower-superlink``, ...).

    Read from flwr's installed metadata (its declared console script), so the launching
    process imports none of flwr: only the command's own process does.
    """
    for entry in importlib.metadata.entry_points(group="console_scripts", name=name):
        if entry.dist is None or entry.dist.name == "flwr":
            return str(entry.value)
    raise FileNotFoundError(f"flwr does not declare the {name!r} command (is flwr "
                            "installed?).")


def superlink_entry_point() -> str:
    """Return ``module:function`` of Flower's ``flower-superlink`` command."""
    return entry_point("flower-superlink")


def superlink_command(host: str, port: int, tls: TlsFiles | None, node_auth: bool,
                      command: str | None = None) -> list[str]:
    """Return the command line of a SuperLink whose Fleet API listens on ``host:port``.

    ``command`` is the ``flower-superlink`` to run (default: Flower's entry point in a
    fresh interpreter, tuned as above).
    """
    cmd = [command] if command else [
        sys.executable, "-c", _SUPERLINK_MAIN.format(entry=superlink_entry_point(),
                                                     gc=SUPERLINK_GC)]
    cmd += ["--host", host, "--port", str(port), "--disable-runtime-dependency-installation"]
    if tls is None:
        cmd.append("--insecure")
    else:
        cmd += ["--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.server_cert),
                "--ssl-keyfile", str(tls.server_key)]
    if node_auth:
        cmd.append("--enable-supernode-auth")
    return cmd


def connection_config(address: str, tls: TlsFiles | None) -> str:
    """Return ``config.toml`` for ``$FLWR_HOME``: one connection to the SuperLink."""
    lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]",
             f'address = "{address}"']
    if tls is None:
        lines.append("insecure = true")
    else:
        lines.append(f'root-certificates = "{tls.ca_cert}"')
    return "\n".join(lines) + "\n"


def register_key(public_key: Path, *, env: Mapping[str, str], cwd: Path,
                 prefix: list[str] | None = None, flwr: str | None = None) -> int:
    """Register a site's public key with the SuperLink; return the node ID it gets.

    ``flwr`` is the ``flwr`` command to run (default: Flower's own, next to this Python).

    Raises
    ------
    RuntimeError
        When Flower refuses the key, with Flower's reason.
    """
    out = subprocess.run([*(prefix or []), flwr or flwr_tool("flwr"), "supernode", "register",
                          str(public_key), CONNECTION, "--format", "json"],
                         env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=120,
                         check=False)
    text = out.stdout.strip()
    try:
        answer = json.loads(text[text.find("{"):]) if "{" in text else {}
    except ValueError:
        answer = {}
    if out.returncode != 0 or not isinstance(answer, dict) or answer.get("success") is not True:
        reason = (answer.get("error-message") if isinstance(answer, dict) else None) or \
            (out.stdout + out.stderr).strip()[-800:]
        raise RuntimeError(f"Could not register {public_key}: {reason}")
    return int(answer.get("node-id", 0))


def write_run_config(path: Path, run_config: Mapping[str, object]) -> Path:
    """Write run-config overrides as a TOML file for ``flwr run --run-config``."""
    path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in run_config.items()))
    return path


def run_command(overrides: Path, flwr: str | None = None) -> list[str]:
    """Return ``flwr run`` of the fedbn-med app against our SuperLink, streaming its logs."""
    return [flwr or flwr_tool("flwr"), "run", str(APP_DIR), CONNECTION, "--stream",
            "--run-config", str(overrides)]


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))
