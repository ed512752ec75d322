from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from fedbn_med.checkpoint import load_tensors, save_tensors, state_hash

WRITER = """
import sys, torch
from fedbn_med.checkpoint import save_tensors
path = sys.argv[1]
i = 0
while True:
    i += 1
    big = torch.full((1_000_000,), float(i))   # 4 MB: a save takes a while
    save_tensors(path, {"bn.running_mean": big, "bn.num_batches_tracked": torch.tensor(i)},
                 {"round": i})
    print(i, flush=True)
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
    for attempt in range(6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()  # at least one complete save
        time.sleep(0.05 * attempt)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        tensors, meta = load_tensors(path)  # raises on a torn file
        i = int(tensors["bn.num_batches_tracked"])
        assert meta["round"] == i
        assert torch.equal(tensors["bn.running_mean"], torch.full((1_000_000,), float(i)))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != path.name]
    # a kill mid-write can leave a temporary file, never a half-written checkpoint
    assert all(name.endswith(".tmp") for name in leftovers)


def test_hash_changes_with_any_value():
    a = {"w": torch.zeros(4)}
    b = {"w": torch.zeros(4)}
    b["w"][2] = 1e-7
    assert state_hash(a) != state_hash(b)
