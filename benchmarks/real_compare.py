"""Compare the strategies on any federation of sites, from any ABIDE data folder.

The comparison protocol of ``paper_table.py`` (every strategy on every (fold, repetition)
cell, each repetition re-drawing every site's split, each run's result at its round with
the lowest mean validation loss, corrected intervals, majority-class and motion-only
rows, paired differences of FedBN against every other row, subject-level McNemar and
DeLong tests), on the sites ``--sites`` names instead of the paper's four. Each site is a
file in ``sites/``; ``--data-dir`` is the folder holding ``ABIDE_pcp/`` (the real ABIDE
Preprocessed release, or any release in its layout).

    python benchmarks/real_compare.py --data-dir DIR --sites PITT,YALE,KKI,TRINITY
                                      [--strategies fedavg,fedbn] [--quick] [--rounds R]
                                      [--folds N] [--seeds S] [--weighting samples|equal]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from _common import LABELS, Benchmark, Budget, bar_plot, make_parser, strategy_config

from fedbn_med.protocol import run_comparison
from fedbn_med.report import csv_text

NAME = "real_compare"
STRATEGIES = ("singleset", "fedavg", "fedprox", "fedbn", "centralized")
SITES = ("PITT", "YALE", "KKI", "TRINITY")  # four of the shared real sites
ROUNDS = 100


def _names(text: str) -> tuple[str, ...]:
    """Parse a comma-separated list of names (an argparse ``type``)."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Run every strategy on every (fold, seed) of the given sites; publish the tables."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=ROUNDS, folds=5, seeds=3),
                         quick=Budget(rounds=3, folds=1, seeds=1))
    parser.add_argument("--sites", type=_names, default=SITES,
                        help=f"comma-separated sites, files in sites/ (default "
                             f"{','.join(SITES)})")
    parser.add_argument("--strategies", type=_names, default=STRATEGIES,
                        help=f"comma-separated strategies (default {','.join(STRATEGIES)})")
    parser.add_argument("--weighting", choices=("samples", "equal"), default="samples",
                        help="how shared weights are averaged (default samples)")
    bench = Benchmark(parser, argv)
    args = bench.args
    from fedbn_med.strategies import STRATEGIES as KNOWN
    from fedbn_med.tasks.abide.sites import load_sites

    unknown = [s for s in args.strategies if s not in KNOWN]
    if unknown:
        parser.error(f"unknown strategy {unknown[0]!r} in --strategies; valid strategies: "
                     f"{', '.join(sorted(KNOWN))}")
    if len(args.sites) < 2:
        parser.error(f"--sites must name at least two sites for a federation, got "
                     f"{','.join(args.sites)}")
    try:
        load_sites(list(args.sites))
    except ValueError as err:
        parser.error(f"--sites: {err}")
    sites = tuple(args.sites)
    specs = {LABELS.get(s, s): strategy_config(bench, s, sites=sites,
                                               weighting=args.weighting)
             for s in args.strategies}
    bench.runs += len(specs) * len(bench.cells)
    comparison = run_comparison(specs, bench.folds, bench.seeds, progress=True)
    table = comparison.report()
    bench.out.mkdir(parents=True, exist_ok=True)
    (bench.out / "predictions.csv").write_text(csv_text(comparison.prediction_rows()),
                                               encoding="utf-8")

    def plot(path: Path) -> Path:
        series = {}
        for method in comparison.strategies:
            means, errs = [], []
            for site in (*sites, "mean"):
                mean, _, high = comparison.corrected(
                    comparison.values(method, "best", "balanced_accuracy", site))
                means.append(100 * mean)
                errs.append(100 * (high - mean) if not math.isnan(high) else 0.0)
            series[method] = (means, errs)
        return bar_plot(path, [*sites, "mean"], series,
                        ylabel="test balanced accuracy (%), best-validation round, "
                               "corrected 95 % CI",
                        title=f"ABIDE {', '.join(sites)}: {args.rounds} rounds, "
                              f"{len(bench.cells)} cells")

    data = args.data_dir or "the built-in cohort"
    notes = (f"Sites {', '.join(sites)} from {data}; SGD lr 0.01, batch 32, one local "
             f"epoch per round, weighting {args.weighting}.")
    bench.publish(table, comparison.rows(), plot, notes=notes, metrics=comparison.metrics())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
