"""Send a round's messages and collect the replies, asking the SuperLink at the right times."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from fedbn_med.federation._flwr_replies import InTransit, pull_replies, unavailable_reply
from fedbn_med.federation.pacing import Pacer

__all__ = ["FastGrid"]


class FastGrid:
    """Send messages and collect their replies, asking for them at the right times.

    Flower's own ``send_and_receive`` looks for replies every 3 s, which would dominate a
    round whose compute takes a fraction of a second. Here a :class:`Pacer` per message
    type learns when replies came in earlier rounds: the first ask comes shortly before
    the first reply is due, then asks come every ``poll`` seconds while replies are
    expected, backing off to ``max_poll`` when they are late. A reply that shows before
    its contents are uploaded is asked for again at the next poll with the others
    (:func:`fedbn_med.federation._flwr_replies.pull_replies`), not awaited on its own with
    flwr's 1 s first back-off; one whose contents have not all come by the deadline is an
    error reply of its site.
    """

    def __init__(self, grid: Grid, poll: float = 0.02, max_poll: float = 0.2) -> None:
        self.grid = grid
        #: the most bytes and objects a reply may hold (None: unbounded), set by the server
        #: once it knows the model: a site's reply is refused before it is read beyond them
        self.max_reply_bytes: int | None = None
        self.max_reply_objects: int | None = None
        self.poll = poll
        self.max_poll = max_poll
        self.pacers: dict[str, Pacer] = {}
        self.empty_polls = 0
        self.exchanges = 0  # pushes of messages whose replies were awaited, so far

    def node_ids(self) -> list[int]:
        """Return the IDs of the nodes connected now."""
        return list(self.grid.get_node_ids())

    def send(self, messages: Iterable[Message], timeout: float,
             until: Callable[[list[Message]], bool] | None = None,
             pace: str | None = None) -> list[Message]:
        """Push messages and return the replies that arrive within ``timeout`` seconds.

        ``until``, given the replies so far, may end the wait before every reply is in.
        ``pace`` names the timing to learn (default: the message type), for exchanges of
        one type whose replies take very different times (the stages of SecAgg+).
        """
        messages = list(messages)
        kind = pace or (messages[0].metadata.message_type if messages else "")
        pacer = self.pacers.setdefault(kind, Pacer(poll=self.poll, max_poll=self.max_poll,
                                                   share=0.8))
        deadline = time.monotonic() + timeout
        pending = {i for i in self.grid.push_messages(messages) if i}
        self.exchanges += 1
        pacer.start()
        replies: list[Message] = []
        in_transit: list[InTransit] = []  # heads come, contents still uploading
        while (pending or in_transit) and time.monotonic() < deadline:
            asked_at = time.monotonic()
            got, in_transit = pull_replies(self.grid, pending, in_transit,
                                           max_bytes=self.max_reply_bytes,
                                           max_objects=self.max_reply_objects)
            replies.extend(got)
            pending -= {m.metadata.reply_to_message_id for m in got}
            pending -= {item.reply_to for item in in_transit}
            if got and len(replies) == len(got):
                pacer.arrived(asked_at)  # learn when the first reply comes
                pacer.expect_more()
            if got and until is not None and not in_transit and until(replies):
                break
            if pending or in_transit:
                pacer.sleep()
        # the deadline: a reply whose contents have not all come is a failure of its site
        replies.extend(unavailable_reply(self.grid, item, f"not all uploaded within {timeout:g} s")
                       for item in in_transit)
        self.empty_polls = sum(p.empty_total for p in self.pacers.values())
        return replies
