"""The main job's default settings on every fold: the selected round, per site and fold.

``python pipelines/abide_fedbn.py`` runs one fold (0) of the default spec. This runs the
same spec (in this process: the same numbers as over Flower) on each fold and reports
each run as the pipeline does: at its selected round, the one with the lowest mean
validation loss over the sites (:meth:`fedbn_med.training.inprocess.History.best_round`, the
protocol's rule), with the last round beside it. Per fold it prints each site's test
accuracy / balanced accuracy / AUC at that round, the site means, the mean majority rate
(what predicting each site's training majority scores), the mean AUC of the motion-only
row (a logistic regression of the diagnosis on mean FD, fitted on each site's training
split of the same fold), the last round's mean accuracy, and the sites whose model
predicts one class only; then the folds' per-site table of the first fold as the
pipeline prints it.

    python benchmarks/research/default_run.py [--quick] [--folds 5] [--rounds R]
        [--sites PITT,YALE,KKI,TRINITY --data-dir REAL]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import markdown_table, scratch_dir

from fedbn_med import run

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

NAME = "default_run"
#: --quick: the first fold, 5 rounds.
QUICK = {"folds": 1, "rounds": 5}


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add the options of a run of the default spec on folds (shared with numerics.py)."""
    parser.add_argument("--quick", action="store_true",
                        help=f"CI-sized run: {QUICK['folds']} fold, {QUICK['rounds']} rounds")
    parser.add_argument("--folds", type=int, default=None, help="folds 0..N-1 (default 5)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="communication rounds (default: the task's)")
    parser.add_argument("--sites", default=None,
                        help="comma-separated sites (default: the task's)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder holding ABIDE_pcp/ (real ABIDE); default: the built-in "
                             "cohort")
    parser.add_argument("--publish", action="store_true",
                        help="also copy the results into benchmarks/published/ and rewrite "
                             "the README's block for them")


def checked_folds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Validate the options of :func:`add_options`; return the number of folds."""
    folds = args.folds or (QUICK["folds"] if args.quick else 5)
    if not 1 <= folds <= 5:
        parser.error(f"--folds must be from 1 to 5 (the folds of the split), got {folds}")
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds must be a positive integer, got {args.rounds}")
    if args.data_dir is not None and not (args.data_dir / "ABIDE_pcp").is_dir():
        parser.error(f"--data-dir must hold ABIDE_pcp/ (the ABIDE Preprocessed layout); "
                     f"{args.data_dir} does not")
    return folds


def default_spec(args: argparse.Namespace) -> RunSpec:
    """Return the task's default spec with the options of :func:`add_options` applied."""
    from fedbn_med.spec import RunSpec

    overrides: dict[str, object] = {}
    if args.rounds is not None or args.quick:
        overrides["rounds"] = args.rounds or QUICK["rounds"]
    if args.sites:
        overrides["sites"] = tuple(s.strip() for s in args.sites.split(",") if s.strip())
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir.expanduser().resolve()
    return RunSpec.for_task("abide", **overrides)


def _motion_auc(spec: RunSpec) -> dict[str, float]:
    """Return the motion-only row's test AUC per site of the spec's fold, and the mean."""
    from fedbn_med.evaluation.cell_data import prepare_sites
    from fedbn_med.evaluation.comparison import MOTION
    from fedbn_med.evaluation.references import reference_cells

    cells = reference_cells(spec.fold, spec.seed, prepare_sites(spec))
    return next(c for c in cells if c.strategy == MOTION).scores["best"]["auc"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the default spec on each fold and print the per-fold, per-site table."""
    parser = argparse.ArgumentParser(prog=f"benchmarks/{NAME}.py",
                                     description=__doc__.splitlines()[0])
    add_options(parser)
    args = parser.parse_args(argv)
    folds = checked_folds(parser, args)
    started = time.perf_counter()
    spec = default_spec(args)
    body, below, one_class, total, first_table = [], 0, 0, 0, ""
    rows: list[dict[str, object]] = []
    for fold in range(folds):
        result = run(spec.replace(fold=fold), workdir=scratch_dir())
        motion = _motion_auc(spec.replace(fold=fold))
        sel, last = result.selected, result.last
        accs = [float(sel[s]["test_accuracy"]) for s in spec.sites]
        bals = [float(sel[s]["test_balanced_accuracy"]) for s in spec.sites]
        majority = [float(sel[s].get("test_majority_rate", float("nan"))) for s in spec.sites]
        below += sum(a < 0.5 for a in accs)
        one_class += len(result.one_class)
        total += len(accs)
        cells = [f"{_pct(sel[s]['test_accuracy'])} / {_pct(sel[s]['test_balanced_accuracy'])}"
                 f" / {_pct(sel[s]['test_auc'])}" for s in spec.sites]
        body.append([fold, f"{result.selected_round} of {result.last_round}", *cells,
                     _pct(sum(accs) / len(accs)), _pct(sum(bals) / len(bals)),
                     _pct(sum(majority) / len(majority)), _pct(motion["mean"]),
                     _pct(sum(float(last[s]["test_accuracy"]) for s in spec.sites)
                          / len(spec.sites)),
                     ", ".join(result.one_class) or "none"])
        rows.extend({"fold": fold, "site": s, "selected_round": result.selected_round,
                     "last_round": result.last_round,
                     **{f"{k}": sel[s].get(f"test_{k}", float("nan"))
                        for k in ("n", "accuracy", "balanced_accuracy", "auc",
                                  "majority_rate", "positive_rate")},
                     "motion_only_auc": motion[s],
                     "last_accuracy": last[s]["test_accuracy"]} for s in spec.sites)
        if fold == 0:
            first_table = result.table
    table = markdown_table(
        ["fold", "selected round", *[f"{s} acc / bal. acc / AUC (%)" for s in spec.sites],
         "mean acc (%)", "mean bal. acc (%)", "mean majority rate (%)",
         "motion only: mean AUC (%)",
         "last round: mean acc (%)", "one class only"], body)
    data = "built-in cohort" if args.data_dir is None else f"real ABIDE ({args.data_dir})"
    print(f"{spec.label}, {spec.rounds} rounds, seed {spec.seed}, {data}; test split at the "
          "selected round (lowest mean validation loss over the sites)\n")
    print(table)
    print(f"\nFold 0, per site, as the pipeline prints it:\n\n{first_table}")
    summary = (f"(fold, site) results below 50 % accuracy: {below} of {total}; predicting "
               f"one class only: {one_class} of {total}")
    print(f"\n{summary}; {time.perf_counter() - started:.1f} s")
    if args.publish:
        from _published import describe_data, publish, publish_key

        from fedbn_med.evaluation.report import csv_text

        real = args.data_dir is not None
        what = describe_data(spec.sites, real)
        report = (f"{table}\n\nFold 0, per site, as the pipeline prints it:\n\n"
                  f"{first_table}\n\n{summary}.")
        folder = publish(publish_key(NAME, spec.sites, real), name=NAME, argv=argv,
                         report=report, csv_text=csv_text(rows), data=what,
                         protocol=(f"{spec.label}, {spec.rounds} rounds, folds 0-{folds - 1} "
                                   f"of 5, seed {spec.seed}; each fold's result at its round "
                                   "with the lowest mean validation loss; Wilson 95 % "
                                   "intervals per site"),
                         wall_time_s=time.perf_counter() - started)
        print(f"published to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
