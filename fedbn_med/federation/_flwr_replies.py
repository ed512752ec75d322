"""The server's side of the door to Flower's internals: pulling the sites' replies.

flwr's ``HttpGrid.pull_messages`` downloads a reply's contents as soon as its head shows,
retrying for up to 500 times with a 1 s first back-off (about 100 s in all). A site whose
link died between its reply's head and its contents then held the round past its
timeout and kept the other replies waiting behind it. Here a reply whose contents are
still coming is handed back to the caller, which asks again at its next poll and stops
at its own deadline. The flwr internals it uses are imported, and checked, in
:mod:`._flwr_compat`, the one door to them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import httpx

from fedbn_med.federation._bounded_http import ContentsRefused, cap_object_pulls
from fedbn_med.federation._flwr_compat import (  # the door: every flwr internal comes from it
    FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE,
    SYSTEM_MESSAGE_TYPE,
    ConfirmMessageReceivedRequest,
    ContentsTooLarge,
    Error,
    ErrorCode,
    HttpGrid,
    Message,
    Metadata,
    ObjectPullError,
    PullAppMessagesRequest,
    inflate_object_from_contents,
    iterate_object_tree,
    make_message,
    make_pull_object_fn_protobuf,
    pull_available,
    set_message_id,
)

__all__ = ["InTransit", "pull_replies", "reply_bounds", "unavailable_reply"]


@dataclass
class InTransit:
    """A reply whose head the SuperLink gave, and whose contents are still coming."""

    head: Any  # the reply's head (protobuf)
    tree: Any  # its object tree
    contents: dict[str, bytes] = field(default_factory=dict)  # the objects pulled so far

    @property
    def reply_to(self) -> str:
        """Return the ID of the message this replies to."""
        return str(self.head.metadata.reply_to_message_id)


def pull_replies(grid: Any, message_ids: Iterable[str], in_transit: Iterable[InTransit] = (),
                 max_bytes: int | None = None, max_objects: int | None = None
                 ) -> tuple[list[Message], list[InTransit]]:
    """Pull the replies to ``message_ids`` that have arrived, without waiting for any.

    Returns the whole replies, and those whose contents are not all uploaded yet: pass
    these back as ``in_transit`` at the next call, which pulls what has come of them since
    (each object once). A reply whose head arrived is never awaited here: flwr's own
    ``HttpGrid.pull_messages`` retries its contents for up to 500 times with a 1 s first
    back-off, so that a site whose link died between its reply's head and contents held
    the round for about 100 s, past its timeout, and kept every other reply waiting
    behind it. The caller decides how long to wait (:func:`unavailable_reply` once it
    stops). A reply whose contents the SuperLink does not have is an error reply, and
    a payload too large for the SuperLink gives no replies, as in flwr. A grid of
    another kind (simulation) is asked the ordinary way.

    A reply comes from a site, so it is bounded before it is read: one whose object tree
    names more than ``max_objects`` objects is an error reply without a byte pulled, and
    one whose contents pulled so far exceed ``max_bytes`` is an error reply from then on.
    """
    message_ids = list(message_ids)
    if not isinstance(grid, HttpGrid):
        return list(grid.pull_messages(message_ids)), list(in_transit)
    client = grid._runtime_client  # noqa: SLF001 - the grid's own connection
    waiting = list(in_transit)
    if message_ids:
        try:
            response = client.PullMessages(PullAppMessagesRequest(message_ids=message_ids))
        except httpx.HTTPStatusError as err:
            if err.response.status_code != 413:
                raise
        else:
            waiting += [InTransit(head, tree) for head, tree in
                        zip(response.messages_list, response.message_object_trees, strict=True)]
    replies: list[Message] = []
    still: list[InTransit] = []
    for item in waiting:
        try:
            if max_objects is not None and not item.contents:
                count = sum(1 for _ in iterate_object_tree(item.tree))
                if count > max_objects:
                    raise ObjectPullError(item.head.metadata.message_id,
                                          f"it names {count} objects, more than the "
                                          f"{max_objects} a reply may hold")
            message = _pull_contents(grid, item, max_bytes)
        except ObjectPullError as err:
            replies.append(unavailable_reply(grid, item, str(err)))
            continue
        if message is None:
            still.append(item)
        else:
            replies.append(message)
    return replies, still


def _pull_contents(grid: Any, item: InTransit, max_bytes: int | None = None
                   ) -> Message | None:
    """Pull what is missing of a reply; return it whole, or None while objects are missing.

    Raises
    ------
    ObjectPullError
        When the SuperLink does not have an object, or the contents exceed ``max_bytes``.
    """
    client = grid._runtime_client  # noqa: SLF001
    cap_object_pulls(client._client, max_bytes)  # noqa: SLF001 - refused while it arrives
    run_id = grid.run.run_id
    pull = make_pull_object_fn_protobuf(client.PullObject, grid.node, run_id)
    object_ids = list(dict.fromkeys(t.object_id for t in iterate_object_tree(item.tree)))
    try:
        if not pull_available(pull, object_ids, item.contents, max_bytes):
            return None  # the rest comes at a later call
    except ContentsRefused as err:
        item.contents.clear()
        bound = " a reply may hold" * isinstance(err, ContentsTooLarge)
        raise ObjectPullError(item.head.metadata.message_id, f"{err}{bound}") from None
    message_id = item.head.metadata.message_id
    client.ConfirmMessageReceived(ConfirmMessageReceivedRequest(
        node=grid.node, run_id=run_id, message_object_id=message_id))
    message = cast(Message, inflate_object_from_contents(message_id, item.contents))
    set_message_id(message, message_id)
    return message


def reply_bounds(tensor_bytes: Iterable[int]) -> tuple[int, int]:
    """Return the most bytes and objects a reply carrying these tensors, twice, may hold.

    Twice: a SCAFFOLD reply carries a control variate per weight. Each tensor is one
    array object plus its chunks of at most flwr's chunk size; 1 MiB and 256 objects
    more hold the reply's records, metrics and scores.
    """
    sizes = list(tensor_bytes)
    chunk = max(1, int(FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE))
    objects = sum(1 + max(1, -(-size // chunk)) for size in sizes)
    return 2 * sum(sizes) + (1 << 20), 2 * objects + 256


def unavailable_reply(grid: Any, item: InTransit, why: str) -> Message:
    """Return an error reply, from the site that sent ``item``, saying its contents failed."""
    run_id = grid.run.run_id
    return make_message(
        metadata=Metadata(run_id=run_id, message_id="",
                          src_node_id=int(item.head.metadata.src_node_id),
                          dst_node_id=grid.node.node_id, message_type=SYSTEM_MESSAGE_TYPE,
                          group_id="", ttl=0, reply_to_message_id=item.reply_to,
                          created_at=time.time()),
        error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE,
                    reason=f"the reply's contents are unavailable: {why}"))
