"""The pacer that times asks to the SuperLink learns when replies come, earlier when unsure."""

from __future__ import annotations

import time

from fedbn_med.federation.pacing import Pacer


def _wait_once(pacer: Pacer, ready_after: float) -> float:
    """Ask as the server's and the sites' loops do until the thing is there; return when."""
    pacer.start()
    started = time.monotonic()
    while True:
        asked_at = time.monotonic()
        if asked_at - started >= ready_after:
            pacer.arrived(asked_at)
            return asked_at - started
        pacer.sleep()


def test_a_reply_found_by_the_first_paced_ask_moves_the_next_ask_earlier() -> None:
    pacer = Pacer(poll=0.005, max_poll=0.02, share=0.8)
    pacer.waits = [0.3]  # learned earlier: replies came after 0.3 s
    found = _wait_once(pacer, ready_after=0.05)  # it came early, unasked till later
    assert found >= 0.8 * 0.3 - 0.01  # the loop slept through the expected wait
    # found by the ask after the long sleep: the next first ask comes well before
    assert pacer.waits[-1] < 0.5 * found
    assert 0.8 * min(pacer.waits) < 0.15


def test_a_reply_that_needed_more_asks_is_remembered_as_it_came() -> None:
    pacer = Pacer(poll=0.005, max_poll=0.02, share=0.8)
    pacer.waits = [0.05]
    found = _wait_once(pacer, ready_after=0.15)
    assert abs(pacer.waits[-1] - found) < 0.005
    assert 0.15 <= found < 0.25


def test_with_nothing_learnt_the_asks_back_off_from_the_first() -> None:
    # A site waiting for the first message of a run has no expected time: a burst of
    # asks every `poll` for `burst` seconds would be empty requests to the SuperLink.
    pacer = Pacer(poll=0.005, max_poll=0.04, burst=1.0)
    pacer.start()
    asks = 0
    started = time.monotonic()
    while time.monotonic() - started < 0.3:
        pacer.sleep()
        asks += 1
    # a burst would have asked about 60 times; backing off from 5 ms to 40 ms, about 12
    assert asks < 20, asks
    assert pacer.pause == 0.04
    pacer.arrived()
    assert len(pacer.waits) == 1  # learnt now: the next wait asks often around it
