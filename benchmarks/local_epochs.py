"""Local epochs E in {1, 4, 8, 16}: test balanced accuracy of FedBN, FedAvg and FedProx.

The total number of local epochs is fixed, as in the paper's comparison: ``--rounds T``
is the budget in epochs, and each E runs ``T // E`` rounds of E local epochs (T = 64:
64, 16, 8 and 4 rounds), so every setting sees the data equally often and only the
communication frequency changes.

    python benchmarks/local_epochs.py [--quick] [--epochs 1,4,8,16] [--rounds T]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from _common import (
    LABELS,
    Benchmark,
    Budget,
    float_list,
    line_plot,
    make_parser,
    markdown_table,
    mean_std,
    run,
    selected,
    strategy_config,
)

from fedbn_med.evaluation.comparison import format_interval

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
    # acc[label][E] = mean test balanced accuracy over sites at the selected round, per cell
    acc: dict[str, dict[int, list[float]]] = {LABELS[s]: {e: [] for e in epochs}
                                              for s in STRATEGIES}
    grid = [(s, e, fold, seed) for e in epochs for s in STRATEGIES
            for fold, seed in bench.cells]
    for strategy, e, fold, seed in bench.progress(grid):
        config = strategy_config(bench, strategy, fold=fold, seed=seed, local_epochs=e,
                                 rounds=max(1, budget // e))
        acc[LABELS[strategy]][e].append(selected(run(config)))

    gap = [[fb - fa for fb, fa in zip(acc["FedBN"][e], acc["FedAvg"][e])] for e in epochs]
    header = ["E", "rounds", *[f"{label} (%)" for label in acc], "FedBN - FedAvg (pp)"]
    body = [[e, max(1, budget // e), *[format_interval(acc[label][e]) for label in acc],
             format_interval(g, signed=True)] for e, g in zip(epochs, gap)]
    table = (f"Test balanced accuracy at the round with the lowest mean validation loss, "
             f"mean over sites, mean [95 % CI] over (fold, seed) cells (naive: cells share "
             f"subjects, see interval_design.py); the gap is paired by cell; {budget} local "
             "epochs in total\n\n" + markdown_table(header, body))
    rows = [{"local_epochs": e, "rounds": max(1, budget // e), "strategy": label,
             "fold": fold, "seed": seed, "test_balanced_accuracy": round(value, 6)}
            for label in acc for e in epochs
            for (fold, seed), value in zip(bench.cells, acc[label][e])]

    def plot(path: Path) -> Path:
        series = {label: (list(epochs), [100 * mean_std(acc[label][e])[0] for e in epochs],
                          [100 * mean_std(acc[label][e])[1] for e in epochs])
                  for label in acc}
        return line_plot(path, series, xlabel="local epochs E (log scale)", xlog=True,
                         ylabel="test balanced accuracy (%)",
                         title=f"ABIDE, {budget} local epochs in total")

    bench.publish(table, rows, plot, notes="FedProx mu = 0.01.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
