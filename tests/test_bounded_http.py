"""One pulled object is refused while it arrives, not after it was read whole.

The cap is a response hook on the connection's ``httpx.Client``; these tests serve it
bodies from an ``httpx.MockTransport`` (httpx's own in-memory transport) and count how
much of each body was read before the refusal.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from fedbn_med.federation._bounded_http import (
    FRAMING,
    ContentsRefused,
    ContentsTooLarge,
    cap_object_pulls,
)

CHUNK = 1024


class _Body(httpx.SyncByteStream):
    """A body of ``chunks`` KiB that counts the chunks read from it."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.read = 0
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.chunks):
            self.read += 1
            yield b"x" * CHUNK

    def close(self) -> None:
        self.closed = True


def _client(body: _Body, *, declare: bool, encoding: str | None = None) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("accept-encoding"))
        headers = {"content-length": str(body.chunks * CHUNK)} if declare else {}
        if encoding is not None:
            headers["content-encoding"] = encoding
        return httpx.Response(200, headers=headers, stream=body)

    seen: list[str | None] = []
    client = httpx.Client(transport=httpx.MockTransport(handler))
    client.seen = seen  # type: ignore[attr-defined]
    return client


def test_a_declared_oversize_object_is_refused_before_its_body_is_read() -> None:
    body = _Body(chunks=100)
    client = _client(body, declare=True)
    cap_object_pulls(client, 10 * CHUNK)
    with pytest.raises(ContentsTooLarge, match=f"exceed the {10 * CHUNK} bytes"):
        client.post("http://superlink/v1/fleet/pull-object", content=b"id")
    assert body.read == 0 and body.closed
    assert client.seen == ["identity"]  # type: ignore[attr-defined]  # uncompressed only


def test_an_undeclared_oversize_object_is_refused_once_past_the_cap() -> None:
    body = _Body(chunks=200)
    client = _client(body, declare=False)
    cap = int(2.5 * CHUNK)
    cap_object_pulls(client, cap)
    with pytest.raises(ContentsTooLarge):
        client.post("http://superlink/v1/runtime/pull-object", content=b"id")
    # the cap and the framing allowance read, not the whole body
    assert body.read == (cap + FRAMING) // CHUNK + 1 < body.chunks and body.closed


def test_a_compressed_object_is_refused_unread() -> None:
    """Its bytes on the wire say nothing of its size once decoded (a zip bomb)."""
    body = _Body(chunks=2)
    client = _client(body, declare=True, encoding="gzip")
    cap_object_pulls(client, 10 * CHUNK)
    with pytest.raises(ContentsRefused, match=r"came compressed \(gzip\)"):
        client.post("http://superlink/v1/fleet/pull-object", content=b"id")
    assert body.read == 0


def test_objects_within_the_cap_and_other_calls_are_read_whole() -> None:
    client = _client(_Body(chunks=4), declare=False)
    cap = cap_object_pulls(client, 4 * CHUNK)
    assert len(client.post("http://superlink/v1/fleet/pull-object").content) == 4 * CHUNK
    # an object at the bound, its framing beside it, is read (the sum is checked after)
    exact = _client(_Body(chunks=4), declare=True)
    cap_object_pulls(exact, 4 * CHUNK)
    assert len(exact.post("http://superlink/v1/fleet/pull-object").content) == 4 * CHUNK
    big = _client(_Body(chunks=50), declare=True)
    cap_object_pulls(big, CHUNK)
    # only pull-object responses are capped (a FAB, a run's config are not objects)
    assert len(big.post("http://superlink/v1/fleet/get-fab").content) == 50 * CHUNK
    # a second call sets the one hook's limit: a connection is capped anew per message
    assert cap_object_pulls(client, None) is cap and cap.limit is None
    assert len(client.event_hooks["response"]) == 1
