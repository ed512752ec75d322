"""Sweep the main job's defaults one at a time on two federations, choosing on validation only.

The main job is FedBN on ABIDE (``pipelines/abide_fedbn.py``). Each default (optimiser
and learning rate, weight decay, dropout, local epochs, stopping rule, feature
transform) is varied alone around the current default, every other setting kept, on
two federations of shared sites (group A: PITT, YALE, KKI, TRINITY; group B: MAX_MUN,
STANFORD, CALTECH, SDSU), in process (the same numbers as over Flower). Every run is
scored at its best-validation-loss round. The criterion, fixed before any result was
seen, is the mean over sites and cells of the validation AUC (:mod:`_sweep_grid`); a
value replaces a default only where it is best in both groups and beats the default
in both. Test balanced accuracy and AUC are printed beside, for information, with the
corrected resampled-t interval (Nadeau-Bengio) over the cells.

The validation AUC at the round the validation loss picked is biased upwards, the more
so the noisier a value's validation curve. ``--nested`` removes that bias: each outer
fold's training part is split again (:func:`fedbn_med.tasks.abide.splits.nested_split`,
``--inner-folds`` folds), every run trains on the inner training subjects, picks its
round on the inner validation subjects and is scored on the inner test subjects, and
the criterion is that inner-test AUC. No outer test subject is trained on, fitted on or
scored, so no test column is printed. It publishes apart (``defaults_sweep-real-nested``).

    python benchmarks/research/defaults_sweep.py --data-dir DIR [--quick] [--rounds R] [--folds N]
        [--seeds S] [--groups PITT,YALE,KKI,TRINITY/MAX_MUN,STANFORD,CALTECH,SDSU]
        [--axes optimiser,features] [--resume] [--no-confirm] [--nested [--inner-folds K]]

Every run is appended to ``cells.csv`` in the output folder as it ends; ``--resume``
skips the runs already there (same groups, settings, fold, seed and rounds).
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import (
    N_FOLDS,
    Benchmark,
    Budget,
    make_parser,
    markdown_table,
    positive_int,
    scratch_dir,
)
from _plots import bar_plot
from _sweep import inner_datas, inner_references
from _sweep_grid import (
    AXES,
    CRITERION,
    QUICK_AXES,
    SCORES,
    WINDOW_STEP,
    Summary,
    Value,
    cell_scores,
    choose,
    combine_intervals,
    summarise,
)

from fedbn_med import run

NAME = "defaults_sweep"
GROUPS = (("PITT", "YALE", "KKI", "TRINITY"), ("MAX_MUN", "STANFORD", "CALTECH", "SDSU"))
FIELDS = ("group", "config", "rounds", "fold", "seed", "inner", "inner_folds", "best_round",
          "last_round",
          *[f"{s}_{at}" for at in ("best", "last") for s in SCORES], "seconds")


_GROUP_NAME = re.compile(r"[A-Z]")


def _groups(text: str) -> dict[str, tuple[str, ...]]:
    """Parse ``A1,A2/B1,B2`` (an argparse ``type``): ``{name: sites}`` of groups split by ``/``.

    A group is named by its position (A, B, ...) unless it says ``NAME=`` first, one
    capital letter, e.g. ``C=OLIN,SBL`` for a federation that other tables call C.
    """
    groups: dict[str, tuple[str, ...]] = {}
    for i, part in enumerate(text.split("/")):
        name, _, sites_text = part.rpartition("=")
        name = name.strip() or chr(ord("A") + i)
        sites = tuple(s.strip() for s in sites_text.split(",") if s.strip())
        if len(sites) < 2 or not _GROUP_NAME.fullmatch(name) or name in groups:
            raise argparse.ArgumentTypeError(
                f"expected groups of at least two comma-separated sites split by '/', each "
                f"optionally named by one capital letter and '=' (names distinct), such as "
                f"PITT,YALE/KKI,TRINITY or C=OLIN,SBL, got {text!r}")
        groups[name] = sites
    return groups


def add_groups_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--groups`` (default :data:`GROUPS` with ``--data-dir``, else the cohort's sites)."""
    parser.add_argument("--groups", type=_groups, default=None,
                        help="federations, sites comma-separated, groups split by '/' "
                             "(default with --data-dir: " + "/".join(",".join(g) for g in GROUPS)
                             + "; on the built-in cohort its four sites)")


def resolve_groups(bench: Benchmark, base: Any) -> dict[str, tuple[str, ...]]:
    """Return ``{"A": sites, ...}`` of ``--groups`` (see :func:`add_groups_option`).

    Every site must have a file in ``sites/``; the groups become the benchmark's
    published data (``bench.real_groups``).
    """
    from fedbn_med.tasks.abide.sites import load_sites

    args = bench.args
    groups = dict(args.groups) if args.groups else {
        chr(ord("A") + i): tuple(g)
        for i, g in enumerate(GROUPS if args.data_dir is not None else (base.sites,))}
    for group in groups.values():
        try:
            load_sites(list(group))
        except ValueError as err:
            bench.parser.error(f"--groups: {err}")
    bench.real_groups = groups
    return groups


def sweep_variant(args: argparse.Namespace) -> str | None:
    """Return the published variant: ``nested`` and, for groups other than
    :data:`GROUPS`, their sites and the ``--axes`` swept, so that a sweep on other
    federations is published beside the main sweep's table, not over it, and two such
    sweeps of other axes beside each other; a sweep of some axes only, on any groups, is
    published beside the sweep of every axis too (``None``: the main sweep itself)."""
    parts = ["nested"] if args.nested else []
    # in the grid's order, so that one sweep has one key however its axes were listed
    axes = tuple(sorted(getattr(args, "axes", None) or (), key=list(AXES).index))
    if args.data_dir is not None and args.groups is not None and tuple(
            tuple(g) for g in args.groups.values()) != GROUPS:
        # sites joined by "_", groups by "-" (no site name holds a "-")
        parts.extend("_".join(group) for group in args.groups.values())
        # a sweep of some axes on other groups: one table per set of axes
        parts.extend(axis.replace(" ", "_") for axis in axes)
    elif axes and set(axes) != set(AXES):
        parts.extend(axis.replace(" ", "_") for axis in axes)
    return "-".join(parts) or None


def _axes(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [n for n in names if n not in AXES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown axis {(unknown or [text])[0]!r}; valid axes: {', '.join(AXES)}")
    return names


def _key(spec: Any) -> str:
    return spec.replace(fold=0, seed=0).to_json()


class Sweep:
    """The runs of one invocation: unique settings per group, cached in ``cells.csv``."""

    def __init__(self, bench: Benchmark, base: Any, groups: Mapping[str, tuple[str, ...]],
                 inner_folds: int = 0) -> None:
        self.bench = bench
        self.base = base
        self.groups = dict(groups)
        #: 0: each run trains on its outer fold; K: K nested runs per outer fold
        self.inner_folds = inner_folds
        self.path = bench.out / "cells.csv"
        self.cells: dict[tuple[str, str, int, int, int], dict[str, Any]] = {}
        if bench.args.resume and self.path.is_file():
            with open(self.path, newline="", encoding="utf-8") as handle:
                reader = csv.DictReader(handle)
                if tuple(reader.fieldnames or ()) != FIELDS:
                    raise ValueError(
                        f"{self.path} has the columns {', '.join(reader.fieldnames or ())}, "
                        f"not this version's ({', '.join(FIELDS)}): its rows cannot be "
                        "resumed. Move it away, or run without --resume.")
                for row in reader:
                    # a run is reused only under the same rounds and the same nesting
                    if (int(row["rounds"]) == bench.args.rounds
                            and int(row["inner_folds"]) == inner_folds):
                        self.cells[(row["group"], row["config"], int(row["fold"]),
                                    int(row["seed"]), int(row["inner"]))] = row
        elif self.path.exists():
            self.path.unlink()

    def spec(self, group: str, value: Value) -> Any:
        """Return the run spec of a value in a group (fold and seed set per cell)."""
        return self.base.replace(sites=self.groups[group], **value.settings)

    def config(self, value: Value) -> str:
        """Return the name under which a value's runs are kept (shared by equal settings)."""
        spec = self.base.replace(**value.settings)
        if _key(spec) == _key(self.base):
            return "default"
        return ";".join(f"{k}={v}" for k, v in value.changes) or "default"

    def run_all(self, values: Sequence[Value], desc: str) -> None:
        """Run every (cell, group, distinct setting) of ``values`` not yet in the cache."""
        configs = dict.fromkeys(self.config(v) for v in values)
        by_config = {self.config(v): v for v in reversed(values)}
        inners = range(self.inner_folds) if self.inner_folds else (-1,)
        grid = [(fold, seed, inner, group, config) for fold, seed in self.bench.cells
                for inner in inners for group in self.groups for config in configs
                if (group, config, fold, seed, inner) not in self.cells]
        for fold, seed, inner, group, config in self.bench.progress(grid, desc):
            started = time.perf_counter()
            spec = self.spec(group, by_config[config]).replace(fold=fold, seed=seed)
            # nested: inner train / validation / test of the outer training part only
            rows = (run(spec, data=inner_datas(spec.sites, spec, self.inner_folds, inner),
                        workdir=scratch_dir()).rows
                    if inner >= 0 else run(spec, workdir=scratch_dir()).rows)
            from fedbn_med.evaluation.comparison import best_round

            best, last = best_round(rows), max(int(r["round"]) for r in rows)
            cell: dict[str, Any] = {"group": group, "config": config,
                                    "rounds": self.bench.args.rounds, "fold": fold,
                                    "seed": seed, "inner": inner,
                                    "inner_folds": self.inner_folds, "best_round": best,
                                    "last_round": last}
            for at, rnd in (("best", best), ("last", last)):
                cell.update({f"{k}_{at}": round(v, 6) for k, v in cell_scores(rows, rnd).items()})
            cell["seconds"] = round(time.perf_counter() - started, 2)
            self._append(cell)
            self.cells[(group, config, fold, seed, inner)] = cell

    def _append(self, cell: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            if new:
                writer.writeheader()
            writer.writerow(cell)

    def summary(self, value: Value, group: str) -> Summary:
        """Return a value's figures in a group, at the value's round, over every cell."""
        config = self.config(value)
        inners = set(range(self.inner_folds)) if self.inner_folds else {-1}
        cells = [{s: float(c[f"{s}_{value.at}"]) for s in SCORES}
                 for (g, cfg, fold, seed, inner), c in self.cells.items()
                 if g == group and cfg == config and (fold, seed) in self.bench.cells
                 and inner in inners]
        return summarise(cells, self.test_train_ratio)

    def reference_summaries(self, group: str) -> dict[str, Summary]:
        """Return the majority-class and motion-only rows' figures in a group.

        Fitted per site on the training subjects of every cell the values ran on (the
        inner training subjects when nested) and scored as the values are: on the
        validation and test subjects (inner ones when nested).
        """
        from fedbn_med.evaluation.cell_data import prepare_sites
        from fedbn_med.evaluation.comparison import REFERENCES
        from fedbn_med.evaluation.references import reference_cells

        cells: dict[str, list[dict[str, float]]] = {n: [] for n in REFERENCES}
        inners = range(self.inner_folds) if self.inner_folds else (-1,)
        for fold, seed in self.bench.cells:
            spec = self.base.replace(sites=self.groups[group], fold=fold, seed=seed)
            prepared = None if self.inner_folds else prepare_sites(spec)
            for inner in inners:
                scored = {}
                for part in ("val", "test"):
                    refs = (inner_references(spec.sites, spec, self.inner_folds, inner,
                                             scored_on=part) if prepared is None
                            else reference_cells(fold, seed, prepared, scored_on=part))
                    scored[part] = {c.strategy: c.scores["best"] for c in refs}
                for name in REFERENCES:
                    cells[name].append({
                        f"{part}_{m}": scored[part][name][m]["mean"]
                        for part in ("val", "test")
                        for m in ("auc", "balanced_accuracy", "accuracy")} | {
                        "val_loss": math.nan})
        return {n: summarise(c, self.test_train_ratio) for n, c in cells.items()}

    @property
    def test_train_ratio(self) -> float:
        """Return n_test / n_train of a run: of the outer split, or of the inner one."""
        return 1.0 / ((self.inner_folds or N_FOLDS) - 1)

    @property
    def criterion(self) -> str:
        """Return the score a value is chosen on: validation AUC, or nested inner-test AUC."""
        return "test_auc" if self.inner_folds else CRITERION


def _default_of(axis: str, values: tuple[Value, ...], sweep: Sweep) -> tuple[Value, ...]:
    """Return the axis's values with the current default among them (added if absent)."""
    if any(sweep.config(v) == "default" and v.at == "best" for v in values):
        return values
    return (Value(axis, "current default"), *values)


def _pct(stats: tuple[float, float, float]) -> str:
    from fedbn_med.evaluation.tables import format_stats

    return format_stats(*stats)


def _combined(chosen: Mapping[str, tuple[Value, str]], defaults: Mapping[str, Value]
              ) -> Value | None:
    """Return every chosen change together, or None (one change, or changes that conflict).

    Raises
    ------
    ValueError
        If two chosen values set the same setting to different values (the model axis
        sets weight decay and features too): no single run confirms both.
    """
    changes: dict[str, object] = {}
    for axis, (value, _) in chosen.items():
        if value.label != defaults[axis].label:
            for key, setting in value.settings.items():
                if key in changes and changes[key] != setting:
                    raise ValueError(
                        f"The chosen values set {key} to both {changes[key]!r} and "
                        f"{setting!r} (axis {axis!r}, value {value.label!r}); no one run "
                        "confirms both. Sweep those axes apart (--axes).")
                changes[key] = setting
    if sum(v.label != defaults[a].label for a, (v, _) in chosen.items()) < 2:
        return None  # one change alone is its own row already
    label = " + ".join(v.label for a, (v, _) in chosen.items() if v.label != defaults[a].label)
    return Value("combined", label, tuple(sorted(changes.items())))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep, choose each default on validation, publish the table."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=100, folds=3, seeds=1),
                         quick=Budget(rounds=3, folds=1, seeds=1))
    add_groups_option(parser)
    parser.add_argument("--axes", type=_axes, default=None,
                        help=f"axes to sweep (default all: {', '.join(AXES)}; with --quick "
                             f"{', '.join(QUICK_AXES)})")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs already in the output folder's cells.csv")
    parser.add_argument("--no-confirm", action="store_true",
                        help="skip the confirmation run of every changed value combined")
    parser.add_argument("--nested", action="store_true",
                        help="choose on the inner-test AUC of nested runs (no outer test "
                             "subject is used); publishes apart")
    parser.add_argument("--inner-folds", type=positive_int, default=None,
                        help="with --nested: inner folds of each outer training part "
                             "(default 4; 2 with --quick)")
    bench = Benchmark(parser, argv)
    args = bench.args
    from fedbn_med.spec import RunSpec

    inner_folds = (args.inner_folds or (2 if args.quick else 4)) if args.nested else 0
    if args.inner_folds is not None and not args.nested:
        parser.error("--inner-folds needs --nested")
    if args.nested and inner_folds < 2:
        parser.error(f"--inner-folds must be at least 2, got {inner_folds}")
    bench.set_variant(sweep_variant(args))

    grid = QUICK_AXES if args.quick and args.axes is None else {
        a: AXES[a] for a in (args.axes or AXES)}
    base = RunSpec.for_task("abide", rounds=args.rounds, seed=args.seed,
                            data_dir=args.data_dir, device=args.device)
    # published as one table over both groups
    sweep = Sweep(bench, base, resolve_groups(bench, base), inner_folds)
    criterion = sweep.criterion
    axes = {axis: _default_of(axis, values, sweep) for axis, values in grid.items()}
    defaults = {axis: next(v for v in values if sweep.config(v) == "default" and v.at == "best")
                for axis, values in axes.items()}
    sweep.run_all([v for values in axes.values() for v in values], NAME)

    groups = list(sweep.groups)
    # keyed by axis too: two axes may share a label (weight decay 0, dropout 0)
    summaries = {(axis, v.label, g): sweep.summary(v, g) for axis, values in axes.items()
                 for v in values for g in groups}
    chosen = {axis: choose(axis, values, defaults[axis],
                           {(v.label, g): summaries[(axis, v.label, g)]
                            for v in values for g in groups}, groups, criterion)
              for axis, values in axes.items()}
    combined = None if args.no_confirm else _combined(chosen, defaults)
    rows_of = [(axis, v) for axis, values in axes.items() for v in values]
    if combined is not None:
        sweep.run_all([combined], f"{NAME} (combined)")
        summaries.update({("combined", combined.label, g): sweep.summary(combined, g)
                          for g in groups})
        rows_of.append(("combined", combined))

    from fedbn_med.evaluation.comparison import REFERENCES

    references = {g: sweep.reference_summaries(g) for g in groups}
    summaries.update({("reference", n, g): references[g][n] for g in groups for n in REFERENCES})
    body, csv_rows, metrics = [], [], {}
    confirmed = True
    for axis, v in [*rows_of, *(("reference", Value("reference", n)) for n in REFERENCES)]:
        per = [summaries[(axis, v.label, g)] for g in groups]
        tests = {m: combine_intervals([s.test[m] for s in per])
                 for m in ("test_balanced_accuracy", "test_auc")}
        if axis == "reference":
            mark = "reference, not a value"
        elif axis == "combined":
            default = [sweep.summary(Value("", ""), g).score(criterion) for g in groups]
            confirmed = all(s.score(criterion) > d for s, d in zip(per, default))
            mark = (f"confirmation: {'beats' if confirmed else 'does not beat'} the default "
                    "in every group")
        else:
            value, why = chosen[axis]
            mark = ("**chosen** " if v.label == value.label else "") + (
                "(current default) " if v.label == defaults[axis].label else "") + (
                why if v.label == value.label else "")
        body.append([axis, v.label, *[f"{100 * s.score(criterion):.1f}" for s in per],
                     *([f"{100 * s.score(CRITERION):.1f}" for s in per] if inner_folds
                       else []),
                     _pct(tests["test_balanced_accuracy"]), _pct(tests["test_auc"]),
                     mark.strip()])
        row: dict[str, object] = {"axis": axis, "value": v.label, "at": v.at,
                                  "changes": ";".join(f"{k}={x}" for k, x in v.changes),
                                  "chosen": axis in chosen and v.label == chosen[axis][0].label}
        for g, s in zip(groups, per):
            row[f"cells_{g}"] = s.cells
            row.update({f"{k}_{g}": round(x, 6) for k, x in s.val.items()})
            row.update({f"{k}_{g}{suffix}": round(x, 6) for k, t in s.test.items()
                        for suffix, x in zip(("", "_low", "_high"), t)})
            if inner_folds:
                row[f"inner_test_auc_{g}"] = round(s.score(criterion), 6)
            metrics[_metric(f"{axis}.{v.label}.{g}.{criterion}")] = s.score(criterion)
        csv_rows.append(row)
    if inner_folds:
        header = ["axis", "value", *[f"{g}: inner-test AUC %" for g in groups],
                  *[f"{g}: inner val AUC %" for g in groups],
                  "inner-test bal. acc. % [95 % CI]", "inner-test AUC % [95 % CI]",
                  "choice (inner test only)"]
    else:
        header = ["axis", "value", *[f"{g}: val AUC %" for g in groups],
                  "test bal. acc. % [95 % CI]", "test AUC % [95 % CI]",
                  "choice (validation only)"]
    table = markdown_table(header, body)
    names = "; ".join(f"{g} = {', '.join(s)}" for g, s in sweep.groups.items())
    design = (f"FedBN, in process, {args.rounds} rounds, {args.folds} fold(s) x {args.seeds} "
              f"repetition(s) of the {N_FOLDS}-fold split per group ({names}); data: "
              f"{args.data_dir or 'the built-in cohort'}. ")
    n_groups = len(sweep.groups)
    spread_over = ("the one group's" if n_groups == 1 else "the mean over both groups"
                   if n_groups == 2 else f"the mean over the {n_groups} groups"
                   ) + ", with the corrected resampled t"
    combined = "" if n_groups == 1 else " of each group combined as independent"
    rule = ("per group; a value replaces the default only when it is best in every group "
            "and beats the default in every group. ")
    if inner_folds:
        notes = (design + f"Nested: each outer training part is split again into "
                 f"{inner_folds} inner folds; each run trains on the inner training subjects, "
                 "picks its round on the inner validation subjects (best validation loss) and "
                 "is scored on the inner test subjects "
                 f"({args.folds * args.seeds * inner_folds} runs per value and group). No "
                 "outer test subject is trained on, fitted on or scored. Criterion: the "
                 "inner-test AUC (mean over sites "
                 "and runs) " + rule + "The inner validation AUC is shown beside it; the "
                 f"interval columns are inner-test scores, {spread_over} (Nadeau-Bengio, "
                 f"n_test/n_train = {sweep.test_train_ratio:.2f}){combined}. ")
    else:
        notes = (design + "Each run is scored at its best-validation-loss round (the "
                 "stopping-rule row 'last round' at its last round). Criterion, fixed before "
                 f"the runs: {CRITERION} (validation AUC, mean over sites and cells) " + rule
                 + f"Test columns are for information only: {spread_over} (Nadeau-Bengio, "
                 f"n_test/n_train = 0.25){combined}. ")
    notes += (f"Windows: 32 volumes every {WINDOW_STEP} (the published code: every volume). "
              f"Every other setting is the current default: {_describe(base)}.")
    for axis, (value, why) in chosen.items():
        notes += f"\n- {axis}: {value.label} ({why})"
    if not confirmed:
        notes += ("\nThe changed values together do not beat the default in every group: "
                  "each passes alone, their combination is not confirmed.")
    notes += ("\nReference rows: the majority class and motion alone (a logistic regression "
              "on mean FD), fitted per site on the same runs' training subjects"
              + (" (inner)" if inner_folds else "") + " and scored as the values are, "
              "predicting at 0.5 (FedBN at the run's threshold); and ridge regression on "
              "whole-series connectivity z-scored per site, pooled over the sites or at "
              "each site alone, its penalty chosen by leave-one-out on the training "
              "subjects; they are no candidate value.")

    def plot(path: Path) -> Path:
        labels = [f"{a}: {v.label}"[:28] for a, v in rows_of]
        series = {f"group {g}": ([100 * summaries[(a, v.label, g)].score(criterion)
                                  for a, v in rows_of], [0.0] * len(rows_of))
                  for g in groups}
        return bar_plot(path, labels, series,
                        ylabel="inner-test AUC (%)" if inner_folds else "validation AUC (%)",
                        title=f"defaults sweep: {criterion} at the selected round")

    bench.publish(table, csv_rows, plot, notes=notes, metrics=metrics)
    return 0


def _describe(spec: Any) -> str:
    s = spec.settings
    return (f"{s.optimizer} lr {spec.lr:g}, weight decay {s.weight_decay:g}, dropout "
            f"{spec.dropout:g}, {spec.local_epochs} local epoch(s), batch {spec.batch_size}, "
            f"windows {s.windows}, harmonize {s.harmonize}")


def _metric(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)


if __name__ == "__main__":
    raise SystemExit(main())
