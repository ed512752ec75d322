from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from fedbn_med.checkpoint import load_tensors, save_tensors, state_hash

WRITER = """
import os, sys, torch
from fedbn_med.checkpoint import save_tensors
path = sys.argv[1]
# torch is loaded once, here; each writer is a process forked from this one, for each
# attempt number read from stdin, and it saves until it is killed. Each line goes out in
# one write: print() writes its pieces one by one, and a writer killed between two left
# half a line, which the parent's next line then joined ("1" + "1 dead").
def say(*words):
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())
for line in sys.stdin:
    attempt = line.strip()
    pid = os.fork()
    if pid == 0:
        i = 0
        while True:
            i += 1
            big = torch.full((1_000_000,), float(i))   # 4 MB: a save takes a while
            save_tensors(path, {"bn.running_mean": big,
                                "bn.num_batches_tracked": torch.tensor(i)}, {"round": i})
            say(attempt, os.getpid(), i)
    os.waitpid(pid, 0)
    say(attempt, "dead")
"""


def test_round_trip_with_metadata(tmp_path):
    tensors = {"a": torch.randn(3, 2), "n": torch.tensor(7)}
    save_tensors(tmp_path / "s.safetensors", tensors, {"round": 4, "site": "UM"})
    loaded, meta = load_tensors(tmp_path / "s.safetensors")
    assert state_hash(loaded) == state_hash(tensors)
    assert meta == {"round": 4, "site": "UM"}


def test_damaged_or_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="No checkpoint at .*nothing.safetensors"):
        load_tensors(tmp_path / "nothing.safetensors")
    path = tmp_path / "s.safetensors"
    save_tensors(path, {"a": torch.randn(100)})
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(ValueError, match=r"s.safetensors is damaged"):
        load_tensors(path)


def test_killing_a_writer_mid_save_never_leaves_a_torn_file(tmp_path):
    path = tmp_path / "site.safetensors"
    forks = subprocess.Popen([sys.executable, "-c", WRITER, str(path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert forks.stdin is not None and forks.stdout is not None
    lines: queue.Queue[list[str]] = queue.Queue()

    def read(out) -> None:  # its lines, on a thread: every wait for one is bounded
        for text in out:
            lines.put(text.split())
        lines.put([])  # its end

    reader = threading.Thread(target=read, args=(forks.stdout,), daemon=True)
    reader.start()

    def next_line() -> list[str]:
        try:
            return lines.get(timeout=60)
        except queue.Empty:
            raise AssertionError("the writer process said nothing for 60 s") from None

    writer = None  # the writer process saving now, if any
    try:
        for attempt in range(6):
            forks.stdin.write(f"{attempt}\n")
            forks.stdin.flush()
            while True:  # at least one complete save
                got = next_line()
                assert got, "the writer process ended"
                if got[0] == str(attempt):
                    break
            writer = int(got[1])
            time.sleep(0.05 * attempt)
            os.kill(writer, signal.SIGKILL)
            # until its parent has seen it die (its own last lines may come first)
            while (line := next_line()[:2]) != [str(attempt), "dead"]:
                assert line, "the writer process ended"
            writer = None
            tensors, meta = load_tensors(path)  # raises on a torn file
            i = int(tensors["bn.num_batches_tracked"])
            assert meta["round"] == i
            assert torch.equal(tensors["bn.running_mean"], torch.full((1_000_000,), float(i)))
    finally:
        if writer is not None:  # a failed check: the writer would save on forever
            try:
                os.kill(writer, signal.SIGKILL)
            except ProcessLookupError:
                pass
        forks.kill()  # it forks no more writers (and its own exit would take seconds)
        forks.wait(timeout=60)
        forks.stdin.close()
        reader.join(timeout=60)  # its pipe is at its end now
        forks.stdout.close()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != path.name]
    # a kill mid-write can leave a temporary file, never a half-written checkpoint
    assert all(name.endswith(".tmp") for name in leftovers)


def test_hash_changes_with_any_value():
    a = {"w": torch.zeros(4)}
    b = {"w": torch.zeros(4)}
    b["w"][2] = 1e-7
    assert state_hash(a) != state_hash(b)
