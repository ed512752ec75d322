"""A cap on each object pulled over HTTP, enforced while its bytes arrive.

Both sides pull a message's contents object by object (:func:`._flwr_compat.pull_available`)
and add up the bytes after every few objects. One object alone could still be far larger
than the whole message may be, and an HTTP client reads a response whole before handing
it back. :func:`cap_object_pulls` puts a response hook on the connection's
``httpx.Client``: a pull-object response that declares more bytes than the cap is refused
before its body is read, and one that does not say (chunked) is refused as soon as the
bytes read pass the cap. Both raise :class:`ContentsTooLarge`, which each side already
turns into a refusal of that message. The cap is the message's byte bound plus
:data:`FRAMING` (a response holds an object and its protobuf framing; the exact bound on
contents is the sum :func:`._flwr_compat.pull_available` checks). The connection asks for
uncompressed bodies, and a compressed pull-object response is refused
(:class:`ContentsRefused`): its size on the wire says nothing of its size once decoded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

__all__ = ["ContentsRefused", "ContentsTooLarge", "ObjectCap", "cap_fab_pulls",
           "cap_object_pulls"]

#: The path every Flower pull-object call ends with (Fleet and runtime APIs alike).
PULL_OBJECT_PATH = "/pull-object"
#: The path of Flower's get-fab call: its response (the run's FAB) is capped too, at
#: :data:`fedbn_med.federation.fab.MAX_FAB_BYTES`.
GET_FAB_PATH = "/get-fab"
#: Bytes a pull-object response may hold beyond the object itself (its framing).
FRAMING = 64 * 1024


class ContentsRefused(Exception):
    """A message's contents that their receiver will not read (its message says why)."""


class ContentsTooLarge(ContentsRefused):
    """A message's contents, pulled so far, exceed the bytes its receiver accepts."""


class _CappedStream(httpx.SyncByteStream):
    """A response body that raises once more than ``cap`` bytes have come."""

    def __init__(self, stream: Any, cap: int) -> None:
        self._stream = stream
        self._cap = cap

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self._stream:
            seen += len(chunk)
            if seen > self._cap + FRAMING:
                raise ContentsTooLarge(f"its contents exceed the {self._cap} bytes")
            yield chunk

    def close(self) -> None:
        self._stream.close()


class ObjectCap:
    """The cap of one connection: ``limit`` bytes per pulled object (None: no cap)."""

    def __init__(self) -> None:
        self.limit: int | None = None

    def __call__(self, response: httpx.Response) -> None:
        from fedbn_med.federation.fab import MAX_FAB_BYTES

        path = response.request.url.path
        cap = (MAX_FAB_BYTES if path.endswith(GET_FAB_PATH)
               else self.limit if path.endswith(PULL_OBJECT_PATH) else None)
        if cap is None:
            return
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise ContentsRefused(f"its contents came compressed ({encoding}): objects are "
                                  "read uncompressed only, so that their size is known "
                                  "while they arrive")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap + FRAMING:
            raise ContentsTooLarge(f"its contents exceed the {cap} bytes")
        response.stream = _CappedStream(response.stream, cap)


def cap_fab_pulls(client: httpx.Client) -> ObjectCap:
    """Install the cap on ``client`` if it has none (its per-object limit unchanged).

    Every get-fab response is then capped at the FAB bound while it arrives.
    """
    hooks = client.event_hooks
    cap = next((h for h in hooks.get("response", []) if isinstance(h, ObjectCap)), None)
    return cap if cap is not None else cap_object_pulls(client, None)


def cap_object_pulls(client: httpx.Client, limit: int | None) -> ObjectCap:
    """Cap every pull-object response of ``client`` at ``limit`` bytes; return the cap.

    Installed once per client (a second call sets the limit of the one installed), so
    a long-lived connection can be capped anew for each message; the client asks for
    uncompressed bodies from then on.
    """
    hooks = client.event_hooks
    cap = next((h for h in hooks.get("response", []) if isinstance(h, ObjectCap)), None)
    if cap is None:
        cap = ObjectCap()
        client.event_hooks = {**hooks, "response": [*hooks.get("response", []), cap]}
        client.headers["accept-encoding"] = "identity"
    cap.limit = limit
    return cap
