"""Local data size: FedBN against SingleSet with 100, 50, 20, 10, 5 and 1 % of training data.

Each site keeps a stratified random share of its own training subjects (at least 2, one
per class when it can; with sliding windows, every window of a kept subject); validation
and test splits stay whole. Every
setting trains for the same number of rounds, so smaller shares also take fewer steps.

    python benchmarks/research/data_size.py [--quick] [--fractions 1,0.5,0.2,0.1,0.05,0.01]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
import numpy as np
import torch
from _common import (
    LABELS,
    Benchmark,
    Budget,
    float_list,
    make_parser,
    markdown_table,
    prepare_all,
    strategy_config,
)
from _plots import line_plot
from _sweep import gap, half_width, interval_caption, reference_caption, summary, sweep
from sklearn.model_selection import train_test_split

from fedbn_med.evaluation.tables import format_stats
from fedbn_med.tasks.abide.sites import load_sites
from fedbn_med.training.trainer import SiteData, derive_seed

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

NAME = "data_size"
STRATEGIES = ("fedbn", "singleset")
FRACTIONS = (1.0, 0.5, 0.2, 0.1, 0.05, 0.01)
QUICK_FRACTIONS = (1.0, 0.1)
MIN_EXAMPLES = 2  # batch norm cannot train on fewer
METRIC = "balanced_accuracy"


def _fractions(text: str) -> tuple[float, ...]:
    values = float_list(text)
    if not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected fractions in (0, 1] such as 1,0.5,0.01, "
                                         f"got {text!r}")
    return values


def subsample(data: SiteData, fraction: float, seed: int) -> SiteData:
    """Return the site's data with a stratified share of its training subjects.

    Keeps ``max(2, round(fraction * n))`` of the site's ``n`` training subjects, stratified
    by label when every class can be represented, else a plain random draw; ``fraction ==
    1`` keeps all. A subject keeps all its rows: with sliding windows
    (``data.train_groups``) every window of a kept subject, none of the others. Validation
    and test stay whole, scored per subject as in the full run.
    """
    x, y = data.train
    rows = int(y.shape[0])
    groups = data.train_groups if data.train_groups is not None else torch.arange(rows)
    subjects, first = np.unique(groups.numpy(), return_index=True)
    labels = y.numpy()[first]  # a subject's windows share its label
    n = int(subjects.size)
    keep = min(n, max(MIN_EXAMPLES, round(fraction * n)))
    if keep == n:
        return data
    counts = np.unique(labels, return_counts=True)[1]
    # train_test_split stratifies only if each class fits in both parts.
    stratify = labels if (counts.min() >= 2 and min(keep, n - keep) >= counts.size) else None
    chosen, _ = train_test_split(subjects, train_size=keep, stratify=stratify,
                                 random_state=seed)
    index = torch.as_tensor(np.flatnonzero(np.isin(groups.numpy(), chosen)))
    return replace(data, train=(x[index], y[index]),
                   train_groups=None if data.train_groups is None else groups[index])


def n_subjects(data: SiteData) -> int:
    """Return how many subjects the site's training rows come from."""
    if data.train_groups is None:
        return data.num_train
    return int(torch.unique(data.train_groups).numel())


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
    full: dict[tuple[int, int], dict[str, SiteData]] = {}
    shares: dict[tuple[float, int, int], dict[str, SiteData]] = {}

    def data(fraction: float, config: RunSpec) -> dict[str, SiteData]:
        fold, seed = config.fold, config.seed
        if (fold, seed) not in full:  # each repetition re-draws the splits
            full[fold, seed] = prepare_all(config, sites)
        if (fraction, fold, seed) not in shares:
            shares[fraction, fold, seed] = _subsampled(full[fold, seed], fraction, seed, fold)
        return shares[fraction, fold, seed]

    def spec(fraction: float, strategy: str, fold: int, seed: int) -> RunSpec:
        return strategy_config(bench, strategy, fold=fold, seed=seed)

    comparisons = sweep(bench, fractions, STRATEGIES, spec, data=data, sites=sites)
    # training subjects of each site in each (fraction, fold, seed)
    n_train = {key: {site: n_subjects(d) for site, d in datas.items()}
               for key, datas in shares.items()}
    labels = [LABELS[s] for s in STRATEGIES]

    def acc(strategy: str, fraction: float) -> dict[tuple[int, int], float]:
        return comparisons[fraction].values(strategy, "best", METRIC)

    header = ["data (%)", f"train subjects ({'/'.join(sites)})",
              *[f"{label} (%)" for label in labels], "FedBN - SingleSet (pp)"]
    body = [[f"{100 * f:g}",
             "/".join(str(round(np.mean([n_train[f, fold, seed][s]
                                         for fold, seed in bench.cells]))) for s in sites),
             *[format_stats(*summary(comparisons[f], s)) for s in STRATEGIES],
             format_stats(*gap(comparisons[f], "fedbn", "singleset"), signed=True)]
            for f in fractions]
    table = ("Test balanced accuracy at the round with the lowest mean validation loss, "
             f"mean over sites; {interval_caption(len(bench.cells))}; the gap is paired "
             "by cell\n\n" + markdown_table(header, body) + "\n\n"
             + reference_caption(bench) + " (fitted on each cell's whole training part)")
    rows = [{"fraction": f, "strategy": LABELS[s], "fold": fold, "seed": seed,
             "test_balanced_accuracy": round(v, 6),
             **{f"n_train_{site}": n_train[f, fold, seed][site] for site in sites}}
            for s in STRATEGIES for f in fractions for (fold, seed), v in acc(s, f).items()]

    def plot(path: Path) -> Path:
        xs = [100 * f for f in fractions]
        stats = {s: [summary(comparisons[f], s) for f in fractions] for s in STRATEGIES}
        series = {LABELS[s]: (xs, [100 * m for m, _, _ in stats[s]],
                              [half_width(st) for st in stats[s]])
                  for s in STRATEGIES}
        return line_plot(path, series, xlabel="share of local training data (%, log scale)",
                         ylabel="test balanced accuracy (%), corrected 95 % CI", xlog=True,
                         hline=50.0,
                         title=f"ABIDE, {bench.args.rounds} rounds")

    bench.publish(table, rows, plot,
                  notes=f"{bench.args.rounds} rounds of 1 local epoch for every share.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
