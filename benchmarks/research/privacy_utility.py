"""Privacy against utility: FedBN and FedAvg under client-level DP at several epsilons.

For each target epsilon (delta 1e-5 by default) the noise multiplier sigma that spends
exactly it over ``--rounds`` rounds is found with Opacus's RDP accountant (sampling rate
1: every site releases an update every round); every site clips its update to ``--clip``
and adds N(0, (sigma C)^2) per coordinate (:mod:`fedbn_med.fl.privacy`). Balanced accuracy
(per site and its site mean) and the site-mean AUC are on each site's test split at the
run's selected round (the lowest mean validation loss over the
sites, :meth:`fedbn_med.training.inprocess.History.best_round`), mean [corrected 95 % CI]
over the (fold, seed) cells, with the majority-class and motion-only rows fitted on the
same cells; ``inf`` is the run without DP. The epsilon each site
reports is the whole run's (its last round's), and is checked against the target.

The noise is drawn from each run's seed (``dp_seeded_noise``), so the same command gives
the same table: an experiment on utility, not a private run, since anyone with the seed
can regenerate the noise. ``--fresh-noise`` draws it from the operating system instead,
as a private run does; the table then changes from one invocation to the next.

    python benchmarks/research/privacy_utility.py [--quick] [--epsilons inf,8,4,1] [--clip 0.1]
                                         [--fresh-noise]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import LABELS, Benchmark, Budget, make_parser, markdown_table, selected
from _plots import Panel, line_panels
from _sweep import corrected, half_width, interval_caption, references, run_grid

from fedbn_med.evaluation.comparison import REFERENCES
from fedbn_med.evaluation.tables import format_stats

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

NAME = "privacy_utility"
STRATEGIES = ("fedbn", "fedavg")
EPSILONS = (math.inf, 8.0, 4.0, 1.0)


def _epsilons(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected epsilons such as inf,8,4,1, got {text!r}"
                                         ) from None
    if not values or not all(v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive epsilons (inf: no DP), got "
                                         f"{text!r}")
    return values


def _eps_label(eps: float) -> str:
    return "inf (no DP)" if math.isinf(eps) else f"{eps:g}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run FedBN and FedAvg at every epsilon and fold; publish the scores per epsilon."""
    parser = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=30, folds=3),
                         quick=Budget(rounds=3, folds=1))
    parser.add_argument("--epsilons", type=_epsilons, default=EPSILONS,
                        help="target epsilons (default inf,8,4,1; inf: no DP)")
    parser.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    parser.add_argument("--clip", type=float, default=0.1,
                        help="clip norm C of every update (default 0.1, about the median "
                             "update norm of the ABIDE network at lr 0.01)")
    parser.add_argument("--fresh-noise", action="store_true",
                        help="draw the DP noise from the operating system (private, not "
                             "repeatable) instead of from each run's seed")
    bench = Benchmark(parser, argv)
    if not 0 < bench.args.delta < 1:
        parser.error(f"--delta must be in (0, 1), got {bench.args.delta}")
    if not (bench.args.clip > 0 and math.isfinite(bench.args.clip)):
        parser.error(f"--clip must be a positive number, got {bench.args.clip}")
    from fedbn_med.fl.privacy import noise_for_epsilon

    rounds, delta, clip = bench.args.rounds, bench.args.delta, bench.args.clip
    sigma = {eps: 0.0 if math.isinf(eps) else noise_for_epsilon(eps, delta, rounds)
             for eps in bench.args.epsilons}
    sites = bench.config().sites
    # acc[strategy][eps][site, "mean" or "auc"][(fold, seed)]: balanced accuracy per site,
    # its site mean, and the site-mean AUC; spent[...] = max epsilon reported
    acc: dict[str, dict[float, dict[str, dict[tuple[int, int], float]]]] = {
        s: {e: {k: {} for k in (*sites, "mean", "auc")} for e in sigma} for s in STRATEGIES}
    spent: dict[tuple[str, float], float] = {}
    # the same, one patient replaced by another rather than added or removed
    spent_replace: dict[tuple[str, float], float] = {}

    def spec(eps: float, strategy: str, fold: int, seed: int) -> RunSpec:
        dp = {} if math.isinf(eps) else {"dp_clip": clip, "dp_noise": sigma[eps],
                                         "dp_delta": delta,
                                         "dp_seeded_noise": not bench.args.fresh_noise}
        return bench.config(strategy=strategy, fold=fold, seed=seed, **dp)

    for eps, strategy, fold, seed, history in run_grid(bench, tuple(sigma), STRATEGIES, spec):
        final = history.selected  # DP figures in it are the whole run's
        for site in sites:
            acc[strategy][eps][site][fold, seed] = float(final[site]["test_balanced_accuracy"])
        acc[strategy][eps]["mean"][fold, seed] = selected(history, "test_balanced_accuracy")
        acc[strategy][eps]["auc"][fold, seed] = selected(history, "test_auc")
        reported = [float(m.get("dp_epsilon", math.inf)) for m in final.values()]
        spent[strategy, eps] = max(spent.get((strategy, eps), 0.0), max(reported))
        replaced = [float(m.get("dp_epsilon_replace_one", math.inf)) for m in final.values()]
        spent_replace[strategy, eps] = max(spent_replace.get((strategy, eps), 0.0),
                                           max(replaced))

    def stats(strategy: str, eps: float, key: str = "mean") -> tuple[float, float, float]:
        return corrected(acc[strategy][eps][key].values())

    header = ["method", "target epsilon", "sigma", "epsilon spent (max site)",
              "replace-one epsilon (max site)", *sites, "mean", "mean AUC"]
    body, rows = [], []
    for strategy in STRATEGIES:
        for eps in sigma:
            cells = [format_stats(*stats(strategy, eps, k)) for k in (*sites, "mean", "auc")]
            used, replace = spent[strategy, eps], spent_replace[strategy, eps]
            body.append([LABELS[strategy], _eps_label(eps), f"{sigma[eps]:.3g}",
                         *("inf" if math.isinf(v) else f"{v:.2f}" for v in (used, replace)),
                         *cells])
            rows.append({"method": LABELS[strategy], "target_epsilon": eps,
                         "sigma": sigma[eps], "clip": clip, "delta": delta,
                         "epsilon_spent": used, "epsilon_replace_one": replace,
                         "cells": len(bench.cells),
                         **{f"{'auc' if k == 'auc' else 'balanced_accuracy'}_"
                            f"{'mean' if k == 'auc' else k}_{part}": value
                            for k in ("mean", *sites, "auc")
                            for part, value in zip(("mean", "low", "high"),
                                                   stats(strategy, eps, k))}})
    reference = references(bench)
    for name in REFERENCES:  # no DP, no training: the same cells' floor
        cells = [format_stats(*corrected(reference.values(name, "best", metric, site)
                                         .values()))
                 for site, metric in [*((k, "balanced_accuracy") for k in sites),
                                      ("mean", "balanced_accuracy"), ("mean", "auc")]]
        body.append([name, "n/a", "n/a", "n/a", "n/a", *cells])
    table = (f"Test balanced accuracy (%) per site and its site mean, and the site-mean test "
             f"AUC, under client-level DP at the selected round (lowest mean validation "
             f"loss), {interval_caption(len(bench.cells))}; {rounds} rounds, clip C = "
             f"{clip:g}, delta = {delta:g}, sampling rate 1; the reference rows are fitted "
             f"on the same cells\n\n" + markdown_table(header, body))

    def plot(path: Path) -> Path:
        finite = [e for e in sigma if not math.isinf(e)]
        series = {}
        for strategy in STRATEGIES:
            points = [stats(strategy, e) for e in finite]
            series[LABELS[strategy]] = (finite, [100 * m for m, _, _ in points],
                                        [half_width(p) for p in points])
        base = [stats("fedbn", e)[0] for e in sigma if math.isinf(e)]
        panel = Panel(series, "epsilon (log scale)",
                      "mean test balanced accuracy (%), corrected 95 % CI",
                      xlog=True, hline=100 * base[0] if base else None)
        return line_panels(path, [panel], title=f"ABIDE, client-level DP, delta {delta:g} "
                                                "(dashed: FedBN without DP)")

    notes = ("sigma is the noise multiplier that spends the target epsilon over the run's "
             "rounds (Opacus RDP accountant); each site's epsilon is what it reported: for "
             "adding or removing one patient, and for replacing one patient by another "
             "(the larger; both at the same delta). "
             + ("The noise was drawn from the operating system (--fresh-noise): a rerun "
                "gives other figures." if bench.args.fresh_noise else
                "The noise was drawn from each run's seed, so the table repeats; such noise "
                "is for experiments and is not private (--fresh-noise draws it as a "
                "private run does)."))
    bench.publish(table, rows, plot, notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
