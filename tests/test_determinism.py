"""The same command and seed give the same numbers whatever the machine's thread count.

Each run is the real CLI in a fresh process whose ``OMP_NUM_THREADS`` (and so torch's
default thread count, and the BLAS threads of the data stack) differs: 1 or 2. The first
pair also generates its own copy of the built-in cohort and computes its own features,
so the whole path from the generator to the results table is covered.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITES = "USM,UCLA"  # the two smallest default sites: a quick cohort


def _results(tmp: Path, threads: int, data: Path, *options: str) -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "OPENBLAS_NUM_THREADS": str(threads), "FEDBN_MED_DATA": str(data),
           "FLWR_TELEMETRY_ENABLED": "0"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "abide_fedbn.py"), "--sites", SITES,
         "--rounds", "8", "--quiet", "--tracking-uri", f"sqlite:///{tmp}/mlflow.db",
         "--workdir", str(tmp / f"work-{threads}-{len(options)}"), *options],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    table = [line for line in out.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 4, out.stdout  # header, rule, one row per site
    return table


@pytest.mark.integration
def test_same_numbers_on_one_or_two_threads(tmp_path: Path) -> None:
    # Centralized trains on the pooled data, whose last batch of an epoch is small: the
    # case where a threaded matrix product splits its sums differently.
    options = ("--engine", "inprocess", "--strategy", "centralized", "--fold", "1")
    one = _results(tmp_path, 1, tmp_path / "data-1", *options)
    two = _results(tmp_path, 2, tmp_path / "data-2", *options)
    assert one == two
    # Over Flower: every site in its own process, each started with that thread count.
    flower = ("--engine", "flower", "--strategy", "fedbn")
    assert (_results(tmp_path, 1, tmp_path / "data-1", *flower)
            == _results(tmp_path, 2, tmp_path / "data-1", *flower))
