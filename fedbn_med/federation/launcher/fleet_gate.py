"""The server's public port: Flower's Fleet API only, signed, bounded in time, count and size.

Flower 1.42 serves the Fleet, Control and ServerApp-facing (runtime) APIs on one HTTP
port (``flower-superlink --host --port``), and its Control API is authenticated only by
the OpenID Connect plugin of Flower Enterprise. In hospital mode the SuperLink therefore
binds 127.0.0.1, where only the server host's own processes reach it, and this gate
listens on ``--listen``: it serves TLS with the consortium's server certificate and
forwards a request to the SuperLink only when

- its path is one of Flower's Fleet routes (``/v1/fleet/<name>``, what a SuperNode
  calls); everything else (Control: key registration, runs, apps; the runtime API) is
  answered 404;
- it carries Flower's SuperNode signature headers (``flwr-public-key``,
  ``flwr-timestamp``, ``flwr-signature``: the node's key signs the timestamp, see
  ``flwr.supernode.node_auth_http_interceptor``), the signature verifies, the timestamp
  lies in Flower's window, and, with ``--allowed-key`` files (node authentication), the
  key is one of the consortium's sites. Anything else is answered 401 here;
- its key has requests left in its token bucket (``--rate`` per second, ``--burst``);
  else 429;
- its body, declared by ``Content-Length``, is at most ``max_body`` bytes (from
  ``--max-body``, or the number the ServerApp writes to ``--max-body-file`` once it
  knows its model); else 413 before a byte of it is read.

Flower still checks the signature again and whether the node may call what it calls.
Every connection is bounded too:

- its TLS handshake and each request head must arrive within ``--header-timeout``
  seconds (idle keep-alive connections are closed after it); a body must arrive within
  ``--body-timeout`` seconds plus one second per ``--min-rate`` bytes;
- at most ``--max-connections`` are open (fewer when the descriptor limit is low: the
  gate keeps descriptors for its connections to the SuperLink). A new connection at the
  bound closes the oldest one that has not yet sent an accepted request, so idle
  connections cannot lock the sites out;
- request bodies in memory at once take at most ``--max-inflight`` bytes; a request
  that finds no room within its body timeout is answered 503. Bodies live in one
  buffer each, which the allocator hands back to the system when it is freed.

A client whose requests are refused faster than ``--refusal-rate`` per second (per IP
address) gets its connections closed without an answer. The gate never speaks to the
SuperLink for a refused request.

The rules live in :mod:`.gate_rules`, the connections in :mod:`.gate_server`. Run as
``python -P -m fedbn_med.federation.launcher.fleet_gate`` (:func:`command`); it imports
nothing else of fedbn_med (no torch, no Flower), so it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from fedbn_med.federation.launcher.gate_rules import (
    FLEET_PATH,
    SIGNATURE_HEADERS,
    TIMESTAMP_WINDOW,
    UPSTREAM_CONNECTIONS,
    BodyLimit,
    GateLimits,
    Signatures,
    read_allowed_keys,
    return_freed_memory,
    set_fd_limit,
)
from fedbn_med.federation.launcher.gate_server import Gate

if TYPE_CHECKING:
    from fedbn_med.federation.launcher.flower_cli import TlsFiles

__all__ = ["FLEET_PATH", "SIGNATURE_HEADERS", "TIMESTAMP_WINDOW", "GateLimits", "command",
           "main", "serve"]

logger = logging.getLogger("fedbn_med.gate")

#: What ``python -m`` runs.
MODULE = "fedbn_med.federation.launcher.fleet_gate"


def command(listen: str, upstream: str, *, ready_file: Path, max_body: int = 64 << 20,
            max_body_file: Path | None = None, tls: TlsFiles | None = None,
            allowed_keys: Sequence[Path] = (), limits: GateLimits | None = None,
            fd_limit: int | None = None) -> list[str]:
    """Return the command line of a gate on ``listen`` in front of the SuperLink ``upstream``.

    The options are :func:`main`'s; ``allowed_keys`` are the sites' OpenSSH public keys
    (none: any key whose signature verifies).
    """
    cmd = [sys.executable, "-P", "-m", MODULE,
           "--listen", listen, "--upstream", upstream, "--max-body", str(max_body),
           "--ready-file", str(ready_file)]
    if max_body_file is not None:
        cmd += ["--max-body-file", str(max_body_file)]
    if tls is not None:
        cmd += ["--ssl-certfile", str(tls.server_cert), "--ssl-keyfile", str(tls.server_key),
                "--ssl-ca-certfile", str(tls.ca_cert)]
    for key in allowed_keys:
        cmd += ["--allowed-key", str(key)]
    for name, value in (limits or GateLimits()).__dict__.items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    if fd_limit is not None:
        cmd += ["--fd-limit", str(fd_limit)]
    return cmd


async def serve(listen: str, upstream: str, *, limits: GateLimits, max_body: int,
                max_body_file: Path | None = None, allowed_keys: frozenset[bytes] | None = None,
                certfile: Path | None = None, keyfile: Path | None = None,
                ca_cert: Path | None = None, ready_file: Path | None = None,
                fd_limit: int | None = None) -> None:
    """Serve the gate on ``listen`` until cancelled, forwarding to ``upstream``."""
    pool = httpx.Limits(max_connections=UPSTREAM_CONNECTIONS,
                        max_keepalive_connections=UPSTREAM_CONNECTIONS)
    if ca_cert is None:
        client = httpx.AsyncClient(base_url=f"http://{upstream}", timeout=120.0, limits=pool)
    else:
        context = ssl.create_default_context(cafile=str(ca_cert))
        client = httpx.AsyncClient(base_url=f"https://{upstream}", verify=context,
                                   timeout=120.0, limits=pool)
    tls = None
    if certfile is not None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
    return_freed_memory()
    bound = limits.connection_bound(set_fd_limit(fd_limit))
    gate = Gate(client, BodyLimit(max_body, max_body_file), limits,
                Signatures(allowed_keys), tls, bound)
    host, _, port = listen.rpartition(":")
    listener = socket.create_server((host.strip("[]"), int(port)), backlog=256,
                                    family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setblocking(False)
    logger.info("Gate on %s -> %s: at most %d connections, %d bytes in flight, %s keys",
                listen, upstream, bound, limits.max_inflight,
                "any signed" if allowed_keys is None else len(allowed_keys))
    if ready_file is not None:
        ready_file.write_text(f"{listen}\n")
    accepting = asyncio.create_task(gate.accept(listener))
    trimming = asyncio.create_task(gate.trim())
    for sig in (signal.SIGTERM, signal.SIGINT):  # stop cleanly, saying what it did
        asyncio.get_running_loop().add_signal_handler(sig, accepting.cancel)
    try:
        await accepting
    except asyncio.CancelledError:
        pass
    finally:
        trimming.cancel()
        listener.close()
        await client.aclose()
        logger.info("Gate stopped: %s, peak %d bytes in flight", gate.counts, gate.budget.peak)


def main(argv: list[str] | None = None) -> None:
    """Serve the gate until stopped."""
    defaults = GateLimits()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="HOST:PORT the sites dial")
    p.add_argument("--upstream", required=True, help="the SuperLink's 127.0.0.1:PORT")
    p.add_argument("--ssl-certfile", type=Path, default=None)
    p.add_argument("--ssl-keyfile", type=Path, default=None)
    p.add_argument("--ssl-ca-certfile", type=Path, default=None,
                   help="the CA the SuperLink's certificate chains to")
    p.add_argument("--max-body", type=int, default=64 << 20)
    p.add_argument("--max-body-file", type=Path, default=None)
    p.add_argument("--allowed-key", type=Path, action="append", default=[],
                   help="a site's OpenSSH public key; with any, only these keys pass")
    p.add_argument("--ready-file", type=Path, default=None,
                   help="written once the port is bound")
    p.add_argument("--fd-limit", type=int, default=None,
                   help="lower this process's descriptor limit to this")
    for name, value in defaults.__dict__.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    limits = GateLimits(**{k: getattr(args, k) for k in defaults.__dict__})
    allowed = read_allowed_keys(args.allowed_key) if args.allowed_key else None
    try:
        asyncio.run(serve(args.listen, args.upstream, limits=limits, max_body=args.max_body,
                          max_body_file=args.max_body_file, allowed_keys=allowed,
                          certfile=args.ssl_certfile, keyfile=args.ssl_keyfile,
                          ca_cert=args.ssl_ca_certfile, ready_file=args.ready_file,
                          fd_limit=args.fd_limit))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
