"""The launcher's parts without Flower: the supervisor, the progress tail, the gate's imports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from fedbn_med.federation.events import Done, Event, Trained, append_event
from fedbn_med.federation.launcher import FederationError, free_port
from fedbn_med.federation.launcher.progress import ProgressTail, SubmittedRun, follow
from fedbn_med.federation.launcher.supervisor import Supervisor

SERVER = ("import os, socket, sys, time; s = socket.create_server(('127.0.0.1', {port})); "
          "print('serving', os.environ.get('MARK'), flush=True); time.sleep(600)")


def test_spawn_under_a_prefix_wait_for_the_port_tail_the_log_and_stop(tmp_path):
    sup = Supervisor(tmp_path, dict(os.environ))
    port = free_port()
    try:
        proc = sup.spawn("srv", [sys.executable, "-c", SERVER.format(port=port)],
                         prefix=["env", "MARK=prefixed"])
        sup.wait_for_port("srv", "127.0.0.1", port, timeout=30, prefix=["env"])
        assert sup.running("srv") and os.getsid(proc.pid) == proc.pid
        deadline = time.monotonic() + 10
        while "serving" not in sup.log_tail("srv") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.log_tail("srv") == "serving prefixed"

        dead = sup.spawn("dead", [sys.executable, "-c", "print('no luck'); raise SystemExit(3)"])
        with pytest.raises(FederationError, match=r"^The thing exited at start-up:\nno luck$"):
            sup.wait_for_port("dead", "127.0.0.1", free_port(), timeout=30, what="The thing")
        assert dead.poll() == 3
        with pytest.raises(FederationError, match="did not listen on 127.0.0.1:.* within 1 s"):
            sup.wait_for_port("srv", "127.0.0.1", free_port(), timeout=1)
    finally:
        sup.close()
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"
    assert sup.processes == {}


def test_the_tail_reads_only_what_was_appended_and_whole_lines(tmp_path):
    path = tmp_path / "progress.jsonl"
    tail = ProgressTail(path)
    assert tail.lines() == []  # no file yet
    path.write_bytes(b'{"a": 1}\n{"b"')
    assert tail.lines() == ['{"a": 1}']
    assert tail.lines() == []
    with open(path, "ab") as out:
        out.write(b': 2}\n')
    assert tail.lines() == ['{"b": 2}']
    assert tail.offset == path.stat().st_size
    path.unlink()  # replaced by a new file: read from its start
    path.write_bytes(b'{"c": 3}\n')
    assert tail.lines() == ['{"c": 3}']
    tail.close()

    started = ProgressTail(path, offset=path.stat().st_size)  # an earlier run's lines
    with open(path, "ab") as out:
        out.write(b'{"d": 4}\n')
    assert started.lines() == ['{"d": 4}']
    started.close()


def test_follow_hands_on_every_event_written_before_the_run_ends(tmp_path):
    # an earlier run's end, before this run's offset: not taken for this run's
    earlier = {"event": "done", "table": "", "t": 0.0}
    (tmp_path / "progress.jsonl").write_text(json.dumps(earlier) + "\n")
    offset = (tmp_path / "progress.jsonl").stat().st_size
    writer = ("import sys, time\n"
              "from pathlib import Path\n"
              "from fedbn_med.federation.events import Done, Trained, append_event\n"
              "path = Path(sys.argv[1])\n"
              "for r in (1, 2, 3):\n"
              "    append_event(path, Trained(round=r, seconds=0.1, empty_polls=0,\n"
              "                               sites=['A'], missing=[]))\n"
              "    time.sleep(0.2)\n"
              "(path.parent / 'results.json').write_text('{\"rounds\": 3}')\n"
              "append_event(path, Done(table=''))\n")
    proc = subprocess.Popen([sys.executable, "-c", writer, str(tmp_path / "progress.jsonl")])
    run = SubmittedRun(proc=proc, name="run-1", results_dir=tmp_path, progress_from=offset,
                       submitted=time.time())
    events: list[Event] = []
    assert follow(run, on_event=events.append, timeout=60) == {"rounds": 3}
    assert [type(e) for e in events] == [Trained] * 3 + [Done]
    assert [e.round for e in events if isinstance(e, Trained)] == [1, 2, 3]

    # a run that ended without Done failed, and says why from its log
    append_event(tmp_path / "progress.jsonl",
                 Trained(round=4, seconds=0.1, empty_polls=0, sites=["A"], missing=[]))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=60)
    late = SubmittedRun(proc=ended, name="run-2", results_dir=tmp_path,
                        progress_from=(tmp_path / "progress.jsonl").stat().st_size,
                        submitted=time.time() + 10)
    with pytest.raises(FederationError, match="failed on the server:\nthe log's end"):
        follow(late, log_tail=lambda name, lines: "the log's end")


def test_follow_until_done_ends_at_the_servers_done_not_at_flwr_runs_exit(tmp_path):
    # the server's Done comes 0.1 s in; the ``flwr run`` process lingers 30 s more
    writer = ("import sys, time\n"
              "from pathlib import Path\n"
              "from fedbn_med.federation.events import Done, append_event\n"
              "path = Path(sys.argv[1])\n"
              "time.sleep(0.1)\n"
              "(path.parent / 'results.json').write_text('{\"rounds\": 1}')\n"
              "append_event(path, Done(table=''))\n"
              "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", writer, str(tmp_path / "progress.jsonl")])
    try:
        run = SubmittedRun(proc=proc, name="run-1", results_dir=tmp_path, progress_from=0,
                           submitted=time.time())
        started = time.monotonic()
        assert follow(run, timeout=60, until_done=True) == {"rounds": 1}
        assert time.monotonic() - started < 15 and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_stopping_a_tree_does_not_wait_on_ended_grandchildren():
    # a child whose own child ends at SIGTERM with it: both are zombies at once, the
    # grandchild until its parent is reaped; the stop returns without waiting for that
    from fedbn_med.federation.launcher.watchdog import family, stop_all

    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(family(parent.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = family(parent.pid)
    assert len(members) == 2
    started = time.monotonic()
    stop_all(members, signal.SIGTERM, 5.0)
    assert time.monotonic() - started < 1.0
    parent.wait(timeout=5)
    assert not [p for p in members[1:] if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]


def test_the_gate_starts_without_the_training_stack():
    code = ("import sys; import fedbn_med.federation.launcher.fleet_gate; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'flwr') "
            "or m in ('fedbn_med.spec', 'fedbn_med.federation.launcher.federation')))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"
