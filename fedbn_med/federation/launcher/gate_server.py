"""The gate's connections: each served under the rules of :mod:`.gate_rules`.

:class:`Gate` accepts client connections, bounds each in time (handshake, request head,
body), in number (the oldest connection that never sent an accepted request makes room
for a new one) and in memory, applies the rules to every request, and forwards what
passes to the SuperLink. See :mod:`fedbn_med.federation.launcher.fleet_gate`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import ssl
import time

import h11
import httpx

from fedbn_med.federation.launcher.gate_rules import (
    FLEET_PATH,
    BodyLimit,
    Buckets,
    Budget,
    GateLimits,
    Refused,
    Signatures,
    trim_heap,
)

__all__ = ["Gate"]

logger = logging.getLogger("fedbn_med.gate")

_HOP = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive",
                  "upgrade", "proxy-connection", "te", "trailer"})


class _Connection:
    __slots__ = ("busy", "opened", "proven", "task")

    def __init__(self, task: asyncio.Task | None) -> None:
        self.task = task
        self.opened = time.monotonic()
        self.proven = False  # has sent a request the gate forwarded
        self.busy = False


class Gate:
    """The gate's connection handler (one per process)."""

    def __init__(self, upstream: httpx.AsyncClient, body_limit: BodyLimit,
                 limits: GateLimits, signatures: Signatures,
                 tls: ssl.SSLContext | None, max_connections: int) -> None:
        self.upstream = upstream
        self.body_limit = body_limit
        self.limits = limits
        self.signatures = signatures
        self.tls = tls
        self.max_connections = max_connections
        self.budget = Budget(max(limits.max_inflight, 1))
        self.rates = Buckets(limits.rate, limits.burst)
        self.refusals = Buckets(limits.refusal_rate, 2 * limits.refusal_rate)
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
                trim_heap()

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
            except Refused as refusal:
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
            raise Refused(404, f"{request.method.decode('latin-1')} is not a Fleet API call",
                          "Not found: this port serves Flower's Fleet API only.")
        headers = {k.decode("latin-1").lower(): v for k, v in request.headers}
        bound = self.body_limit.value()
        declared = headers.get("content-length", b"").decode("latin-1")
        if not declared.isdigit():
            raise Refused(411, "no Content-Length", "A Content-Length is required.")
        size = int(declared)
        if size > bound:
            raise Refused(413, f"body of {size} bytes (limit {bound})",
                          f"Request body over {bound} bytes.")
        key = self.signatures.check(headers)
        if not self.rates.take(key):
            raise Refused(429, f"over {self.limits.rate:g} requests/s for its key",
                          "Too many requests.")
        # The body is held once, then copied for the SuperLink: room for both.
        need = 2 * size
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._send_time(size)
        if not await self.budget.acquire(need, self._send_time(size)):
            raise Refused(503, f"no room for {size} more bytes in flight",
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
