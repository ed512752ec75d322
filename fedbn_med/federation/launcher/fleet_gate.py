"""The server's public port: Flower's Fleet API only, with a bound on what a site may send.

Flower 1.42 serves the Fleet, Control and ServerApp-facing (runtime) APIs on one HTTP
port (``flower-superlink --host --port``), and its Control API is authenticated only by
the OpenID Connect plugin of Flower Enterprise. In hospital mode the SuperLink therefore
binds 127.0.0.1, where only the server host's own processes reach it, and this gate
listens on ``--listen``: it serves TLS with the consortium's server certificate and
forwards a request to the SuperLink only when its path is one of Flower's Fleet routes
(``/v1/fleet/<name>``, what a SuperNode calls). Everything else (Control: key
registration, runs, apps; the runtime API) is answered 404 without reaching Flower.
Node authentication stays Flower's (``--enable-supernode-auth``): the gate forwards the
signed headers untouched, and Flower refuses a Fleet ``register-node`` under it.

A request body over ``max_body`` bytes (from ``--max-body``, or the number the
ServerApp writes to ``--max-body-file`` once it knows its model) is refused with 413
before it is read, so an oversized reply never reaches the SuperLink.

Run as ``python -m fedbn_med.federation.launcher.fleet_gate``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["FLEET_PATH", "build_app", "main"]

logger = logging.getLogger("fedbn_med.gate")

#: The only paths the gate forwards: Flower's Fleet routes, nothing relative or encoded.
FLEET_PATH = re.compile(r"/v1/fleet/[a-z][a-z-]{0,63}")
_HOP = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive",
                  "upgrade", "proxy-connection", "te", "trailer"})


class _Limit:
    """The body limit: a fixed number, or the one the ServerApp wrote to a file."""

    def __init__(self, default: int, path: Path | None) -> None:
        self.default = default
        self.path = path
        self._seen: tuple[float, int] | None = None

    def value(self) -> int:
        if self.path is None:
            return self.default
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            return self.default
        if self._seen is None or self._seen[0] != mtime:
            try:
                self._seen = (mtime, int(self.path.read_text().strip()))
            except (OSError, ValueError):
                return self.default
        return self._seen[1]


def _closing(client: httpx.AsyncClient):
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return lifespan


def build_app(upstream: str, ca_cert: Path | None, max_body: int,
              max_body_file: Path | None = None) -> Starlette:
    """Return the gate's ASGI app forwarding Fleet requests to ``https://upstream``."""
    if ca_cert is None:
        client = httpx.AsyncClient(base_url=f"http://{upstream}", timeout=120.0)
    else:
        context = ssl.create_default_context(cafile=str(ca_cert))
        client = httpx.AsyncClient(base_url=f"https://{upstream}", verify=context,
                                   timeout=120.0)
    limit = _Limit(max_body, max_body_file)

    async def forward(request: Request) -> Response:
        path = request.scope.get("raw_path", b"").decode("latin-1").split("?", 1)[0]
        if request.method != "POST" or not FLEET_PATH.fullmatch(path):
            logger.warning("Refused %s %s from %s: not a Fleet API call", request.method,
                           path[:100], request.client.host if request.client else "?")
            return PlainTextResponse("Not found: this port serves Flower's Fleet API only.",
                                     status_code=404)
        bound = limit.value()
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > bound):
            logger.warning("Refused %s from %s: body of %s bytes (limit %d)", path,
                           request.client.host if request.client else "?", declared, bound)
            return PlainTextResponse(f"Request body over {bound} bytes.", status_code=413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > bound:
                logger.warning("Refused %s: body over %d bytes", path, bound)
                return PlainTextResponse(f"Request body over {bound} bytes.",
                                         status_code=413)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        try:
            answer = await client.post(path, content=bytes(body), headers=headers)
        except httpx.HTTPError as err:
            logger.warning("The SuperLink did not answer %s: %s", path, err)
            return PlainTextResponse("The federation server is unavailable.",
                                     status_code=503)
        out = {k: v for k, v in answer.headers.items()
               if k.lower() not in _HOP and k.lower() != "content-encoding"}
        return Response(answer.content, status_code=answer.status_code, headers=out)

    return Starlette(routes=[Route("/{path:path}", forward,
                                   methods=["GET", "POST", "PUT", "DELETE", "PATCH",
                                            "HEAD", "OPTIONS"])],
                     lifespan=_closing(client))


def main(argv: list[str] | None = None) -> None:
    """Serve the gate until stopped."""
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="HOST:PORT the sites dial")
    p.add_argument("--upstream", required=True, help="the SuperLink's 127.0.0.1:PORT")
    p.add_argument("--ssl-certfile", type=Path, default=None)
    p.add_argument("--ssl-keyfile", type=Path, default=None)
    p.add_argument("--ssl-ca-certfile", type=Path, default=None,
                   help="the CA the SuperLink's certificate chains to")
    p.add_argument("--max-body", type=int, default=64 << 20)
    p.add_argument("--max-body-file", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    host, _, port = args.listen.rpartition(":")
    app = build_app(args.upstream, args.ssl_ca_certfile, args.max_body, args.max_body_file)
    uvicorn.run(app, host=host.strip("[]"), port=int(port), log_level="warning",
                access_log=False, ssl_certfile=args.ssl_certfile,
                ssl_keyfile=args.ssl_keyfile)


if __name__ == "__main__":
    sys.exit(main())
