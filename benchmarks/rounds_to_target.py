"""Communication cost: rounds FedBN and FedAvg need to reach a target mean accuracy.

Every (fold, seed) cell trains both strategies. In each run the accuracy curve (mean
over sites) is smoothed by a trailing mean over ``--window`` rounds (test sets are
small, so one lucky round should not count); its rounds to a target are the first round
at which the smoothed curve reaches it. Per target the table gives how many cells reach
it, the mean rounds [95 % CI] over the cells that do, and the paired difference FedAvg -
FedBN over the cells where both do (above 0: FedBN needs fewer rounds), with the share of
rounds saved.

    python benchmarks/rounds_to_target.py [--quick] [--targets 0.55,0.6,0.65,0.7]
                                          [--metric val] [--window 5] [--seeds S]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import (
    LABELS,
    Benchmark,
    Budget,
    curve,
    float_list,
    line_plot,
    make_parser,
    markdown_table,
    run,
    strategy_config,
)

from fedbn_med.protocol import format_interval, interval

NAME = "rounds_to_target"
STRATEGIES = ("fedbn", "fedavg")
TARGETS = (0.55, 0.6, 0.65, 0.7)


def _targets(text: str) -> tuple[float, ...]:
    values = float_list(text)
    if not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected accuracies in (0, 1] such as 0.6,0.65, "
                                         f"got {text!r}")
    return values


def smoothed(values: np.ndarray, window: int) -> np.ndarray:
    """Return the trailing mean over ``window`` rounds (shorter at the start)."""
    cumsum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, values.size + 1)
    lo = np.maximum(idx - window, 0)
    return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def rounds_to(values: np.ndarray, target: float) -> int | None:
    """Return the first round (1-based) at which ``values`` reaches ``target``, or None."""
    hits = np.flatnonzero(values >= target - 1e-12)
    return int(hits[0]) + 1 if hits.size else None


def _mean_ci(values: list[float]) -> str:
    return format_interval(values, scale=1.0) if values else "none"


def main(argv: Sequence[str] | None = None) -> int:
    """Run FedBN and FedAvg on every cell and publish the rounds to each target."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=200, folds=5, seeds=3),
                         quick=Budget(rounds=4, folds=1, seeds=1))
    parser.add_argument("--targets", type=_targets, default=TARGETS,
                        help=f"target accuracies (default {','.join(map(str, TARGETS))})")
    parser.add_argument("--metric", choices=("test", "val"), default="test",
                        help="accuracy on the test or the validation split (default test)")
    parser.add_argument("--window", type=int, default=5,
                        help="rounds of the trailing mean (default 5; 1 = no smoothing)")
    bench = Benchmark(parser, argv)
    if bench.args.window < 1:
        parser.error(f"--window must be a positive integer, got {bench.args.window}")
    metric = f"{bench.args.metric}_accuracy"
    per_cell: dict[str, list[np.ndarray]] = {LABELS[s]: [] for s in STRATEGIES}
    grid = [(s, fold, seed) for s in STRATEGIES for fold, seed in bench.cells]
    for strategy, fold, seed in bench.progress(grid):
        history = run(strategy_config(bench, strategy, fold=fold, seed=seed))
        per_cell[LABELS[strategy]].append(smoothed(curve(history, metric), bench.args.window))
    n_cells = len(bench.cells)

    body, rows = [], []
    for target in bench.args.targets:
        reach = {lb: [rounds_to(c, target) for c in cs] for lb, cs in per_cell.items()}
        bn = [float(r) for r in reach["FedBN"] if r is not None]
        avg = [float(r) for r in reach["FedAvg"] if r is not None]
        both = [(a, b) for a, b in zip(reach["FedAvg"], reach["FedBN"])
                if a is not None and b is not None]
        diff = [float(a - b) for a, b in both]
        saved = (100 * np.mean(diff) / np.mean([a for a, _ in both])) if both else math.nan
        body.append([f"{100 * target:g}", _mean_ci(bn), _mean_ci(avg),
                     _mean_ci(diff), "n/a" if math.isnan(saved) else f"{saved:+.0f} %",
                     f"{len(bn)}/{len(avg)}/{len(both)} of {n_cells}"])
        mean, low, high = interval(diff) if diff else (math.nan,) * 3
        rows.append({"target": target, "metric": metric,
                     "rounds_fedbn_mean": np.mean(bn) if bn else math.nan,
                     "rounds_fedavg_mean": np.mean(avg) if avg else math.nan,
                     "fedavg_minus_fedbn": mean, "ci_low": low, "ci_high": high,
                     "cells_fedbn": len(bn), "cells_fedavg": len(avg),
                     "cells_both": len(both)})
    mean_curve = {lb: np.mean(cs, axis=0) for lb, cs in per_cell.items()}
    best = {lb: float(np.max(c)) for lb, c in mean_curve.items()}
    header = [f"target {bench.args.metric} acc (%)", "FedBN rounds", "FedAvg rounds",
              "FedAvg - FedBN (rounds, paired)", "rounds saved by FedBN",
              "cells reaching (FedBN/FedAvg/both)"]
    table = (f"Rounds to a target mean {bench.args.metric} accuracy in each cell (trailing "
             f"mean over {bench.args.window} rounds), mean [95 % CI] over the cells that "
             f"reach it; best of the mean curve: "
             + ", ".join(f"{lb} {100 * v:.1f} %" for lb, v in best.items())
             + "\n\n" + markdown_table(header, body))

    def plot(path: Path) -> Path:
        series = {lb: (list(range(1, c.size + 1)), list(100 * c), None)
                  for lb, c in mean_curve.items()}
        return line_plot(path, series, xlabel="round",
                         ylabel=f"{bench.args.metric} accuracy (%), smoothed, mean of cells",
                         title="ABIDE: rounds to target (dashed: lowest target)",
                         hline=100 * min(bench.args.targets))

    bench.publish(table, rows, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
