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

Run as ``python -P fleet_gate.py`` (a script: it imports nothing of fedbn_med).
"""

from __future__ import annotations

import argparse
import asyncio
import binascii
import ctypes
import datetime as dt
import gc
import logging
import re
import resource
import signal
import socket
import ssl
import time
from base64 import b64decode
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import h11
import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["FLEET_PATH", "GateLimits", "SIGNATURE_HEADERS", "main", "serve"]

logger = logging.getLogger("fedbn_med.gate")

#: The only paths the gate forwards: Flower's Fleet routes, nothing relative or encoded.
FLEET_PATH = re.compile(r"/v1/fleet/[a-z][a-z-]{0,63}")
#: flwr 1.42's SuperNode signature headers (``flwr.supercore.constant.FLEET_HTTP_*`` and
#: ``flwr.common.constant.TIMESTAMP_HEADER``); the gate imports no flwr, so that it starts
#: in a fraction of a second, and ``tests/test_attacks_gate.py`` pins these against flwr.
SIGNATURE_HEADERS = ("flwr-public-key", "flwr-timestamp", "flwr-signature")
#: Flower's window for a signed timestamp (``TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE``
#: seconds old at most, ``SYSTEM_TIME_TOLERANCE`` in the future at most).
TIMESTAMP_WINDOW = (5.0, 300.0 + 5.0)
_HOP = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive",
                  "upgrade", "proxy-connection", "te", "trailer"})
# Descriptors kept for the pool of connections to the SuperLink and the process itself.
_UPSTREAM_CONNECTIONS = 64
_RESERVED_FDS = _UPSTREAM_CONNECTIONS + 96


@dataclass(frozen=True)
class GateLimits:
    """What one client may take of the gate: time, connections, memory and requests."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    min_rate: int = 256 << 10
    max_connections: int = 512
    max_inflight: int = 128 << 20
    rate: float = 200.0
    burst: float = 2000.0
    refusal_rate: float = 20.0

    def connection_bound(self, fd_limit: int) -> int:
        """Return how many client connections fit under a descriptor limit."""
        return max(8, min(self.max_connections, fd_limit - _RESERVED_FDS))


class _BodyLimit:
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


class _Bucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` saved."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.stamp = burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class _Buckets:
    """One bucket per client, the least recently seen forgotten beyond ``size``."""

    def __init__(self, rate: float, burst: float, size: int = 4096) -> None:
        self.rate, self.burst, self.size = rate, burst, size
        self._buckets: OrderedDict[object, _Bucket] = OrderedDict()

    def take(self, client: object) -> bool:
        bucket = self._buckets.pop(client, None) or _Bucket(self.rate, self.burst)
        self._buckets[client] = bucket
        if len(self._buckets) > self.size:
            self._buckets.popitem(last=False)
        return bucket.take()


class _Budget:
    """Bytes of request bodies the gate holds at once."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.peak = 0
        self._freed = asyncio.Condition()

    async def acquire(self, size: int, timeout: float) -> bool:
        if size > self.total:
            return False
        async with self._freed:
            try:
                await asyncio.wait_for(
                    self._freed.wait_for(lambda: self.used + size <= self.total), timeout)
            except TimeoutError:
                return False
            self.used += size
            self.peak = max(self.peak, self.used)
            return True

    async def release(self, size: int) -> None:
        async with self._freed:
            self.used -= size
            self._freed.notify_all()


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: its allocator's own policy then
        return None


_LIBC = _libc()
# glibc serves a block of at least this many bytes by mmap and unmaps it when freed. Left
# to itself it raises that threshold to the largest block freed so far, after which
# every body buffer comes from the heap and stays there: 1.8 GB after one attack.
_MMAP_THRESHOLD = 128 << 10
_M_MMAP_THRESHOLD = -3


def _return_freed_memory() -> None:
    """Have the allocator hand freed body buffers back to the system, not keep them."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def _trim() -> None:
    # What smaller blocks left free in the heap goes back too (glibc only).
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


class _Refused(Exception):
    def __init__(self, status: int, reason: str, answer: str) -> None:
        super().__init__(reason)
        self.status, self.reason, self.answer = status, reason, answer


class _Signatures:
    """Check Flower's SuperNode signature headers; return the key that signed."""

    def __init__(self, allowed: frozenset[bytes] | None) -> None:
        self.allowed = allowed  # DER of the sites' public keys; None: any key that signs
        self._keys: OrderedDict[bytes, tuple[bytes, ec.EllipticCurvePublicKey]] = \
            OrderedDict()

    def _load(self, pem: bytes) -> tuple[bytes, ec.EllipticCurvePublicKey]:
        found = self._keys.get(pem)
        if found is None:
            key = serialization.load_pem_public_key(pem)
            if not isinstance(key, ec.EllipticCurvePublicKey):
                raise ValueError("not an EC public key")
            der = key.public_bytes(serialization.Encoding.DER,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)
            found = (der, key)
            self._keys[pem] = found
            if len(self._keys) > 1024:
                self._keys.popitem(last=False)
        return found

    def check(self, headers: dict[str, bytes]) -> bytes:
        key_header, stamp_header, sig_header = SIGNATURE_HEADERS
        if not all(h in headers for h in SIGNATURE_HEADERS):
            raise _Refused(401, "no SuperNode signature headers",
                           "Refused: this port takes only signed Flower SuperNode requests.")
        try:
            pem = b64decode(headers[key_header], validate=True)
            signature = b64decode(headers[sig_header], validate=True)
            stamp = headers[stamp_header].decode("ascii")
            age = (dt.datetime.now(dt.timezone.utc)
                   - dt.datetime.fromisoformat(stamp)).total_seconds()
            if not -TIMESTAMP_WINDOW[0] < age < TIMESTAMP_WINDOW[1]:
                raise ValueError(f"timestamp {age:.0f} s old")
            der, key = self._load(pem)
            if self.allowed is not None and der not in self.allowed:
                raise ValueError("the key is not one of the consortium's sites")
            key.verify(signature, stamp.encode("ascii"), ec.ECDSA(hashes.SHA256()))
        except (ValueError, TypeError, UnicodeError, binascii.Error, InvalidSignature) as err:
            raise _Refused(401, f"bad SuperNode signature ({err or 'invalid'})",
                           "Refused: the SuperNode signature does not verify.") from err
        return der


class _Connection:
    __slots__ = ("busy", "opened", "proven", "task")

    def __init__(self, task: asyncio.Task | None) -> None:
        self.task = task
        self.opened = time.monotonic()
        self.proven = False  # has sent a request the gate forwarded
        self.busy = False


class Gate:
    """The gate's connection handler (one per process)."""

    def __init__(self, upstream: httpx.AsyncClient, body_limit: _BodyLimit,
                 limits: GateLimits, signatures: _Signatures,
                 tls: ssl.SSLContext | None, max_connections: int) -> None:
        self.upstream = upstream
        self.body_limit = body_limit
        self.limits = limits
        self.signatures = signatures
        self.tls = tls
        self.max_connections = max_connections
        self.budget = _Budget(max(limits.max_inflight, 1))
        self.rates = _Buckets(limits.rate, limits.burst)
        self.refusals = _Buckets(limits.refusal_rate, 2 * limits.refusal_rate)
        self.open: dict[int, _Connection] = {}
        self.counts = {"forwarded": 0, "refused": 0, "evicted": 0, "timed_out": 0}
        self._closed_since_trim = 0

    async def trim(self, every: float = 1.0) -> None:
        """Hand memory freed by closed connections back to the system, once a second."""
        while True:
            await asyncio.sleep(every)
            if self._closed_since_trim and self.budget.used == 0:
                self._closed_since_trim = 0
                # A timed-out read leaves its buffers in a cycle (task, exception,
                # traceback, frame): collect them before handing the pages back.
                gc.collect()
                _trim()

    # -- connections ---------------------------------------------------------------------
    def _admit(self, conn: _Connection) -> bool:
        if len(self.open) >= self.max_connections:
            idle = [c for c in self.open.values() if not c.proven and not c.busy]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c.opened)
            self.open.pop(id(oldest), None)
            if oldest.task is not None:
                oldest.task.cancel()
            self.counts["evicted"] += 1
        self.open[id(conn)] = conn
        return True

    async def accept(self, listener: socket.socket) -> None:
        """Accept connections on ``listener`` until cancelled, one task each."""
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task] = set()
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except OSError as err:  # out of descriptors after all: let some close
                logger.warning("Could not accept a connection: %s", err)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.create_task(self.handle(sock, peer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def handle(self, sock: socket.socket, peer: object) -> None:
        """Serve one client connection until it closes, times out or is refused."""
        conn = _Connection(asyncio.current_task())
        if not self._admit(conn):
            sock.close()
            return
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        loop = asyncio.get_running_loop()
        writer: asyncio.StreamWriter | None = None
        try:
            # The handshake happens here, under the connection bound and the head's
            # deadline, not before the gate sees the connection.
            reader = asyncio.StreamReader(limit=64 << 10)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=self.tls,
                ssl_handshake_timeout=self.limits.header_timeout if self.tls else None)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await self._serve(conn, reader, writer, ip)
        except (TimeoutError, ssl.SSLError, ConnectionError, h11.ProtocolError,
                _Closed) as err:
            if isinstance(err, TimeoutError):
                self.counts["timed_out"] += 1
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.open.pop(id(conn), None)
            self._closed_since_trim += 1
            if writer is not None:
                writer.transport.abort()
            else:
                sock.close()

    async def _serve(self, conn: _Connection, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter, ip: str) -> None:
        http = h11.Connection(h11.SERVER, max_incomplete_event_size=16 << 10)
        loop = asyncio.get_running_loop()
        while True:
            deadline = loop.time() + self.limits.header_timeout
            event = await _next_event(http, reader, deadline)
            if isinstance(event, h11.ConnectionClosed):
                return
            if not isinstance(event, h11.Request):
                return
            conn.busy = True
            try:
                status, headers, body = await self._answer(http, reader, event, ip)
            except _Refused as refusal:
                self.counts["refused"] += 1
                if not self.refusals.take(ip):
                    return  # refused too often: close without a word
                logger.warning("Refused %s from %s: %s",
                               event.target[:100].decode("latin-1"), ip, refusal.reason)
                status, headers, body = (refusal.status,
                                         [(b"content-type", b"text/plain")],
                                         refusal.answer.encode())
                headers.append((b"connection", b"close"))
            else:
                conn.proven = True
            finally:
                conn.busy = False
            headers.append((b"content-length", str(len(body)).encode()))
            writer.write(http.send(h11.Response(status_code=status, headers=headers)))
            writer.write(http.send(h11.Data(data=body)))
            writer.write(http.send(h11.EndOfMessage()))
            await asyncio.wait_for(writer.drain(), self._send_time(len(body)))
            if http.our_state is not h11.DONE or http.their_state is not h11.DONE:
                return
            http.start_next_cycle()

    def _send_time(self, size: int) -> float:
        return self.limits.body_timeout + size / self.limits.min_rate

    async def _answer(self, http: h11.Connection, reader: asyncio.StreamReader,
                      request: h11.Request, ip: str
                      ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        path = request.target.decode("latin-1").split("?", 1)[0]
        if request.method != b"POST" or not FLEET_PATH.fullmatch(path):
            raise _Refused(404, f"{request.method.decode('latin-1')} is not a Fleet API call",
                           "Not found: this port serves Flower's Fleet API only.")
        headers = {k.decode("latin-1").lower(): v for k, v in request.headers}
        bound = self.body_limit.value()
        declared = headers.get("content-length", b"").decode("latin-1")
        if not declared.isdigit():
            raise _Refused(411, "no Content-Length", "A Content-Length is required.")
        size = int(declared)
        if size > bound:
            raise _Refused(413, f"body of {size} bytes (limit {bound})",
                           f"Request body over {bound} bytes.")
        key = self.signatures.check(headers)
        if not self.rates.take(key):
            raise _Refused(429, f"over {self.limits.rate:g} requests/s for its key",
                           "Too many requests.")
        # The body is held once, then copied for the SuperLink: room for both.
        need = 2 * size
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._send_time(size)
        if not await self.budget.acquire(need, self._send_time(size)):
            raise _Refused(503, f"no room for {size} more bytes in flight",
                           "The server is busy; try again.")
        try:
            body = bytearray(size)
            got = 0
            while True:
                event = await _next_event(http, reader, deadline)
                if isinstance(event, h11.Data):
                    body[got:got + len(event.data)] = event.data
                    got += len(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    raise _Closed
            payload = bytes(body)
            del body
            forward = {k: v.decode("latin-1") for k, v in headers.items() if k not in _HOP}
            try:
                answer = await self.upstream.post(path, content=payload, headers=forward)
            except httpx.HTTPError as err:
                logger.warning("The SuperLink did not answer %s: %s", path, err)
                return 503, [], b"The federation server is unavailable."
            finally:
                del payload
        finally:
            await self.budget.release(need)
        self.counts["forwarded"] += 1
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()
               if k.lower() not in _HOP and k.lower() != "content-encoding"]
        return answer.status_code, out, answer.content


class _Closed(Exception):
    """The client closed or broke the connection mid-request."""


async def _next_event(http: h11.Connection, reader: asyncio.StreamReader,
                      deadline: float) -> object:
    loop = asyncio.get_running_loop()
    while True:
        event = http.next_event()
        if event is not h11.NEED_DATA:
            return event
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise TimeoutError
        data = await asyncio.wait_for(reader.read(64 << 10), remaining)
        if not data and http.their_state is not h11.IDLE:
            raise _Closed
        http.receive_data(data)


def _fd_limit(asked: int | None = None) -> int:
    if asked is not None:  # lowered on request (a test of a host with a low limit)
        resource.setrlimit(resource.RLIMIT_NOFILE, (asked, asked))
        return asked
    # Take the hard limit where the soft one is lower: a gate is a server.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return int(soft if soft != resource.RLIM_INFINITY else 1 << 20)


def read_allowed_keys(paths: list[Path]) -> frozenset[bytes]:
    """Return the DER public keys of the sites from their OpenSSH ``.pub`` files."""
    keys = set()
    for path in paths:
        key = serialization.load_ssh_public_key(path.read_bytes())
        keys.add(key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return frozenset(keys)


async def serve(listen: str, upstream: str, *, limits: GateLimits, max_body: int,
                max_body_file: Path | None = None, allowed_keys: frozenset[bytes] | None = None,
                certfile: Path | None = None, keyfile: Path | None = None,
                ca_cert: Path | None = None, ready_file: Path | None = None,
                fd_limit: int | None = None) -> None:
    """Serve the gate on ``listen`` until cancelled, forwarding to ``upstream``."""
    pool = httpx.Limits(max_connections=_UPSTREAM_CONNECTIONS,
                        max_keepalive_connections=_UPSTREAM_CONNECTIONS)
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
    _return_freed_memory()
    bound = limits.connection_bound(_fd_limit(fd_limit))
    gate = Gate(client, _BodyLimit(max_body, max_body_file), limits,
                _Signatures(allowed_keys), tls, bound)
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
