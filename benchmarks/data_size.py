"""Local data size: FedBN against SingleSet with 100, 50, 20, 10, 5 and 1 % of training data.

Each site keeps a stratified random share of its own training split (at least 2
examples, one per class when it can); validation and test splits stay whole. Every
setting trains for the same number of rounds, so smaller shares also take fewer steps.

    python benchmarks/data_size.py [--quick] [--fractions 1,0.5,0.2,0.1,0.05,0.01]
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from _common import (
    LABELS,
    Benchmark,
    Budget,
    float_list,
    line_plot,
    make_parser,
    markdown_table,
    mean_std,
    prepare_all,
    run,
    selected,
    strategy_config,
)
from sklearn.model_selection import train_test_split

from fedbn_med.evaluation.comparison import format_interval
from fedbn_med.tasks.abide.sites import load_sites
from fedbn_med.training.trainer import SiteData, derive_seed

NAME = "data_size"
STRATEGIES = ("fedbn", "singleset")
FRACTIONS = (1.0, 0.5, 0.2, 0.1, 0.05, 0.01)
QUICK_FRACTIONS = (1.0, 0.1)
MIN_EXAMPLES = 2  # batch norm cannot train on fewer


def _fractions(text: str) -> tuple[float, ...]:
    values = float_list(text)
    if not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected fractions in (0, 1] such as 1,0.5,0.01, "
                                         f"got {text!r}")
    return values


def subsample(data: SiteData, fraction: float, seed: int) -> SiteData:
    """Return the site's data with a stratified share of its training split.

    Keeps ``max(2, round(fraction * n))`` training examples, stratified by label when every
    class can be represented, else a plain random draw; ``fraction == 1`` keeps all.
    """
    x, y = data.train
    n = int(y.shape[0])
    keep = min(n, max(MIN_EXAMPLES, round(fraction * n)))
    if keep == n:
        return data
    labels = y.numpy()
    counts = np.unique(labels, return_counts=True)[1]
    # train_test_split stratifies only if each class fits in both parts.
    stratify = labels if (counts.min() >= 2 and min(keep, n - keep) >= counts.size) else None
    idx, _ = train_test_split(np.arange(n), train_size=keep, stratify=stratify,
                              random_state=seed)
    index = torch.as_tensor(np.sort(idx))
    return SiteData(train=(x[index], y[index]), val=data.val, test=data.test)


def _subsampled(datas: Mapping[str, SiteData], fraction: float, seed: int, fold: int
                ) -> dict[str, SiteData]:
    return {site: subsample(d, fraction, derive_seed(seed, site, fold, fraction))
            for site, d in datas.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Run FedBN and SingleSet on each share of the training data and publish the table."""
    parser = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=100, folds=5, seeds=3),
                         quick=Budget(rounds=3, folds=1))
    parser.add_argument("--fractions", type=_fractions, default=None,
                        help="shares of each site's training split (default "
                             f"{','.join(map(str, FRACTIONS))}; "
                             f"{','.join(map(str, QUICK_FRACTIONS))} with --quick)")
    bench = Benchmark(parser, argv)
    fractions = bench.args.fractions or (QUICK_FRACTIONS if bench.args.quick else FRACTIONS)
    sites = load_sites(list(bench.config().sites))
    acc: dict[str, dict[float, list[float]]] = {LABELS[s]: {f: [] for f in fractions}
                                                for s in STRATEGIES}
    n_train: dict[float, dict[str, list[int]]] = {f: {s: [] for s in sites} for f in fractions}
    full: dict[tuple[int, int], dict[str, SiteData]] = {}
    grid = [(fold, seed, f, s) for fold, seed in bench.cells for f in fractions
            for s in STRATEGIES]
    for fold, seed, fraction, strategy in bench.progress(grid):
        config = strategy_config(bench, strategy, fold=fold, seed=seed)
        if (fold, seed) not in full:  # each repetition re-draws the splits
            full[fold, seed] = prepare_all(config, sites)
        datas = _subsampled(full[fold, seed], fraction, seed, fold)
        if strategy == STRATEGIES[0]:
            for site, d in datas.items():
                n_train[fraction][site].append(d.num_train)
        acc[LABELS[strategy]][fraction].append(selected(run(config, datas, sites)))

    gap = {f: [a - b for a, b in zip(acc["FedBN"][f], acc["SingleSet"][f])]
           for f in fractions}
    header = ["data (%)", f"train examples ({'/'.join(sites)})",
              *[f"{label} (%)" for label in acc], "FedBN - SingleSet (pp)"]
    body = [[f"{100 * f:g}", "/".join(str(round(np.mean(n_train[f][s]))) for s in sites),
             *[format_interval(acc[label][f]) for label in acc],
             format_interval(gap[f], signed=True)] for f in fractions]
    table = ("Test balanced accuracy at the round with the lowest mean validation loss, "
             "mean over sites, mean [95 % CI] over (fold, seed) cells (naive: cells share "
             "subjects, see interval_design.py); the gap is paired by cell\n\n"
             + markdown_table(header, body))
    rows = [{"fraction": f, "strategy": label, "fold": fold, "seed": seed,
             "test_balanced_accuracy": round(v, 6),
             **{f"n_train_{s}": n_train[f][s][i] for s in sites}}
            for label in acc for f in fractions
            for i, ((fold, seed), v) in enumerate(zip(bench.cells, acc[label][f]))]

    def plot(path: Path) -> Path:
        xs = [100 * f for f in fractions]
        series = {label: (xs, [100 * mean_std(acc[label][f])[0] for f in fractions],
                          [100 * mean_std(acc[label][f])[1] for f in fractions])
                  for label in acc}
        return line_plot(path, series, xlabel="share of local training data (%, log scale)",
                         ylabel="test balanced accuracy (%)", xlog=True, hline=50.0,
                         title=f"ABIDE, {bench.args.rounds} rounds")

    bench.publish(table, rows, plot,
                  notes=f"{bench.args.rounds} rounds of 1 local epoch for every share.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
