"""Convergence of FedBN, FedAvg and FedProx: training loss and test accuracy per round.

The paper's convergence analysis: each strategy trains for the same rounds (one local
epoch each); the curves are the mean over the sites and over the runs (test folds).

    python benchmarks/convergence.py [--quick] [--data-dir DIR] [--rounds R] [--folds N]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from _common import (
    LABELS,
    Benchmark,
    Budget,
    curve,
    format_mean_std,
    make_parser,
    markdown_table,
    run,
    strategy_config,
)

from fedbn_med.report import convergence_plot

NAME = "convergence"
STRATEGIES = ("fedbn", "fedavg", "fedprox")
METRICS = ("train_loss", "test_accuracy")
CHECKPOINTS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200)


def main(argv: Sequence[str] | None = None) -> int:
    """Train each strategy on every fold and publish its per-round curves."""
    parser = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=100, folds=5),
                         quick=Budget(rounds=4, folds=1))
    bench = Benchmark(parser, argv)
    rounds = bench.args.rounds
    curves: dict[str, list[dict[str, float | int | str]]] = {LABELS[s]: [] for s in STRATEGIES}
    # per_fold[label][metric] = one curve (mean over sites, rounds 1..R) per fold
    per_fold: dict[str, dict[str, list[list[float]]]] = {
        LABELS[s]: {m: [] for m in METRICS} for s in STRATEGIES}
    grid = [(s, fold) for s in STRATEGIES for fold in bench.folds]
    for strategy, fold in bench.progress(grid):
        history = run(strategy_config(bench, strategy, fold=fold))
        curves[LABELS[strategy]].extend({**r, "fold": fold} for r in history.rows)
        for metric in METRICS:
            per_fold[LABELS[strategy]][metric].append(list(curve(history, metric)))

    marks = sorted({r for r in CHECKPOINTS if r <= rounds} | {rounds})
    header = ["round", *[f"{label} loss" for label in per_fold],
              *[f"{label} acc (%)" for label in per_fold]]
    body = [[rnd,
             *[format_mean_std([c[rnd - 1] for c in per_fold[lb]["train_loss"]], pct=False)
               for lb in per_fold],
             *[format_mean_std([c[rnd - 1] for c in per_fold[lb]["test_accuracy"]])
               for lb in per_fold]]
            for rnd in marks]
    table = ("Mean over sites, mean (std) over runs; loss = training loss of the round\n\n"
             + markdown_table(header, body))
    rows = [{"strategy": lb, "fold": fold, "round": rnd,
             **{m: round(per_fold[lb][m][i][rnd - 1], 6) for m in METRICS}}
            for lb in per_fold for i, fold in enumerate(bench.folds)
            for rnd in range(1, rounds + 1)]

    def plot(path: Path) -> Path:
        return convergence_plot(curves, path, METRICS,
                                title=f"ABIDE convergence ({bench.args.folds} run(s))")

    bench.publish(table, rows, plot,
                  notes=f"FedProx mu = 0.01; {bench.args.rounds} rounds of 1 local epoch.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
