"""Typed events: one JSON line each, read back into the class that wrote them."""

from __future__ import annotations

import os

import pytest

from fedbn_med.federation import events

#: One event of every kind, with every field set: what the round-trip test writes.
EVERY_KIND = [
    events.ForkRequest(argv=["--superlink", "127.0.0.1:1"], log="/x/site.log",
                       env={"OMP_NUM_THREADS": "1"}),
    events.HostReady(pid=12, cuda_initialized=False),
    events.SiteForked(pid=13, cuda_initialized=False),
    events.HostRefused(reason="no such program"),
    events.SiteExited(pid=13, code=-9),
    events.NodeReady(site="NYU", node_id=123456789012, pid=13),
    events.NodeLost(site="NYU", reason="connection reset", pid=13),
    events.NodeFailed(site="NYU", reason="no server", pid=13),
    events.ServerStarted(),
    events.TrackingWarm(),
    events.TrackingReady(),
    events.Ready(sites=["NYU", "UM"]),
    events.Joined(site="NYU", node=5, resumed_round=0, private_hash="ab"),
    events.Rejoined(site="USM", node=7, resumed_round=2, private_hash="cd"),
    events.SiteError(node=9, reason="data missing"),
    events.SiteRefused(site="UM", node=8, reason="shape (N, 3)"),
    events.UpdateRefused(round=2, site="UM", reason="'w' holds NaN or Inf"),
    events.Trained(round=2, seconds=0.4, empty_polls=3, sites=["NYU"], missing=["UM"],
                   private_hashes={"NYU": "ab"}, shares={"NYU": 1.0}, norms={"NYU": 0.1}),
    events.Round(round=1, sites={"NYU": {"test_accuracy": 0.5}}),
    events.EvaluationRefused(site="UM", reason="its metric 'test_auc' (eval) is nan"),
    events.Done(table="| NYU |"),
    events.RunFailed(reason="Round 2: only 1 sites' updates were accepted"),
]


def test_the_round_trip_covers_every_kind():
    assert sorted(type(e).kind for e in EVERY_KIND) == sorted(events.kinds())


@pytest.mark.parametrize("event", EVERY_KIND, ids=lambda e: type(e).kind)
def test_every_event_survives_its_line_as_its_class(event, tmp_path):
    line = events.encode(event)
    assert line.endswith("\n") and line.count("\n") == 1
    back = events.decode(line)  # strict: every field fits the class
    assert type(back) is type(event) and back == event
    # as a reader of progress.jsonl or a pipe sees it, and as the launcher hands it on
    path = tmp_path / "progress.jsonl"
    events.append_event(path, event)
    assert events.read_events(path) == [event]
    assert events.read_events(path.read_text().splitlines()) == [event]
    assert events.decode(back.as_dict()) == event
    read_end, write_end = os.pipe()
    try:
        assert events.emit(write_end, event)
        assert events.decode(os.read(read_end, 65536)) == event
    finally:
        os.close(read_end)
        os.close(write_end)


def test_as_dict_keeps_the_progress_file_layout():
    event = events.Trained(round=3, seconds=1.0, empty_polls=0, sites=["NYU"], missing=[], t=5.0)
    assert event.as_dict() == {"event": "trained", "round": 3, "seconds": 1.0,
                               "empty_polls": 0, "sites": ["NYU"], "missing": [],
                               "private_hashes": {}, "shares": {}, "norms": {},
                               "exchanges": 1, "t": 5.0}


def test_events_of_an_older_server_still_decode():
    # a site-refused line of a server that did not name the node
    old = events.decode('{"event":"site-refused","site":"UM","reason":"r","t":1.0}')
    assert old == events.SiteRefused(site="UM", reason="r", node=None, t=1.0)
    trained = events.decode('{"event":"trained","round":1,"seconds":0.1,"empty_polls":0,'
                            '"sites":[],"missing":[],"t":1.0}')
    assert isinstance(trained, events.Trained) and trained.shares == {} == trained.norms
    assert trained.exchanges == 1  # a server before the count: one exchange a round


def test_unknown_kinds_and_newer_fields_do_not_break_a_reader():
    unknown = events.decode('{"event": "future", "x": 1, "t": 2.0}')
    assert isinstance(unknown, events.Unknown)
    assert unknown.as_dict() == {"event": "future", "x": 1, "t": 2.0}
    line = '{"event": "done", "table": "t", "extra": 1, "t": 1.0}'
    with pytest.raises(ValueError, match=r"Event 'done' has unexpected fields \['extra'\]"):
        events.decode(line)
    assert events.decode(line, strict=False).as_dict()["extra"] == 1


def test_a_line_that_is_not_an_event_is_refused_clearly():
    with pytest.raises(ValueError, match="Expected a JSON object with an 'event' name"):
        events.decode('{"pid": 3}')


def test_an_event_on_a_pipe_is_one_atomic_line_even_with_a_long_reason():
    read_end, write_end = os.pipe()
    try:
        assert events.emit(write_end, events.NodeFailed(site="UM", reason="x" * 10000, pid=1))
        data = os.read(read_end, 65536)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert len(data) <= events.PIPE_ATOMIC and data.endswith(b"\n")
    assert events.decode(data).reason.endswith("[...]")


def test_progress_events_append_to_a_file(tmp_path):
    path = tmp_path / "progress.jsonl"
    events.append_event(path, events.Ready(sites=["NYU", "UM"]))
    events.append_event(path, events.Done(table="t"))
    kinds = [e.kind for e in events.read_events(path)]
    assert kinds == ["ready", "done"]


def test_a_progress_file_reads_back_typed_and_keeps_what_it_does_not_know(tmp_path):
    path = tmp_path / "progress.jsonl"
    events.append_event(path, events.Ready(sites=["NYU"], t=1.0))
    with open(path, "a") as out:
        out.write('\n{"event": "future", "x": 1, "t": 2.0}\n')
        out.write('{"event": "done", "table": "t", "extra": 1, "t": 3.0}\n')
    read = events.read_events(path, strict=False)  # as the launcher follows a run
    assert read == [events.Ready(sites=["NYU"], t=1.0),
                    events.Unknown(name="future", fields={"x": 1}, t=2.0),
                    events.Unknown(name="done", fields={"table": "t", "extra": 1}, t=3.0)]
    with pytest.raises(ValueError, match="unexpected fields"):
        events.read_events(path)
