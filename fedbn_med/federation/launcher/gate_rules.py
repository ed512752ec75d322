"""What the public port lets through, and how much of the host a client may take.

The rules of :mod:`fedbn_med.federation.launcher.fleet_gate`: the only paths it forwards
(:data:`FLEET_PATH`), Flower's SuperNode signatures (:class:`Signatures`), a token bucket
per key and per address (:class:`Buckets`), the body limit (:class:`BodyLimit`), the
bytes of bodies held at once (:class:`Budget`), and what the process takes of the system
(descriptors, memory the allocator keeps). A request a rule refuses raises
:class:`Refused`. Like the gate, this module imports nothing of fedbn_med.
"""

from __future__ import annotations

import asyncio
import binascii
import ctypes
import datetime as dt
import re
import resource
import time
from base64 import b64decode
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["FLEET_PATH", "SIGNATURE_HEADERS", "TIMESTAMP_WINDOW", "BodyLimit", "Budget",
           "Buckets", "GateLimits", "Refused", "Signatures", "UPSTREAM_CONNECTIONS",
           "read_allowed_keys", "return_freed_memory", "set_fd_limit",
           "trim_heap"]


#: The only paths the gate forwards: Flower's Fleet routes, nothing relative or encoded.
FLEET_PATH = re.compile(r"/v1/fleet/[a-z][a-z-]{0,63}")
#: flwr 1.42's SuperNode signature headers (``flwr.supercore.constant.FLEET_HTTP_*`` and
#: ``flwr.common.constant.TIMESTAMP_HEADER``); the gate imports no flwr, so that it starts
#: in a fraction of a second, and ``tests/test_attacks_gate.py`` pins these against flwr.
SIGNATURE_HEADERS = ("flwr-public-key", "flwr-timestamp", "flwr-signature")
#: Flower's window for a signed timestamp (``TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE``
#: seconds old at most, ``SYSTEM_TIME_TOLERANCE`` in the future at most).
TIMESTAMP_WINDOW = (5.0, 300.0 + 5.0)
# Descriptors kept for the pool of connections to the SuperLink and the process itself.
UPSTREAM_CONNECTIONS = 64
_RESERVED_FDS = UPSTREAM_CONNECTIONS + 96


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


class BodyLimit:
    """The body limit: a fixed number, or the one the ServerApp wrote to a file."""

    def __init__(self, default: int, path: Path | None) -> None:
        self.default = default
        self.path = path
        self._seen: tuple[float, int] | None = None

    def value(self) -> int:
        """Return the limit in bytes now (the file's number once it holds one)."""
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


class Buckets:
    """One bucket per client, the least recently seen forgotten beyond ``size``."""

    def __init__(self, rate: float, burst: float, size: int = 4096) -> None:
        self.rate, self.burst, self.size = rate, burst, size
        self._buckets: OrderedDict[object, _Bucket] = OrderedDict()

    def take(self, client: object) -> bool:
        """Take a token from ``client``'s bucket; return False when it has none left."""
        bucket = self._buckets.pop(client, None) or _Bucket(self.rate, self.burst)
        self._buckets[client] = bucket
        if len(self._buckets) > self.size:
            self._buckets.popitem(last=False)
        return bucket.take()


class Budget:
    """Bytes of request bodies the gate holds at once."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.peak = 0
        self._freed = asyncio.Condition()

    async def acquire(self, size: int, timeout: float) -> bool:
        """Reserve ``size`` bytes, waiting up to ``timeout`` s; return whether it got them."""
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
        """Give back ``size`` bytes reserved by :meth:`acquire`."""
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


def return_freed_memory() -> None:
    """Have the allocator hand freed body buffers back to the system, not keep them."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def trim_heap() -> None:
    """Hand what smaller blocks left free in the heap back to the system (glibc only)."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)

class Refused(Exception):
    """A request the gate answers itself: its HTTP status, the reason logged, the answer."""

    def __init__(self, status: int, reason: str, answer: str) -> None:
        super().__init__(reason)
        self.status, self.reason, self.answer = status, reason, answer


class Signatures:
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
        """Return the DER key that signed the request; raise :class:`Refused` otherwise."""
        key_header, stamp_header, sig_header = SIGNATURE_HEADERS
        if not all(h in headers for h in SIGNATURE_HEADERS):
            raise Refused(401, "no SuperNode signature headers",
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
            raise Refused(401, f"bad SuperNode signature ({err or 'invalid'})",
                          "Refused: the SuperNode signature does not verify.") from err
        return der


def set_fd_limit(asked: int | None = None) -> int:
    """Set this process's descriptor limit: ``asked``, else the hard limit; return it."""
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
