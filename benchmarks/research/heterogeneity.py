"""Feature-shift strength: the FedBN minus FedAvg accuracy gap as site effects grow.

The built-in cohort is generated at each ``site_effect`` (0: the sites differ only in
who they recruit, no scanner effect; 1: realistic ABIDE-like scanner effects; 2: twice
as strong). FedBN's advantage comes from site-specific feature shift, so at 0 the gap's
interval should include 0. Each strength runs every (fold, seed) cell; the gap is the
paired FedBN - FedAvg difference at the best-validation round, with its 95 % interval.
Real ABIDE has one, fixed site effect per federation. With ``--data-dir`` the benchmark
runs its real-data version instead: several federations of shared real sites (``--groups``),
each with its feature shift measured on the training subjects (the location and scale
site effects of :func:`fedbn_med.tasks.abide.cohort.calibration.site_effect_figures`)
beside its paired FedBN - FedAvg gap. The federations differ in size and sites as well
as in shift, so this version observes; only the cohort's varies the shift alone.

    python benchmarks/research/heterogeneity.py [--quick] [--site-effects 0,0.5,1,2]
    python benchmarks/research/heterogeneity.py --data-dir DIR [--groups A1,A2/B1,B2/...]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import Benchmark, Budget, float_list, make_parser, markdown_table, strategy_config
from _plots import Panel, line_panels
from _sweep import corrected, gap, half_width, interval_caption, references, summary, sweep
from defaults_sweep import _groups

from fedbn_med.evaluation.tables import format_stats
from fedbn_med.tasks.abide.sites import load_sites

if TYPE_CHECKING:
    from fedbn_med.evaluation.comparison import Comparison
    from fedbn_med.spec import RunSpec

NAME = "heterogeneity"
STRATEGIES = ("fedbn", "fedavg")
SITE_EFFECTS = (0.0, 0.5, 1.0, 2.0)
QUICK_SITE_EFFECTS = (0.0, 1.0)
#: The real federations of shared sites (the defaults sweep's two, then five small sites).
REAL_GROUPS = (("PITT", "YALE", "KKI", "TRINITY"), ("MAX_MUN", "STANFORD", "CALTECH", "SDSU"),
               ("OLIN", "LEUVEN_2", "SBL", "LEUVEN_1", "OHSU"))
METRIC = "balanced_accuracy"  # headline metric


def _effects(text: str) -> tuple[float, ...]:
    values = float_list(text)
    if not all(v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative site effects such as "
                                         f"0,0.5,1,2, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """Run FedBN and FedAvg on cohorts of growing site effect and publish the paired gap."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=100, folds=5, seeds=3),
                         quick=Budget(rounds=3, folds=1, seeds=1))
    parser.add_argument("--site-effects", type=_effects, default=None,
                        help="strengths of the cohort's site effects (default "
                             f"{','.join(map(str, SITE_EFFECTS))}; "
                             f"{','.join(map(str, QUICK_SITE_EFFECTS))} with --quick)")
    parser.add_argument("--groups", type=_groups, default=None,
                        help="with --data-dir: federations of real sites, sites comma-"
                             "separated, groups split by '/' (default "
                             + "/".join(",".join(g) for g in REAL_GROUPS) + ")")
    bench = Benchmark(parser, argv)
    if bench.args.data_dir is not None:
        if bench.args.site_effects is not None:
            parser.error("--site-effects varies the built-in cohort; real ABIDE has one "
                         "fixed site effect per federation (omit --site-effects or "
                         "--data-dir)")
        return _real(bench, bench.args.groups or {
            chr(ord("A") + i): g for i, g in enumerate(REAL_GROUPS)})
    if bench.args.groups is not None:
        parser.error("--groups needs --data-dir (federations of real sites)")
    effects = bench.args.site_effects or (
        QUICK_SITE_EFFECTS if bench.args.quick else SITE_EFFECTS)

    def spec(effect: float, strategy: str, fold: int, seed: int) -> RunSpec:
        return strategy_config(bench, strategy, fold=fold, seed=seed, site_effect=effect)

    comparisons = sweep(bench, effects, STRATEGIES, spec)

    header = ["site effect", "FedBN (%)", "FedAvg (%)", "FedBN - FedAvg (pp) [95 % CI]",
              "at last round (pp) [95 % CI]", *REFERENCE_HEADER]
    body, rows, gaps = [], [], {}
    for e, comparison in comparisons.items():
        gaps[e], cells = _gap_cells(comparison)
        refs, ref_cells = _reference_cells(bench, site_effect=e)
        body.append([f"{e:g}", *cells, *ref_cells])
        rows += [{"site_effect": e, **row} for row in comparison.rows() + refs.rows()]
    table = ("Test balanced accuracy, mean over sites, at the round with the lowest mean "
             f"validation loss; {interval_caption(len(bench.cells))}; the gap is paired by "
             f"cell. {REFERENCE_CAPTION}\n\n" + markdown_table(header, body))

    def plot(path: Path) -> Path:
        xs = list(effects)
        ys = [100 * gaps[e][0] for e in effects]
        errs = [100 * (gaps[e][2] - gaps[e][0]) if not math.isnan(gaps[e][2]) else 0.0
                for e in effects]
        return line_panels(path, [
            Panel({"FedBN - FedAvg": (xs, ys, errs)}, "site effect strength",
                  "balanced accuracy gap (pp), corrected 95 % CI", hline=0.0),
        ], title=f"ABIDE-format cohort, {bench.args.rounds} rounds, "
                 f"{len(bench.cells)} cells")

    metrics = {f"gap.effect_{e:g}.{k}": v for e, (m, lo, hi) in gaps.items()
               for k, v in (("mean", m), ("ci_low", lo), ("ci_high", hi)) if not math.isnan(v)}
    bench.publish(table, rows, plot, metrics=metrics)
    return 0


def _gap_cells(comparison: Comparison) -> tuple[tuple[float, float, float], list[str]]:
    """Return the paired FedBN - FedAvg gap, and the row's cells: each strategy, the gap
    at the best-validation round and at the last round."""
    best = gap(comparison, "fedbn", "fedavg", metric=METRIC)
    last = gap(comparison, "fedbn", "fedavg", metric=METRIC, at="last")
    return best, [*(format_stats(*summary(comparison, s, metric=METRIC)) for s in STRATEGIES),
                  format_stats(*best, signed=True), format_stats(*last, signed=True)]


#: The reference rows' columns: fitted per site on each cell's training subjects.
REFERENCE_HEADER = ("majority class (%)", "motion only (%)", "ridge, pooled (%)",
                    "ridge, site only (%)")
REFERENCE_CAPTION = ("The majority class and motion alone (a logistic regression on mean "
                     "FD) are fitted per site on the training subjects of the same cells and "
                     "predict at 0.5, as in every comparison (the methods at the run's "
                     "threshold); the ridge rows are ridge regressions on whole-series "
                     "connectivity z-scored per site, pooled or per site, fitted on the "
                     "same training subjects with the penalty chosen by leave-one-out there")


def _reference_cells(bench: Benchmark, **changes: object) -> tuple[Comparison, list[str]]:
    """Return the reference rows of a federation's cells and their table cells."""
    from fedbn_med.evaluation.comparison import REFERENCES

    refs = references(bench, **changes)
    return refs, [format_stats(*corrected(refs.values(n, "best", METRIC).values()))
                  for n in REFERENCES]


def _real(bench: Benchmark, groups: Mapping[str, tuple[str, ...]]) -> int:
    """Run FedBN and FedAvg on each real federation; tabulate its shift and the gap."""
    from fedbn_med.tasks.abide.cohort.calibration import load_samples, site_effect_figures

    for group in groups.values():
        try:
            load_sites(list(group))
        except ValueError as err:
            bench.parser.error(f"--groups: {err}")
    names = dict(groups)  # named by --groups (``C=...``), else A, B, ... by position
    # measured on each site's training and validation subjects only (no test subject)
    shift = {k: site_effect_figures(load_samples(bench.args.data_dir, g, part="train"))
             for k, g in names.items()}

    def spec(group: str, strategy: str, fold: int, seed: int) -> RunSpec:
        return strategy_config(bench, strategy, fold=fold, seed=seed, sites=names[group])

    comparisons = sweep(bench, tuple(names), STRATEGIES, spec)
    header = ["federation", "sites", "location effect", "scale effect", "FedBN (%)",
              "FedAvg (%)", "FedBN - FedAvg (pp) [95 % CI]", "at last round (pp) [95 % CI]",
              *REFERENCE_HEADER]
    body, rows, gaps = [], [], {}
    for k, comparison in comparisons.items():
        gaps[k], cells = _gap_cells(comparison)
        refs, ref_cells = _reference_cells(bench, sites=names[k])
        body.append([k, ", ".join(names[k]), f"{shift[k]['location']:.3f}",
                     f"{shift[k]['scale']:.3f}", *cells, *ref_cells])
        rows += [{"federation": k, "sites": ";".join(names[k]),
                  "location_effect": round(shift[k]["location"], 6),
                  "scale_effect": round(shift[k]["scale"], 6), **row}
                 for row in comparison.rows() + refs.rows()]
    table = (f"Test balanced accuracy, mean over sites, at the round with the lowest mean "
             f"validation loss; {interval_caption(len(bench.cells))}; the gap is paired by "
             "cell. Location effect: median over edges of the between-site SD of the edge "
             "means over the pooled within-site SD (sampling noise removed); scale effect: "
             "the SD across sites of each edge's log SD (noise removed); both on the sites' "
             f"training and validation subjects. {REFERENCE_CAPTION}\n\n"
             + markdown_table(header, body))
    bench.real_groups = names

    def plot(path: Path) -> Path:
        xs = [shift[k]["location"] for k in names]
        ys = [100 * gaps[k][0] for k in names]
        errs = [half_width(gaps[k]) for k in names]
        return line_panels(path, [
            Panel({"FedBN - FedAvg": (xs, ys, errs)}, "measured location site effect",
                  "balanced accuracy gap (pp), corrected 95 % CI", hline=0.0),
        ], title=f"real federations {', '.join(names)}, {bench.args.rounds} rounds")

    metrics = {f"gap.{k}.{n}": v for k, (m, lo, hi) in gaps.items()
               for n, v in (("mean", m), ("ci_low", lo), ("ci_high", hi)) if not math.isnan(v)}
    bench.publish(table, rows, plot, metrics=metrics,
                  protocol="each run at its best-validation-loss round; mean [95 % CI] over "
                           "the cells, corrected for shared subjects (Nadeau-Bengio)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
