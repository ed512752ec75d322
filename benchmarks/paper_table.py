"""Reproduce the FedBN paper's ABIDE table: accuracy per site, mean (std) over 5 runs.

Each run is one test fold (0..4) of every site's 5-fold split; SingleSet, FedAvg, FedProx
(mu = 0.01), FedBN and Centralized train for the same rounds with the paper's settings
(SGD lr 0.01, batch 32, one local epoch per round) and are scored at the last round.

    python benchmarks/paper_table.py [--quick] [--data-dir DIR] [--rounds R] [--folds N]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from _common import (
    LABELS,
    Benchmark,
    Budget,
    bar_plot,
    make_parser,
    mean_std,
    run,
    site_mean,
    strategy_config,
)

from fedbn_med.report import paper_table

NAME = "paper_table"
STRATEGIES = ("singleset", "fedavg", "fedprox", "fedbn", "centralized")
SITES = ("NYU", "USM", "UM", "UCLA")  # the paper's column order
METRICS = ("accuracy", "auc", "balanced_accuracy")
PAPER = """Paper (FedBN, ICLR 2021), accuracy (%) mean (std) over 5 runs:

| method | NYU | USM | UM | UCLA | mean |
|---|---|---|---|---|---|
| SingleSet | 58.0 (3.3) | 73.4 (2.2) | 64.3 (1.4) | 57.3 (2.4) | 63.3 |
| FedAvg | 62.7 (1.7) | 73.1 (2.4) | 70.7 (0.5) | 64.7 (0.7) | 67.8 |
| FedProx | 63.3 (1.0) | 73.0 (1.8) | 70.5 (1.1) | 64.5 (1.2) | 67.8 |
| FedBN | 65.6 (1.1) | 75.1 (1.4) | 68.6 (2.9) | 65.5 (1.0) | 68.7 |"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run every strategy on every fold and publish the paper-style table."""
    parser = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=100, folds=5),
                         quick=Budget(rounds=3, folds=1))
    bench = Benchmark(parser, argv)
    # results[metric][method][site] = one value per run (fold)
    results: dict[str, dict[str, dict[str, list[float]]]] = {
        m: {LABELS[s]: {site: [] for site in (*SITES, "mean")} for s in STRATEGIES}
        for m in METRICS}
    grid = [(s, fold) for s in STRATEGIES for fold in bench.folds]
    for strategy, fold in bench.progress(grid):
        history = run(strategy_config(bench, strategy, fold=fold))
        final = history.final()
        for metric in METRICS:
            per_site = results[metric][LABELS[strategy]]
            for site in SITES:
                per_site[site].append(float(final[site][f"test_{metric}"]))
            per_site["mean"].append(site_mean(history, f"test_{metric}"))

    def per_site(metric: str) -> dict[str, dict[str, list[float]]]:
        return {m: {s: v for s, v in per.items() if s != "mean"}
                for m, per in results[metric].items()}

    table = paper_table(per_site("accuracy"), SITES)
    if "auc" in results:
        table += "\n\n" + paper_table(per_site("auc"), SITES, metric="auc")
    rows = [{"method": method, "site": site, "runs": len(results["accuracy"][method][site]),
             **{f"{metric}_{stat}": round(value, 6) for metric in METRICS
                for stat, value in zip(("mean", "std"),
                                       mean_std(results[metric][method][site]))}}
            for method in results["accuracy"] for site in (*SITES, "mean")]

    def plot(path: Path) -> Path:
        series = {m: ([100 * mean_std(v[s])[0] for s in (*SITES, "mean")],
                      [100 * mean_std(v[s])[1] for s in (*SITES, "mean")])
                  for m, v in results["accuracy"].items()}
        return bar_plot(path, [*SITES, "mean"], series, ylabel="test accuracy (%)",
                        title=f"ABIDE, {bench.args.rounds} rounds, {bench.args.folds} run(s)")

    bench.publish(table, rows, plot, notes=PAPER)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
