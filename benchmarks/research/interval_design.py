"""Interval design: naive and corrected intervals of FedBN - FedAvg, and the design that
reaches a half-width of at most 3 pp honestly.

FedBN and FedAvg train on ``--folds`` x ``--seeds`` cells twice, on one set of sites:

- fixed splits: every seed reuses repetition ``--seed``'s split of each site (seeds only
  re-initialise the model), as the protocol did before; its cells share test sets;
- re-split: each seed re-draws every site's split (the protocol now).

For each design the table gives the paired difference FedBN - FedAvg of the site-mean
test score at the round of lowest validation loss, with the naive t-interval over the
cells, the corrected resampled t (Nadeau-Bengio; on fixed splits over the fold means,
as repetitions that share a test set add no new test subjects) and a subject-level
interval: for balanced accuracy a bootstrap of each repetition's pooled out-of-fold
predictions, subjects resampled within sites; for AUC DeLong on each subject's
out-of-fold prediction averaged over the repetitions.

From the re-split design's spread of the paired differences, a second table projects
the corrected half-width for more repetitions and more subjects: ``t * s * sqrt(1 / J
+ n_test / n_train)`` with ``s^2`` shrinking as ``1 / subjects``. More repetitions cannot
push it below ``t * s * sqrt(n_test / n_train)``; past that only more subjects (sites)
help. The first design that reaches the target is marked. A projection from a few cells
is rough: run that design to confirm it. No real federation has the subjects of such a
design; the built-in cohort can: ``--cohort-scale K`` multiplies each of its sites'
subjects by K (at most 5), and ``--resplit-only`` runs the re-split design alone (the
design the protocol uses), so that a projected design can be run and its half-width
read off, not projected.

    python benchmarks/research/interval_design.py [--quick] [--data-dir DIR] [--sites A,B,C,D]
                                         [--folds N] [--seeds S] [--target-pp 3]
                                         [--cohort-scale K] [--resplit-only]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
import numpy as np
from _common import LABELS, Benchmark, Budget, make_parser, markdown_table, strategy_config
from _plots import bar_plot

from fedbn_med.evaluation.comparison import Comparison
from fedbn_med.evaluation.intervals import (
    corrected_half_width,
    corrected_half_width_floor,
    naive_t_interval,
)
from fedbn_med.evaluation.pairing import paired_differences
from fedbn_med.evaluation.runner import run_comparison
from fedbn_med.evaluation.tables import format_stats
from fedbn_med.tasks.abide.settings import MAX_COHORT_SCALE

NAME = "interval_design"
STRATEGIES = ("fedbn", "fedavg")
METRICS = ("balanced_accuracy", "auc")
REPETITIONS = (1, 3, 5, 10, 20, 50)
SUBJECT_FACTORS = (1, 2, 4, 8)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of percentage points "
                                         f"such as 3, got {text!r}")
    return value


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_COHORT_SCALE):
        raise argparse.ArgumentTypeError(f"expected a number in (0, {MAX_COHORT_SCALE:g}] "
                                         f"such as 4, got {text!r}")
    return value


def _half(low: float, high: float) -> str:
    return f"{100 * (high - low) / 2:.1f}" if math.isfinite(low) and math.isfinite(high) \
        else "n/a"


def design_rows(comparison: Comparison, design: str, metric: str, a: str, b: str
                ) -> tuple[list[object], dict[str, object]]:
    """Return one table row and one CSV row: the difference and its three intervals."""
    mean, low, high, n = comparison.difference(a, b, "best", metric)
    _, c_low, c_high, _ = comparison.difference(a, b, "best", metric, corrected=True)
    tests = comparison.subject_tests(a, b, n_boot=1000) if metric == "balanced_accuracy" \
        else comparison.subject_tests(a, b, n_boot=100)
    if tests is None:
        b_mean, b_low, b_high = math.nan, math.nan, math.nan
    elif metric == "balanced_accuracy":
        b_mean, b_low, b_high = (tests["bootstrap_bal_acc_diff"], tests["bootstrap_ci_low"],
                                 tests["bootstrap_ci_high"])
    else:
        b_mean, b_low, b_high = (tests["delong_auc_diff"], tests["delong_ci_low"],
                                 tests["delong_ci_high"])
    row = [design, metric, n, format_stats(mean, math.nan, math.nan, signed=True),
           format_stats(mean, low, high, signed=True), _half(low, high),
           format_stats(mean, c_low, c_high, signed=True), _half(c_low, c_high),
           format_stats(b_mean, b_low, b_high, signed=True), _half(b_low, b_high)]
    csv = {"design": design, "metric": metric, "cells": n, "mean": mean,
           "naive_low": low, "naive_high": high, "corrected_low": c_low,
           "corrected_high": c_high, "subjects_low": b_low, "subjects_high": b_high}
    return row, csv


def projected_half_width(s: float, ratio: float, folds: int, repetitions: int,
                         factor: float, level: float = 0.95) -> float:
    """Return the corrected half-width of ``folds x repetitions`` cells, subjects x ``factor``."""
    return corrected_half_width(s / math.sqrt(factor), ratio, folds * repetitions, level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both designs, print their intervals side by side and the projected designs."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=100, folds=5, seeds=3),
                         quick=Budget(rounds=2, folds=2, seeds=2))
    parser.add_argument("--target-pp", type=_positive, default=3.0,
                        help="half-width to reach, in percentage points (default 3)")
    parser.add_argument("--cohort-scale", type=_scale, default=None,
                        help="built-in cohort only: each site's subjects times K (at most "
                             f"{MAX_COHORT_SCALE:g})")
    parser.add_argument("--resplit-only", action="store_true",
                        help="run the re-split design alone (no fixed-splits design)")
    bench = Benchmark(parser, argv)
    args = bench.args
    if args.seeds < 2 or args.folds < 2:
        parser.error(f"--folds and --seeds must both be at least 2 to compare the designs, "
                     f"got {args.folds} and {args.seeds}")
    if args.cohort_scale is not None and args.data_dir is not None:
        parser.error("--cohort-scale sizes the built-in cohort; real data have the subjects "
                     "they have (omit --cohort-scale or --data-dir)")
    scale = args.cohort_scale or 1.0
    # a key names no ".": 2.5 times the subjects is "cohort_x2p5"
    variant = "-".join(([f"cohort_x{scale:g}".replace(".", "p")] if args.cohort_scale else [])
                       + (["resplit"] if args.resplit_only else []))
    bench.set_variant(variant or None)
    sites = args.sites or bench.config().sites
    specs = {LABELS[s]: strategy_config(bench, s, sites=sites, cohort_scale=scale)
             for s in STRATEGIES}
    a, b = LABELS["fedbn"], LABELS["fedavg"]
    seeds = list(bench.seeds)
    bench.runs += len(specs) * len(bench.folds) * (
        len(seeds) if args.resplit_only else 2 * len(seeds) - 1)
    resplit = run_comparison(specs, bench.folds, seeds, progress=True)
    designs = [("re-split", resplit)]
    if not args.resplit_only:
        fixed = Comparison(sites=resplit.sites, resplit=False, n_folds=resplit.n_folds,
                           cells=[c for c in resplit.cells if c.seed == seeds[0]])
        fixed.cells += run_comparison(specs, bench.folds, seeds[1:], progress=True,
                                      split_seed=seeds[0]).cells
        designs.insert(0, ("fixed splits", fixed))
    subjects = resplit.cells[0].n_train + resplit.cells[0].n_test
    if args.cohort_scale:
        bench.data_note = f"each site's subjects x{scale:g} ({subjects} subjects)"

    header = ["design", "metric", "cells", "FedBN - FedAvg (pp)", "naive 95 % CI",
              "naive half-width", "corrected 95 % CI", "corrected half-width",
              "subjects 95 % CI", "subjects half-width"]
    body, rows = [], []
    for design, comparison in designs:
        for metric in METRICS:
            row, csv = design_rows(comparison, design, metric, a, b)
            body.append(row)
            rows.append(csv)
    where = (f"the built-in cohort at {scale:g} times each site's subjects ({subjects} "
             "subjects), " if args.cohort_scale else "")
    table = (f"FedBN - FedAvg on {where}{', '.join(resplit.sites)}, site-mean test score at the "
             f"round of lowest validation loss, {len(bench.folds)} folds x {len(seeds)} "
             "seeds. Naive: t over the cells as if independent; corrected: Nadeau-Bengio "
             f"(n_test/n_train = {resplit.test_train_ratio:.3f}); subjects: bootstrap over "
             "subjects stratified by site (balanced accuracy) or DeLong (AUC) on the pooled "
             "out-of-fold predictions.\n\n" + markdown_table(header, body))

    target = bench.args.target_pp / 100
    proj_header = ["subjects", "metric", *[f"{r} rep." for r in REPETITIONS],
                   "floor (any rep.)"]
    proj_body, reached = [], []
    for metric in METRICS:
        diffs = [d for d in paired_differences(resplit.values(a, "best", metric),
                                               resplit.values(b, "best", metric),
                                               require_same=False).values()
                 if math.isfinite(d)]
        s = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else math.nan
        ratio = resplit.test_train_ratio
        for factor in SUBJECT_FACTORS:
            cells = []
            for r in REPETITIONS:
                hw = projected_half_width(s, ratio, len(bench.folds), r, factor)
                mark = ""
                if math.isfinite(hw) and hw <= target and not any(
                        m == metric for m, *_ in reached):
                    reached.append((metric, factor, r, hw))
                    mark = " **"
                cells.append(f"{100 * hw:.1f}{mark}" if math.isfinite(hw) else "n/a")
            floor = corrected_half_width_floor(s / math.sqrt(factor), ratio)
            proj_body.append([f"x{factor}", metric, *cells, f"{100 * floor:.1f}"])
        rows.append({"design": "pilot spread", "metric": metric, "cells": len(diffs),
                     "mean": float(np.mean(diffs)) if diffs else math.nan,
                     "naive_low": naive_t_interval(diffs)[1],
                     "naive_high": naive_t_interval(diffs)[2], "sd": s})
    verdict = "; ".join(
        f"{metric}: {len(bench.folds)} folds x {r} repetitions with x{f} the subjects "
        f"(projected half-width {100 * hw:.1f} pp)" for metric, f, r, hw in reached) or (
        "no design in the grid reaches it")
    projection = (f"Projected corrected half-width (pp) of FedBN - FedAvg, "
                  f"{len(bench.folds)} folds, from the re-split cells' spread; subjects: "
                  f"times the {subjects} subjects of "
                  f"these sites; ** first design reaching "
                  f"{bench.args.target_pp:g} pp.\n\n" + markdown_table(proj_header, proj_body)
                  + f"\n\nFirst design reaching {bench.args.target_pp:g} pp: {verdict}.")

    def plot(path: Path) -> Path:
        groups = [f"{d} {m}" for d, _ in designs for m in METRICS]
        n = len(groups)
        series = {}
        for label, (lo_key, hi_key) in (("naive", ("naive_low", "naive_high")),
                                        ("corrected", ("corrected_low", "corrected_high")),
                                        ("subjects", ("subjects_low", "subjects_high"))):
            halves = [100 * (float(r[hi_key]) - float(r[lo_key])) / 2  # type: ignore[arg-type]
                      for r in rows[:n]]
            series[label] = ([h if math.isfinite(h) else 0.0 for h in halves], [0.0] * n)
        return bar_plot(path, groups, series, ylabel="95 % half-width (pp)",
                        title=f"FedBN - FedAvg intervals, {len(bench.folds)} x {len(seeds)}")

    bench.publish(table, rows, plot, notes=projection)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
