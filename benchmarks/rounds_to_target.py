"""Communication cost: rounds FedBN and FedAvg need to reach a target mean accuracy.

For each strategy the accuracy curve is averaged over sites and runs (test folds) and
smoothed by a trailing mean over ``--window`` rounds (test sets are small, so one
lucky round should not count); the rounds to a target are the first round at which the
smoothed curve reaches it. The ratio FedAvg / FedBN above 1 means FedBN needs fewer.

    python benchmarks/rounds_to_target.py [--quick] [--targets 0.55,0.6,0.65] [--metric val]
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run FedBN and FedAvg on every fold and publish the rounds to each target."""
    parser = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=100, folds=5),
                         quick=Budget(rounds=4, folds=1))
    parser.add_argument("--targets", type=_targets, default=TARGETS,
                        help=f"target accuracies (default {','.join(map(str, TARGETS))})")
    parser.add_argument("--metric", choices=("test", "val"), default="test",
                        help="accuracy on the test or the validation split (default test)")
    parser.add_argument("--window", type=int, default=3,
                        help="rounds of the trailing mean (default 3; 1 = no smoothing)")
    bench = Benchmark(parser, argv)
    if bench.args.window < 1:
        parser.error(f"--window must be a positive integer, got {bench.args.window}")
    metric = f"{bench.args.metric}_accuracy"
    per_fold: dict[str, list[np.ndarray]] = {LABELS[s]: [] for s in STRATEGIES}
    grid = [(s, fold) for s in STRATEGIES for fold in bench.folds]
    for strategy, fold in bench.progress(grid):
        per_fold[LABELS[strategy]].append(curve(run(strategy_config(bench, strategy,
                                                                    fold=fold)), metric))
    mean_curve = {lb: smoothed(np.mean(c, axis=0), bench.args.window)
                  for lb, c in per_fold.items()}
    fold_curves = {lb: [smoothed(c, bench.args.window) for c in cs]
                   for lb, cs in per_fold.items()}

    def cell(n: int | None) -> str:
        return "not reached" if n is None else str(n)

    body, rows = [], []
    for target in bench.args.targets:
        reach = {lb: rounds_to(mean_curve[lb], target) for lb in mean_curve}
        bn, avg = reach["FedBN"], reach["FedAvg"]
        ratio = avg / bn if bn and avg else math.nan
        folds_ok = {lb: sum(rounds_to(c, target) is not None for c in fold_curves[lb])
                    for lb in fold_curves}
        body.append([f"{100 * target:g}", cell(bn), cell(avg),
                     "n/a" if math.isnan(ratio) else f"{ratio:.2f}",
                     f"{folds_ok['FedBN']}/{folds_ok['FedAvg']} of {bench.args.folds}"])
        rows.append({"target": target, "metric": metric, "rounds_fedbn": bn,
                     "rounds_fedavg": avg, "ratio_fedavg_over_fedbn": ratio,
                     "runs_reached_fedbn": folds_ok["FedBN"],
                     "runs_reached_fedavg": folds_ok["FedAvg"]})
    best = {lb: float(np.max(c)) for lb, c in mean_curve.items()}
    header = [f"target {bench.args.metric} acc (%)", "FedBN rounds", "FedAvg rounds",
              "FedAvg / FedBN", "runs reaching it alone (FedBN/FedAvg)"]
    table = (f"Rounds to a target mean {bench.args.metric} accuracy (mean over sites and "
             f"runs, trailing mean over {bench.args.window} rounds); best reached: "
             + ", ".join(f"{lb} {100 * v:.1f} %" for lb, v in best.items())
             + "\n\n" + markdown_table(header, body))

    def plot(path: Path) -> Path:
        series = {lb: (list(range(1, c.size + 1)), list(100 * c), None)
                  for lb, c in mean_curve.items()}
        return line_plot(path, series, xlabel="round",
                         ylabel=f"{bench.args.metric} accuracy (%), smoothed",
                         title="ABIDE: rounds to target (dashed: lowest target)",
                         hline=100 * min(bench.args.targets))

    bench.publish(table, rows, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
