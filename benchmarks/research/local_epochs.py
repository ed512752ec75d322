"""Local epochs E in {1, 4, 8, 16}: test balanced accuracy of FedBN, FedAvg and FedProx.

The total number of local epochs is fixed, as in the paper's comparison: ``--rounds T``
is the budget in epochs, and each E runs ``T // E`` rounds of E local epochs (T = 64:
64, 16, 8 and 4 rounds), so every setting sees the data equally often and only the
communication frequency changes.

    python benchmarks/research/local_epochs.py [--quick] [--epochs 1,4,8,16] [--rounds T]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import (
    LABELS,
    Benchmark,
    Budget,
    float_list,
    make_parser,
    markdown_table,
    strategy_config,
)
from _plots import line_plot
from _sweep import gap, half_width, interval_caption, reference_caption, summary, sweep

from fedbn_med.evaluation.tables import format_stats

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

NAME = "local_epochs"
STRATEGIES = ("fedbn", "fedavg", "fedprox")
EPOCHS = (1, 4, 8, 16)
QUICK_EPOCHS = (1, 4)


def _epochs(text: str) -> tuple[int, ...]:
    values = float_list(text)
    if not all(v >= 1 and v == int(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers such as 1,4,8,16, "
                                         f"got {text!r}")
    return tuple(int(v) for v in values)


def main(argv: Sequence[str] | None = None) -> int:
    """Run each strategy for each E at a fixed epoch budget and publish the accuracies."""
    parser = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=64, folds=5, seeds=3),
                         quick=Budget(rounds=4, folds=1))
    parser.add_argument("--epochs", type=_epochs, default=None,
                        help=f"local epochs per round (default {','.join(map(str, EPOCHS))}; "
                             f"{','.join(map(str, QUICK_EPOCHS))} with --quick)")
    bench = Benchmark(parser, argv)
    budget = bench.args.rounds
    epochs = bench.args.epochs or (QUICK_EPOCHS if bench.args.quick else EPOCHS)
    if any(e > budget for e in epochs):
        parser.error(f"every E in --epochs must be at most the epoch budget --rounds "
                     f"{budget}, got {','.join(map(str, epochs))}")

    def spec(e: int, strategy: str, fold: int, seed: int) -> RunSpec:
        return strategy_config(bench, strategy, fold=fold, seed=seed, local_epochs=e,
                               rounds=max(1, budget // e))

    comparisons = sweep(bench, epochs, STRATEGIES, spec)

    def acc(strategy: str, e: int) -> dict[tuple[int, int], float]:
        """Return the cells' mean test balanced accuracy over sites at the selected round."""
        return comparisons[e].values(strategy, "best", "balanced_accuracy")

    header = ["E", "rounds", *[f"{LABELS[s]} (%)" for s in STRATEGIES], "FedBN - FedAvg (pp)"]
    body = [[e, max(1, budget // e),
             *[format_stats(*summary(comparisons[e], s)) for s in STRATEGIES],
             format_stats(*gap(comparisons[e], "fedbn", "fedavg"), signed=True)]
            for e in epochs]
    table = (f"Test balanced accuracy at the round with the lowest mean validation loss, "
             f"mean over sites; {interval_caption(len(bench.cells))}; the gap is paired by "
             f"cell; {budget} local epochs in total\n\n" + markdown_table(header, body)
             + "\n\n" + reference_caption(bench))
    rows = [{"local_epochs": e, "rounds": max(1, budget // e), "strategy": LABELS[s],
             "fold": fold, "seed": seed, "test_balanced_accuracy": round(value, 6)}
            for s in STRATEGIES for e in epochs for (fold, seed), value in acc(s, e).items()]

    def plot(path: Path) -> Path:
        stats = {s: [summary(comparisons[e], s) for e in epochs] for s in STRATEGIES}
        series = {LABELS[s]: (list(epochs), [100 * m for m, _, _ in stats[s]],
                              [half_width(st) for st in stats[s]])
                  for s in STRATEGIES}
        return line_plot(path, series, xlabel="local epochs E (log scale)", xlog=True,
                         ylabel="test balanced accuracy (%), corrected 95 % CI",
                         title=f"ABIDE, {budget} local epochs in total")

    bench.publish(table, rows, plot, notes="FedProx mu = 0.01.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
