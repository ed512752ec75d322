"""Convergence of FedBN, FedAvg and FedProx: training loss and validation accuracy per round.

The paper's convergence analysis: each strategy trains for the same rounds (one local
epoch each) on every (fold, seed) cell; the curves are the mean over the sites, and the
table gives mean [corrected 95 % CI] over the cells. ``--bn-init data,default`` also runs each
strategy with BN running statistics starting at PyTorch's 0 and 1 (labelled "BN 0/1"),
the before/after of where they start. The curves are on the validation splits, never
the test splits, so that a number of rounds read off them is not chosen on test data.

    python benchmarks/research/convergence.py [--quick] [--data-dir DIR] [--rounds R] [--folds N]
                                     [--seeds S] [--bn-init data,default]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
from collections.abc import Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import LABELS, Benchmark, Budget, curve, make_parser, markdown_table, strategy_config
from _sweep import corrected, interval_caption, reference_caption, run_grid

from fedbn_med.evaluation.report import convergence_plot
from fedbn_med.evaluation.tables import format_stats
from fedbn_med.spec import BN_INITS

NAME = "convergence"
STRATEGIES = ("fedbn", "fedavg", "fedprox")
METRICS = ("train_loss", "val_accuracy")
CHECKPOINTS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200)


def _inits(text: str) -> tuple[str, ...]:
    values = tuple(t.strip() for t in text.split(",") if t.strip())
    if not values or not set(values) <= set(BN_INITS):
        raise argparse.ArgumentTypeError(f"expected data, default or both, got {text!r}")
    return values


def _label(strategy: str, init: str) -> str:
    return LABELS[strategy] + (" BN 0/1" if init == "default" else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Train each strategy on every cell and publish its per-round curves."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=150, folds=5, seeds=3),
                         quick=Budget(rounds=4, folds=1, seeds=1))
    parser.add_argument("--bn-init", type=_inits, default=None,
                        help="where BN running statistics start: data, default or both "
                             "(default data,default; data with --quick)")
    bench = Benchmark(parser, argv)
    inits = bench.args.bn_init or (("data",) if bench.args.quick else ("data", "default"))
    rounds = bench.args.rounds
    labels = [_label(s, i) for i in inits for s in STRATEGIES]
    curves: dict[str, list[dict[str, float | int | str]]] = {lb: [] for lb in labels}
    # per_cell[label][metric][(fold, seed)] = the run's curve (mean over sites, rounds 1..R)
    per_cell: dict[str, dict[str, dict[tuple[int, int], list[float]]]] = {
        lb: {m: {} for m in METRICS} for lb in labels}
    runs = run_grid(bench, inits, STRATEGIES, lambda init, s, fold, seed: strategy_config(
        bench, s, fold=fold, seed=seed, bn_init=init))
    for init, strategy, fold, seed, history in runs:
        label = _label(strategy, init)
        curves[label].extend({**r, "fold": fold, "seed": seed} for r in history.rows)
        for metric in METRICS:
            per_cell[label][metric][fold, seed] = list(curve(history, metric))

    marks = sorted({r for r in CHECKPOINTS if r <= rounds} | {rounds})
    header = ["round", *[f"{label} loss" for label in per_cell],
              *[f"{label} acc (%)" for label in per_cell]]
    body = [[rnd,
             *[format_stats(*corrected(c[rnd - 1] for c in per_cell[lb]["train_loss"].values()),
                            scale=1.0, digits=3)
               for lb in per_cell],
             *[format_stats(*corrected(c[rnd - 1] for c in per_cell[lb]["val_accuracy"].values()))
               for lb in per_cell]]
            for rnd in marks]
    table = (f"Mean over sites; {interval_caption(len(bench.cells))}; loss = training "
             "loss of the round, acc = validation accuracy (no test split is read)\n\n"
             + markdown_table(header, body) + "\n\n"
             + reference_caption(bench, "accuracy", scored_on="val")
             + " (fitted per site on each cell's training subjects; they predict at 0.5, "
             "the methods at the run's threshold)")
    rows = [{"strategy": lb, "fold": fold, "seed": seed, "round": rnd,
             **{m: round(per_cell[lb][m][fold, seed][rnd - 1], 6) for m in METRICS}}
            for lb in per_cell for fold, seed in bench.cells for rnd in range(1, rounds + 1)]

    def plot(path: Path) -> Path:
        return convergence_plot(curves, path, METRICS,
                                title=f"ABIDE convergence ({len(bench.cells)} cell(s))")

    bench.publish(table, rows, plot,
                  notes=f"FedProx mu = 0.01; {bench.args.rounds} rounds of 1 local epoch.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
