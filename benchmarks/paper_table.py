"""Reproduce the FedBN paper's ABIDE table under the comparison protocol.

Every strategy trains on every (fold, repetition) cell: the 5 test folds of every site's
split times 3 repetitions by default, each repetition re-drawing every site's split.
SingleSet, FedAvg, FedProx (mu = 0.01), FedBN and Centralized use the main job's defaults
(SGD, batch 32, one local epoch per round as in the paper; lr 3e-3, chosen on shared real
sites, where the paper used 1e-2). Each run's result is its round with
the lowest mean validation loss (:mod:`fedbn_med.evaluation.comparison`); the tables give balanced
accuracy, AUC and accuracy as mean [corrected 95 % CI] over the cells, with a
majority-class and a motion-only (mean FD) row, the paired differences of FedBN against
every other row (naive and corrected intervals), and subject-level McNemar and DeLong
tests on the pooled out-of-fold predictions (written to ``predictions.csv``), and a
verdict against the paper's figures: FedBN's site-mean accuracy against its 68.7 %,
FedBN - FedAvg and FedBN - SingleSet (corrected), and FedBN's one-class site results
(``_paper_target.py``). On the held-out real sites this is the team's target check.

    python benchmarks/paper_table.py [--quick] [--data-dir DIR] [--rounds R] [--folds N]
                                     [--seeds S] [--weighting samples|equal]
                                     [--strategies singleset,fedavg,...,silobn,...]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
from collections.abc import Sequence

from _common import LABELS, Benchmark, Budget, make_parser, strategy_config
from _paper_target import target_section
from _sweep import publish_site_comparison

from fedbn_med.tasks.abide.settings import COMPARE

NAME = "paper_table"
STRATEGIES = ("singleset", "fedavg", "fedprox", "fedbn", "centralized")
SITES = ("NYU", "USM", "UM", "UCLA")  # the paper's column order
ROUNDS = 100
PAPER = """Paper (FedBN, ICLR 2021), accuracy (%) mean (std) over 5 runs:

| method | NYU | USM | UM | UCLA | mean |
|---|---|---|---|---|---|
| SingleSet | 58.0 (3.3) | 73.4 (2.2) | 64.3 (1.4) | 57.3 (2.4) | 63.3 |
| FedAvg | 62.7 (1.7) | 73.1 (2.4) | 70.7 (0.5) | 64.7 (0.7) | 67.8 |
| FedProx | 63.3 (1.0) | 73.0 (1.8) | 70.5 (1.1) | 64.5 (1.2) | 67.8 |
| FedBN | 65.6 (1.1) | 75.1 (1.4) | 68.6 (2.9) | 65.5 (1.0) | 68.7 |"""


def _strategies(text: str) -> tuple[str, ...]:
    """Parse a comma-separated list of strategies of ``--compare`` (an argparse ``type``)."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [n for n in names if n not in COMPARE]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected strategies among {','.join(COMPARE)}, "
                                         f"got {text!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Run every strategy on every (fold, seed) and publish the protocol's tables."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=ROUNDS, folds=5, seeds=3),
                         quick=Budget(rounds=3, folds=1, seeds=1))
    parser.add_argument("--weighting", choices=("samples", "equal"), default="samples",
                        help="how shared weights are averaged (default samples)")
    parser.add_argument("--strategies", type=_strategies, default=STRATEGIES,
                        help=f"comma-separated strategies (default {','.join(STRATEGIES)}; "
                             "all the baselines that isolate FedBN's mechanism: "
                             f"{','.join(COMPARE)})")
    bench = Benchmark(parser, argv)
    specs = {LABELS.get(s, s): strategy_config(bench, s, sites=SITES,
                                               weighting=bench.args.weighting)
             for s in bench.args.strategies}
    return publish_site_comparison(
        bench, specs, SITES, notes=PAPER,
        title=f"ABIDE, {bench.args.rounds} rounds, {len(bench.cells)} cells",
        extra=target_section)


if __name__ == "__main__":
    raise SystemExit(main())
