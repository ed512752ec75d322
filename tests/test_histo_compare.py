"""benchmarks/histo_compare.py --quick: the comparison's protocol end to end, on generated tiles."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_quick_comparison_selects_by_validation_and_pairs_cells(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "histo_compare.py"),
                           "--quick", "--out", str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with (tmp_path / "runs.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    # 2 methods x 2 seeds (each re-drawing the splits) x 4 generated sites
    assert len(rows) == 16
    assert {r["method"] for r in rows} == {"fedbn", "fedavg"}
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert all(r["selected_round"] == "1" and 0.0 <= float(r["test_dice"]) <= 1.0
               for r in rows)
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "Sites by rule: **datalist**" in summary
    fedavg = next(line for line in summary.splitlines() if line.startswith("| fedavg |"))
    assert fedavg.count("[") == 1  # FedBN minus FedAvg, with its corrected interval
