"""Communication cost: rounds FedBN and FedAvg need to reach a target validation score.

Every (fold, repetition) cell trains both strategies. In each run the validation curve
(mean over sites of the validation balanced accuracy, or ``--metric``) is smoothed by a trailing
mean over ``--window`` rounds (validation sets are small, so one lucky round should not
count; no round before the first full window counts); its rounds to a target are the
first round at which the smoothed curve reaches it. No test split is looked at. A run
that never reaches the target is censored at the last round: it counts, as "not
reached by round R", never as missing. Per target the table gives the cells reaching
it, each strategy's restricted mean rounds (censored runs counted as R, so it is a
lower bound where any are censored) with its interval, the paired difference FedAvg -
FedBN of those (above 0: FedBN needs fewer rounds) with the corrected resampled-t
interval, and the Kaplan-Meier median rounds. The caption gives the reference rows'
score on the same validation subjects (majority class, motion alone): a target they
reach says nothing of what federated training learnt. Balanced accuracy is the default
because the majority class scores 50 % on it at every site; on accuracy it scores the
site's majority rate (54 % on shared sites A), and the lowest target (55 %) was within
one round of it.

    python benchmarks/research/rounds_to_target.py [--quick] [--targets 0.55,0.6,0.65,0.7]
                                          [--metric balanced_accuracy] [--window 5]
                                          [--seeds S]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
import numpy as np
from _common import (
    LABELS,
    N_FOLDS,
    Benchmark,
    Budget,
    curve,
    float_list,
    make_parser,
    markdown_table,
    strategy_config,
)
from _plots import line_plot
from _sweep import reference_caption, run_grid

from fedbn_med.evaluation.intervals import corrected_t_interval
from fedbn_med.evaluation.pairing import paired_differences
from fedbn_med.evaluation.tables import format_stats

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
    """Return the trailing mean over ``window`` rounds; NaN until a full window has run.

    NaN before round ``window``: a mean over fewer rounds (round 1 alone, at the start)
    would let one lucky round count, which the window is there to prevent.
    """
    values = np.asarray(values, dtype=np.float64)
    cumsum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, values.size + 1)
    lo = np.maximum(idx - window, 0)
    out = (cumsum[idx] - cumsum[lo]) / (idx - lo)
    out[idx < window] = np.nan
    return out


def rounds_to(values: np.ndarray, target: float) -> int | None:
    """Return the first round (1-based) at which ``values`` reaches ``target``, or None."""
    hits = np.flatnonzero(values >= target - 1e-12)
    return int(hits[0]) + 1 if hits.size else None


def km_median(rounds: Sequence[int | None], horizon: int) -> int | None:
    """Return the Kaplan-Meier median of rounds to target, None when not reached by half.

    ``None`` entries are runs censored at ``horizon`` (they never reached the target).
    """
    times = sorted(r for r in rounds if r is not None)
    n = len(rounds)
    surviving, at_risk = 1.0, n
    for t in sorted(set(times)):
        events = times.count(t)
        surviving *= 1 - events / at_risk
        at_risk -= events
        if surviving <= 0.5:
            return t
    return None


def restricted(rounds: Sequence[int | None], horizon: int) -> list[float]:
    """Return rounds to target with censored runs counted as ``horizon``."""
    return [float(horizon if r is None else r) for r in rounds]


def _restricted_by_cell(rounds: Mapping[tuple[int, int], int | None], horizon: int
                        ) -> dict[tuple[int, int], float]:
    return dict(zip(rounds, restricted(list(rounds.values()), horizon)))


def _ratio() -> float:
    return 1.0 / (N_FOLDS - 1)


def _fmt(values: list[float], signed: bool = False) -> str:
    # a number of rounds is never below 0 (a gap of rounds has no such bound)
    return format_stats(*corrected_t_interval(values, _ratio()), scale=1.0, signed=signed,
                        bounds=None if signed else (0.0, math.inf))


def main(argv: Sequence[str] | None = None) -> int:
    """Run FedBN and FedAvg on every cell and publish the rounds to each target."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=200, folds=5, seeds=3),
                         quick=Budget(rounds=4, folds=1, seeds=1))
    parser.add_argument("--targets", type=_targets, default=TARGETS,
                        help=f"target scores (default {','.join(map(str, TARGETS))})")
    parser.add_argument("--metric", choices=("accuracy", "balanced_accuracy", "auc"),
                        default="balanced_accuracy",
                        help="the validation score the targets are for (default "
                             "balanced_accuracy: the majority class scores 50 %%)")
    parser.add_argument("--window", type=int, default=5,
                        help="rounds of the trailing mean (default 5; 1 = no smoothing)")
    bench = Benchmark(parser, argv)
    if bench.args.metric != "balanced_accuracy":  # another score is another table
        bench.set_variant(bench.args.metric)
    if bench.args.window < 1:
        parser.error(f"--window must be a positive integer, got {bench.args.window}")
    metric = f"val_{bench.args.metric}"
    horizon = bench.args.rounds
    # per_cell[label][(fold, seed)] = the run's smoothed validation curve
    per_cell: dict[str, dict[tuple[int, int], np.ndarray]] = {LABELS[s]: {} for s in STRATEGIES}
    runs = run_grid(bench, (None,), STRATEGIES,
                    lambda _, s, fold, seed: strategy_config(bench, s, fold=fold, seed=seed))
    for _, strategy, fold, seed, history in runs:
        per_cell[LABELS[strategy]][fold, seed] = smoothed(curve(history, metric),
                                                          bench.args.window)
    n_cells = len(bench.cells)

    body, rows = [], []
    for target in bench.args.targets:
        reach = {lb: {k: rounds_to(c, target) for k, c in cs.items()}
                 for lb, cs in per_cell.items()}
        bn, avg = (_restricted_by_cell(reach[lb], horizon) for lb in ("FedBN", "FedAvg"))
        diff = list(paired_differences(avg, bn).values())
        medians = {lb: km_median(list(r.values()), horizon) for lb, r in reach.items()}
        hit = {lb: sum(r is not None for r in rs.values()) for lb, rs in reach.items()}
        body.append([f"{100 * target:g}", _fmt(list(bn.values())), _fmt(list(avg.values())),
                     _fmt(diff, signed=True),
                     *[str(m) if m is not None else f"> {horizon}"
                       for m in (medians["FedBN"], medians["FedAvg"])],
                     f"{hit['FedBN']}/{hit['FedAvg']} of {n_cells}"])
        mean, low, high = corrected_t_interval(diff, _ratio())
        rows.append({"target": target, "metric": metric,
                     "restricted_rounds_fedbn": float(np.mean(list(bn.values()))),
                     "restricted_rounds_fedavg": float(np.mean(list(avg.values()))),
                     "fedavg_minus_fedbn": mean, "ci_low": low, "ci_high": high,
                     "km_median_fedbn": medians["FedBN"], "km_median_fedavg": medians["FedAvg"],
                     "cells_fedbn": hit["FedBN"], "cells_fedavg": hit["FedAvg"],
                     "cells": n_cells, "horizon": horizon})
    mean_curve = {lb: np.mean(list(cs.values()), axis=0) for lb, cs in per_cell.items()}
    # the first window - 1 rounds are NaN (no full window yet): the best is over the rest
    best = {lb: float(np.nanmax(c)) if np.isfinite(c).any() else math.nan
            for lb, c in mean_curve.items()}
    header = [f"target {metric} (%)", "FedBN rounds", "FedAvg rounds",
              "FedAvg - FedBN (rounds, paired)", "FedBN median (KM)", "FedAvg median (KM)",
              "cells reaching (FedBN/FedAvg)"]
    table = (f"Rounds to a target mean {metric} (validation split, trailing mean over "
             f"{bench.args.window} rounds) in each cell. Rounds: restricted mean [corrected "
             f"95 % CI] over all {n_cells} cells, a run that never reaches the target counted "
             f"as {horizon} (censored); no round before the first full window counts; "
             f"median: Kaplan-Meier. Best of the mean curve: "
             + ", ".join(f"{lb} {100 * v:.1f} %" for lb, v in best.items()) + ". "
             + reference_caption(bench, bench.args.metric, scored_on="val")
             + (" (mean [corrected 95 % CI])" if bench.args.metric == "auc" else
                " (mean [corrected 95 % CI], predicting at 0.5)")
             + "; a target at or below their score needs no connectivity.\n\n"
             + markdown_table(header, body))

    def plot(path: Path) -> Path:
        series = {lb: (list(range(1, c.size + 1)), list(100 * c), None)
                  for lb, c in mean_curve.items()}
        return line_plot(path, series, xlabel="round",
                         ylabel=f"{metric} (%), smoothed, mean of cells",
                         title="ABIDE: rounds to target (dashed: lowest target)",
                         hline=100 * min(bench.args.targets))

    bench.publish(table, rows, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
