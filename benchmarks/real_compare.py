"""Compare the strategies on any federation of sites, from any ABIDE data folder.

The comparison protocol of ``paper_table.py`` (every strategy on every (fold, repetition)
cell, each repetition re-drawing every site's split, each run's result at its round with
the lowest mean validation loss, corrected intervals, majority-class and motion-only
rows, paired differences of FedBN against every other row, subject-level McNemar and
DeLong tests), on the sites ``--sites`` names instead of the paper's four. Each site is a
file in ``sites/``; ``--data-dir`` is the folder holding ``ABIDE_pcp/`` (the real ABIDE
Preprocessed release, or any release in its layout).

    python benchmarks/real_compare.py --data-dir DIR --sites PITT,YALE,KKI,TRINITY
                                      [--strategies fedavg,fedbn,fedbn:linear] [--quick]
                                      [--rounds R] [--workers N]
                                      [--folds N] [--seeds S] [--weighting samples|equal]
                                      [--connectivity correlation|tangent]
                                      [--model mlp|linear] [--weight-decay W]
                                      [--batch-size B] [--windows W] [--fd-regression]

``--connectivity tangent`` runs every strategy on tangent-space features (each site's
reference fitted on its own training subjects) and publishes apart from the default's
table, under ``real_compare-real-<sites>-tangent``. ``--model linear`` (the task's
logistic regression on standardised features) and ``--weight-decay`` likewise publish
apart, e.g. ``real_compare-real-<sites>-tangent-linear-wd10``; so does ``--batch-size``
(``-b8``), which on small sites sets how many local steps each takes per round, and
``--windows`` (``--windows 0``: one whole-series correlation vector per subject, the
default before the nested defaults sweep chose windows of 32 volumes; ``-w0``).
``--fd-regression`` removes, within each site's training rows, every feature's linear
dependence on mean framewise displacement (``-fdreg``): the motion-only row then says how
much a model could have learnt from motion alone, and this table how much is left.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
from collections.abc import Sequence

from _common import LABELS, Benchmark, Budget, make_parser, strategy_config
from _sweep import publish_site_comparison

from fedbn_med.tasks.abide.settings import CONNECTIVITY, DEFAULTS, MODELS, Settings

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


def _label(name: str) -> str:
    """Return a row's label: ``FedBN``, or ``FedBN linear`` for ``fedbn:linear``."""
    strategy, _, model = name.partition(":")
    return LABELS.get(strategy, strategy) + (f" {model}" if model else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run every strategy on every (fold, seed) of the given sites; publish the tables."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=ROUNDS, folds=5, seeds=3),
                         quick=Budget(rounds=3, folds=1, seeds=1))
    parser.add_argument("--strategies", type=_names, default=STRATEGIES,
                        help=f"comma-separated strategies (default {','.join(STRATEGIES)})")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes that run the (fold, seed) cells at once (default 1; "
                             "the numbers do not depend on it)")
    parser.add_argument("--weighting", choices=("samples", "equal"), default="samples",
                        help="how shared weights are averaged (default samples)")
    default = Settings().connectivity
    parser.add_argument("--connectivity", choices=CONNECTIVITY, default=default,
                        help=f"the connectivity features (default: the task's, {default}); "
                             "another is published apart")
    parser.add_argument("--model", choices=MODELS, default=Settings().model,
                        help=f"the network (default: the task's, {Settings().model}); another "
                             "is published apart")
    parser.add_argument("--weight-decay", type=float, default=Settings().weight_decay,
                        help="L2 penalty of the local optimiser (default: the task's, "
                             f"{Settings().weight_decay:g}); another is published apart")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"],
                        help=f"mini-batch size at every site (default: the main job's, "
                             f"{DEFAULTS['batch_size']}); another is published apart. On "
                             "small sites it sets the local steps per round "
                             "(benchmarks/research/local_steps.py)")
    windows = Settings().windows
    parser.add_argument("--windows", type=int, default=None,
                        help=f"correlation windows of this many volumes (default: the task's, "
                             f"{windows} every {Settings().window_step}); 0: whole-series "
                             "correlations. Another is published apart (-w0)")
    parser.add_argument("--fd-regression", action="store_true",
                        help="regress every feature on mean FD within each site's training "
                             "rows first (published apart, -fdreg)")
    bench = Benchmark(parser, argv)
    args = bench.args
    if args.windows is not None and not (args.windows == 0 or args.windows >= 3):
        parser.error(f"--windows must be 0 or a window length of at least 3, got "
                     f"{args.windows}")
    if args.connectivity != "correlation" and args.windows:
        parser.error(f"--windows {args.windows} cuts correlation windows; it does not combine "
                     f"with --connectivity {args.connectivity}")
    if args.windows is None:
        # Tangent space is fitted on whole series: it has no windows.
        args.windows = windows if args.connectivity == "correlation" else 0
    if args.batch_size < 2:
        parser.error(f"--batch-size must be at least 2 (batch norm), got {args.batch_size}")
    features = args.connectivity
    if not (args.weight_decay >= 0 and args.weight_decay < float("inf")):
        parser.error(f"--weight-decay must be a finite number >= 0, got {args.weight_decay}")
    parts = [features if features != default else "",
             args.model if args.model != Settings().model else "",
             f"wd{args.weight_decay:g}" if args.weight_decay != Settings().weight_decay else "",
             f"b{args.batch_size}" if args.batch_size != DEFAULTS["batch_size"] else "",
             f"w{args.windows}" if features == "correlation" and args.windows != windows
             else "", "fdreg" if args.fd_regression else "",
             "linear_rows" if any(":" in s for s in args.strategies) else ""]
    bench.set_variant("-".join(p for p in parts if p) or None)
    from fedbn_med.fl.registry import STRATEGIES as KNOWN

    unknown = [s for s in args.strategies if s.partition(":")[0] not in KNOWN
               or s.partition(":")[2] not in ("", *MODELS)]
    if unknown:
        parser.error(f"unknown strategy {unknown[0]!r} in --strategies; valid strategies: "
                     f"{', '.join(sorted(KNOWN))}, each optionally with ':MODEL' (MODEL "
                     f"one of {', '.join(MODELS)})")
    sites = args.sites = tuple(args.sites or SITES)
    specs = {_label(s): strategy_config(bench, s.partition(":")[0], sites=sites,
                                        weighting=args.weighting, connectivity=features,
                                        model=s.partition(":")[2] or args.model,
                                        windows=args.windows,
                                        weight_decay=args.weight_decay,
                                        batch_size=args.batch_size,
                                        fd_regression=args.fd_regression)
             for s in args.strategies}
    data = args.data_dir or "the built-in cohort"
    spec = next(iter(specs.values()))
    shape = (f"correlation windows of {spec.settings.windows} volumes every "
             f"{spec.settings.window_step} (a test subject scores the mean of its windows)"
             if spec.settings.windows else f"whole-series {features}")
    fdreg = ("mean FD regressed out of every feature on each site's training rows; "
             if args.fd_regression else "")
    notes = (f"Sites {', '.join(sites)} from {data}; features: {shape}; {fdreg}"
             f"{'model ' + args.model + '; ' if args.model != Settings().model else ''}"
             f"{f'weight decay {args.weight_decay:g}; ' if parts[2] else ''}"
             f"{spec.settings.optimizer.upper()} lr "
             f"{spec.lr:g}, batch {spec.batch_size}, {spec.local_epochs} local epoch(s) per "
             f"round, dropout {spec.dropout:g}, weighting {args.weighting}.")
    return publish_site_comparison(
        bench, specs, sites, notes=notes, workers=args.workers,
        title=f"ABIDE {', '.join(sites)}: {args.rounds} rounds, {len(bench.cells)} cells")


if __name__ == "__main__":
    raise SystemExit(main())
