"""When to ask the SuperLink for something that is expected but not there yet.

Flower's Fleet and ServerAppIo APIs are polled: a site asks for its next message, the
server asks for replies. Every empty ask is an HTTP request the SuperLink must answer on
the same cores the sites train on, and every late ask delays the round. A :class:`Pacer`
learns when the awaited thing came the last few times, sleeps through most of the wait,
asks often around the expected time, and backs off when it is late (an idle federation,
a site gone). With nothing learnt yet it backs off from its first ask.
"""

from __future__ import annotations

import time

__all__ = ["Pacer"]


class Pacer:
    """Pace the asks for one kind of awaited event.

    Parameters
    ----------
    poll : float
        Seconds between asks around the expected time.
    max_poll : float
        Longest pause between asks once the event is late.
    share : float
        The first ask comes after this share of the shortest recent wait.
    burst : float
        Seconds of asking every ``poll`` after the first ask, before backing off.
    max_first : float
        Never sleep longer than this before the first ask.
    memory : int
        How many recent waits to remember.
    """

    def __init__(self, poll: float = 0.02, max_poll: float = 0.25, share: float = 0.85,
                 burst: float = 1.0, max_first: float = 1.0, memory: int = 3) -> None:
        self.poll, self.max_poll, self.share = poll, max_poll, share
        self.burst, self.max_first, self.memory = burst, max_first, memory
        self.waits: list[float] = []
        self.since: float | None = None
        self.first_ask: float | None = None
        self.pause = poll
        self.empty = 0
        self.empty_total = 0
        #: whether the last sleep was the one through most of the expected wait
        self.headed = False

    def start(self) -> None:
        """Start the wait now (the request was sent, the reply pushed)."""
        self.since = time.monotonic()
        self.first_ask = None
        self.pause = self.poll
        self.empty = 0
        self.headed = False

    def sleep(self) -> None:
        """Nothing yet: sleep until the next ask is due."""
        now = time.monotonic()
        since = self.since
        self.headed = self.first_ask is None and since is not None and bool(self.waits)
        if self.headed and since is not None:
            head = min(self.max_first, self.share * min(self.waits))
            self.first_ask = max(now, since + head)
            pause = self.first_ask - now
        else:
            if self.first_ask is None:
                self.first_ask = now
            elif not self.waits or now - self.first_ask > self.burst:
                # Nothing learnt yet (a site's first message of a run, the server's first
                # replies): no expected time to ask often around, so back off at once.
                self.pause = min(self.max_poll, self.pause * 1.5)
            pause = self.pause
        time.sleep(pause)
        self.empty += 1
        self.empty_total += 1

    def expect_more(self) -> None:
        """Part of what is awaited came (the first of several replies): ask often now."""
        self.first_ask = time.monotonic()
        self.pause = self.poll

    def arrived(self, asked_at: float | None = None) -> int:
        """Note that the event came: remember its wait; return the empty asks before it.

        ``asked_at`` is when the ask that found it was sent (what came after, such as
        downloading it, is not part of the wait).
        """
        if self.since is not None:
            at = time.monotonic() if asked_at is None else asked_at
            wait = at - self.since
            if self.headed and self.waits:
                # found by the ask after the long sleep: it may have come long before, so
                # aim earlier next time (a few early asks cost less than a late one)
                wait *= self.share / 2
            self.waits = [*self.waits, wait][-self.memory:]
        empty = self.empty
        self.start()
        self.since = None
        return empty
