"""The shared-sites comparisons at a glance, and whether FedBN could ever be shown to beat
the reference rows: read from the published cells, no training.

Every published comparison of real shared sites (``benchmarks/published/real_compare-
real-*/table.csv``) gives one row of the first table: FedBN's site-mean test AUC and
balanced accuracy, and FedBN minus FedAvg, SingleSet, the majority-class and the
motion-only rows on AUC, each a mean [corrected 95 % CI] over the cells as the
comparison's own tables give it (Nadeau-Bengio, from the CSV's six decimals and the
report's n_test/n_train; only comparisons whose repetitions re-draw the splits), and
whether the shared-sites target is met: FedBN above both reference rows with corrected
intervals that exclude them.

The second table asks whether more repetitions could meet it. For FedBN minus each
reference row it gives the spread ``s`` of the cells' differences and the corrected
half-width that more repetitions of the same 5-fold design would give if ``s`` stayed:
``t * s * sqrt(1 / cells + n_test / n_train)``. No number of repetitions takes it below
the floor ``1.96 * s * sqrt(n_test / n_train)``: where the mean difference is smaller
than that floor, these sites cannot show it with this design whatever is run; only more
subjects can. The last column is the fewest repetitions whose projected half-width is
below the observed mean difference, i.e. the design that would exclude zero *if* the
mean and the spread stayed as they are: a projection from a few cells is rough, and a
rerun re-draws the mean as well.

    python benchmarks/research/real_summary.py [--keys KEY,KEY] [--metric auc] [--publish]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import json
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
import numpy as np
from _common import markdown_table
from _published import PUBLISHED_DIR, load_meta, subject_level_table

from fedbn_med.evaluation.comparison import MAJORITY, MOTION
from fedbn_med.evaluation.intervals import (
    corrected_half_width,
    corrected_half_width_floor,
    corrected_t_interval,
)
from fedbn_med.evaluation.tables import format_stats

NAME = "real_summary"
FEDBN = "FedBN"
#: the methods FedBN is set against in the headline table, beside the reference rows
OTHERS = ("FedAvg", "SingleSet")
REPETITIONS = (3, 10, 50)
METRIC_NAMES = {"auc": "AUC", "balanced_accuracy": "balanced accuracy",
                "accuracy": "accuracy"}
MAX_REPETITIONS = 1000
_RATIO = re.compile(r"n_test/n_train = (?P<ratio>[0-9.]+)")


def comparison_keys(folder: Path | None = None) -> list[str]:
    """Return every published comparison of real shared sites (``real_compare-real-*``)."""
    folder = folder or PUBLISHED_DIR
    return sorted(p.name for p in folder.glob("real_compare-real-*") if p.is_dir())


def read_cells(key: str, folder: Path | None = None
               ) -> tuple[dict[str, dict[tuple[int, int], Mapping[str, str]]], float, int]:
    """Return ``{strategy: {(fold, seed): row}}``, n_test/n_train and the folds of a key.

    Raises
    ------
    FileNotFoundError, ValueError
        Naming the file, when the folder or its table is missing or not a comparison's.
    """
    folder = folder or PUBLISHED_DIR
    table = folder / key / "table.csv"
    if not table.is_file():
        raise FileNotFoundError(f"{table}: no published comparison '{key}' (expected a "
                                f"folder of benchmarks/published/ with a table.csv)")
    with open(table, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    needed = {"strategy", "fold", "seed"}
    if not rows or not needed <= set(rows[0]):
        raise ValueError(f"{table}: expected one row per strategy and cell with columns "
                         f"{', '.join(sorted(needed))}; this is not a comparison's table")
    cells: dict[str, dict[tuple[int, int], Mapping[str, str]]] = {}
    for n, row in enumerate(rows, start=2):
        try:
            cell = (int(row["fold"]), int(row["seed"]))
        except (TypeError, ValueError):
            raise ValueError(f"{table}, row {n}: fold and seed must be whole numbers, got "
                             f"{row['fold']!r} and {row['seed']!r}") from None
        cells.setdefault(row["strategy"], {})[cell] = row
    folds = len({fold for by_cell in cells.values() for fold, _ in by_cell})
    report = (folder / key / "report.md").read_text(encoding="utf-8") \
        if (folder / key / "report.md").is_file() else ""
    if report and "re-draws every site's split" not in report:
        # repetitions sharing a test set: the tables' interval runs over fold means
        raise ValueError(f"{folder / key / 'report.md'}: its repetitions share each fold's "
                         f"split; only comparisons that re-draw the splits are read here")
    found = _RATIO.search(report)
    ratio = float(found["ratio"]) if found else 1.0 / max(folds - 1, 1)
    return cells, ratio, folds


def repetitions_needed(mean: float, s: float, ratio: float, folds: int) -> int | None:
    """Return the fewest repetitions whose projected half-width is below ``mean``.

    Only a positive mean (FedBN ahead) can be shown this way; None for any other, and
    when no number up to :data:`MAX_REPETITIONS` reaches it (the floor is too high).
    """
    if not (math.isfinite(mean) and math.isfinite(s)) or mean <= 0:
        return None
    for reps in range(1, MAX_REPETITIONS + 1):
        if corrected_half_width(s, ratio, folds * reps) < mean:
            return reps
    return None


def _column(cells: Mapping[str, Mapping[tuple[int, int], Mapping[str, str]]], strategy: str,
            column: str, table: Path) -> dict[tuple[int, int], float]:
    """Return ``{(fold, seed): value}`` of one strategy's column (a clear error if absent)."""
    out = {}
    for c, row in cells[strategy].items():
        if column not in row:
            raise ValueError(f"{table}: no column '{column}'")
        try:
            out[c] = float(row[column] or "nan")  # a blank cell: no score
        except ValueError:
            raise ValueError(f"{table}: {strategy}, fold {c[0]}, seed {c[1]}: '{column}' "
                             f"must be a number, got {row[column]!r}") from None
    return out


def _difference(cells: Mapping[str, Mapping[tuple[int, int], Mapping[str, str]]], a: str,
                b: str, column: str, table: Path) -> list[float]:
    """Return the finite paired differences a - b of a column over the cells both ran."""
    va, vb = _column(cells, a, column, table), _column(cells, b, column, table)
    return [d for c in sorted(set(va) & set(vb)) if math.isfinite(d := va[c] - vb[c])]


#: the subject-level table's column this summary reads (``Comparison.subject_table``)
BOOTSTRAP_AUC = "bootstrap AUC diff (pp) [95 % CI]"
_STATS = re.compile(r"^(?P<mean>[+-]?\d+(\.\d+)?)( \[(?P<low>[+-]?\d+(\.\d+)?), "
                    r"(?P<high>[+-]?\d+(\.\d+)?)\])?$")


def bootstrap_auc(key: str, folder: Path | None = None
                  ) -> dict[str, tuple[float, float, float]]:
    """Return ``{reference row: (mean, low, high)}`` of FedBN minus it, subject bootstrap.

    Read from the comparison's ``report.md``: the subject-level table's AUC bootstrap
    (subjects resampled within each site, the same resample for every repetition;
    :func:`fedbn_med.evaluation.out_of_fold.subject_tests`), the issue's other accepted
    interval. ``benchmarks/research/subject_tests.py`` recomputes that table from the published
    predictions. Fractions, as the other figures; empty when the report has no such table.
    A cell the report writes as ``n/a`` (no finite difference) is left out, one with a
    mean only (no finite bound) gives NaN bounds.

    Raises
    ------
    ValueError
        Naming the file, when a FedBN row's cell is not ``mean [low, high]``.
    """
    path = (folder or PUBLISHED_DIR) / key / "report.md"
    table = subject_level_table(path.read_text(encoding="utf-8")) if path.is_file() else None
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in (table or "").splitlines()]
    out: dict[str, tuple[float, float, float]] = {}
    if not rows or BOOTSTRAP_AUC not in rows[0]:
        return out
    column = rows[0].index(BOOTSTRAP_AUC)
    for cells in rows[2:]:
        ref = next((r for r in (MAJORITY, MOTION) if cells[0] == f"{FEDBN} - {r}"), None)
        if ref is None:
            continue
        text = cells[column] if column < len(cells) else None
        if text == "n/a":
            continue
        found = _STATS.match(text) if text is not None else None
        if not found:
            raise ValueError(f"{path}: '{cells[0]}': expected '{BOOTSTRAP_AUC}' as "
                             f"'mean [low, high]', 'mean' or 'n/a', got {text!r}")
        out[ref] = tuple(float(found[k]) / 100 if found[k] is not None else math.nan
                         for k in ("mean", "low", "high"))  # type: ignore[assignment]
    return out


def summary_rows(key: str, folder: Path | None = None) -> dict[str, object]:
    """Return one federation's headline: FedBN's AUC and balanced accuracy, its differences.

    Each figure is a mean with its corrected 95 % interval over the cells, as the
    comparison's own tables give it; ``target_met`` is whether both reference rows' AUC
    differences have a corrected interval above 0.
    """
    folder = folder or PUBLISHED_DIR
    cells, ratio, _ = read_cells(key, folder)
    table = folder / key / "table.csv"
    if FEDBN not in cells:
        raise ValueError(f"{table}: no '{FEDBN}' rows to compare")
    row: dict[str, object] = {"key": key, "cells": len(cells[FEDBN])}
    for metric in ("auc", "balanced_accuracy"):
        values = [v for v in _column(cells, FEDBN, f"{metric}_best_mean", table).values()
                  if math.isfinite(v)]
        row[f"fedbn_{metric}"] = corrected_t_interval(values, ratio)
    for other in (*OTHERS, MAJORITY, MOTION):
        if other in cells:
            row[f"minus_{other}"] = corrected_t_interval(
                _difference(cells, FEDBN, other, "auc_best_mean", table), ratio)
    row["target_met"] = all(
        isinstance(row.get(f"minus_{ref}"), tuple)
        and float(row[f"minus_{ref}"][1]) > 0  # type: ignore[index]
        for ref in (MAJORITY, MOTION))
    boot = bootstrap_auc(key, folder)
    for ref, stats in boot.items():
        row[f"bootstrap_{ref}"] = stats
    row["target_met_bootstrap"] = (
        all(boot[r][1] > 0 for r in (MAJORITY, MOTION))  # a NaN bound is not above 0
        if all(r in boot for r in (MAJORITY, MOTION)) else None)
    return row


#: FedBN's mechanism baselines, as the comparisons name them, and their column titles
#: (FedProx equals FedAvg to the last digit where every site takes one local step per
#: round; at the windowed default it differs)
BASELINES = {"FedAvg": "FedAvg", "FedProx": "FedProx", "silobn": "SiloBN",
             "fedavg_localbn": "FedAvg, own-site BN stats", "fedavg_sitez": "FedAvg, site z",
             "fedavg_combat": "FedAvg, ComBat", "Centralized": "Centralized"}


def baseline_rows(key: str, metric: str = "auc", folder: Path | None = None
                  ) -> dict[str, object]:
    """Return FedBN minus each mechanism baseline a comparison ran (:data:`BASELINES`).

    ``{"key": key, name: (mean, low, high), ...}``: the paired cell differences of the
    metric at the best-validation round, mean [corrected 95 % CI] as in the comparison's
    own difference table (to 0.1 pp: the CSV's six decimals and the report's ratio); a
    baseline the comparison did not run is absent.
    """
    folder = folder or PUBLISHED_DIR
    cells, ratio, _ = read_cells(key, folder)
    table = folder / key / "table.csv"
    if FEDBN not in cells:
        raise ValueError(f"{table}: no '{FEDBN}' rows to compare")
    row: dict[str, object] = {"key": key}
    for name in BASELINES:
        if name in cells:
            row[name] = corrected_t_interval(
                _difference(cells, FEDBN, name, f"{metric}_best_mean", table), ratio)
    return row


def render_baselines(rows: Sequence[Mapping[str, object]]) -> str:
    """Return the markdown table of :func:`baseline_rows`' rows, and a count of the verdicts.

    Only differences with a finite interval are counted; those whose every cell is 0
    (the two methods identical in that design) are counted apart, as identical.
    """
    header = ["sites", "features, model",
              *[f"FedBN - {title}" for title in BASELINES.values()]]
    body, ahead, behind, apart, identical, no_interval = [], 0, 0, 0, 0, 0
    for r in rows:
        line: list[object] = [_sites(str(r["key"])), describe_key(str(r["key"]))[1]]
        for name in BASELINES:
            value = r.get(name)
            if not isinstance(value, tuple):
                line.append("n/a")
                continue
            mean, low, high = value
            line.append(format_stats(mean, low, high, signed=True))
            if not (math.isfinite(low) and math.isfinite(high)):
                no_interval += 1
            elif mean == low == high == 0:
                identical += 1
            else:
                ahead += int(low > 0)
                behind += int(high < 0)
                apart += int(not (low > 0 or high < 0))
        body.append(line)
    return (markdown_table(header, body) + f"\n\nOf {ahead + behind + apart} differences "
            f"with an interval: FedBN ahead (interval above 0) in {ahead}, behind (interval "
            f"below 0) in {behind}, not separated in {apart}; {identical} identical in every "
            f"cell (the two methods coincide in that design); {no_interval} without an "
            f"interval. A description, not a test: every column reuses the same FedBN cells, "
            f"and nothing corrects for the number of differences.")


def power_rows(key: str, metric: str = "auc", at: str = "best",
               folder: Path | None = None) -> list[dict[str, object]]:
    """Return one row per reference row of a key: FedBN minus it, and its projection."""
    folder = folder or PUBLISHED_DIR
    cells, ratio, folds = read_cells(key, folder)
    column = f"{metric}_{at}_mean"
    if FEDBN not in cells:
        raise ValueError(f"{folder / key / 'table.csv'}: no '{FEDBN}' rows to compare")
    out: list[dict[str, object]] = []
    for other in (MAJORITY, MOTION):
        if other not in cells:
            continue
        diffs = _difference(cells, FEDBN, other, column, folder / key / "table.csv")
        mean, low, high = corrected_t_interval(diffs, ratio)
        s = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else math.nan
        row: dict[str, object] = {
            "key": key, "difference": f"{FEDBN} - {other}", "metric": metric, "at": at,
            "cells": len(diffs), "repetitions": len(diffs) // max(folds, 1),
            "mean": mean, "corrected_low": low, "corrected_high": high, "sd": s,
            "ratio": ratio}
        for reps in REPETITIONS:
            row[f"half_width_{reps}"] = corrected_half_width(s, ratio, folds * reps)
        row["floor"] = corrected_half_width_floor(s, ratio)
        row["repetitions_needed"] = repetitions_needed(mean, s, ratio, folds)
        out.append(row)
    return out


def _pp(value: object, signed: bool = False) -> str:
    v = float(value)  # type: ignore[arg-type]
    return "n/a" if not math.isfinite(v) else (f"{100 * v:+.1f}" if signed
                                               else f"{100 * v:.1f}")


def describe_key(key: str, folder: Path | None = None) -> tuple[str, str]:
    """Return (sites, features and model) of a published comparison's key.

    The key's variant parts (``real_compare.py``'s): ``tangent``, ``linear``, ``wd<W>``,
    ``b<B>``, ``w0`` and ``fdreg``, e.g. ``...-tangent-linear-wd100`` is "tangent, linear wd 100".
    Correlation features are windowed where the comparison's ``report.md`` (in
    ``folder``, default the published results) says so: the default's key names no
    features, and the default changed from whole series to windows on 2026-12-04.
    """
    name = key.removeprefix("real_compare-real-")
    sites, _, rest = name.partition("-")
    parts = f"-{rest}-" if rest else "-"
    features = "tangent" if "-tangent-" in parts else "correlation"
    if features == "correlation" and "-w0-" not in parts:
        try:
            report = ((folder or PUBLISHED_DIR) / key / "report.md").read_text(
                encoding="utf-8")
        except OSError:
            report = ""
        if found := re.search(r"features: correlation windows of (\d+) volumes every (\d+)",
                              report):
            features = f"windows {found[1]}/{found[2]}"
    words = f"{features}, {'linear' if '-linear-' in parts else 'MLP'}"
    if found := re.search(r"-wd([0-9.]+(?:e[+-]?[0-9]+)?)-", parts):  # 1e-05 holds a "-"
        words += f" wd {found[1]}"
    if found := re.search(r"-b([0-9]+)-", parts):
        words += f", batch {found[1]}"
    if "-fdreg-" in parts:
        words += ", mean FD regressed out"
    return sites, words


_VARIANTS = ("windows 32/16, MLP", "correlation, MLP", "tangent, MLP",
             "tangent, linear wd 100")
_SHARED = re.compile(r"shared sites (?P<sites>[A-Z0-9_, ]+)$")


def site_list(key: str, folder: Path | None = None) -> list[str]:
    """Return a comparison's sites, from its ``meta.json`` (else split from the key)."""
    meta = (folder or PUBLISHED_DIR) / key / "meta.json"
    try:
        found = _SHARED.search(str(json.loads(meta.read_text(encoding="utf-8"))["data"]))
    except (OSError, ValueError, KeyError, TypeError):
        found = None
    if found:
        return [s.strip() for s in found["sites"].split(",")]
    return describe_key(key)[0].split("_")


def _sites(key: str, folder: Path | None = None) -> str:
    sites = site_list(key, folder)
    return f"all {len(sites)} shared sites" if len(sites) >= 14 else ", ".join(sites)


def ordered(keys: Sequence[str], folder: Path | None = None) -> list[str]:
    """Return keys by federation (fewest sites first, PITT's group first), then features."""
    def order(key: str) -> tuple[int, int, str, int]:
        sites, variant = site_list(key, folder), describe_key(key, folder)[1]
        rank = _VARIANTS.index(variant) if variant in _VARIANTS else len(_VARIANTS)
        return len(sites), 0 if sites[0] == "PITT" else 1, ",".join(sites), rank
    return sorted(keys, key=order)


def render_summary(rows: Sequence[Mapping[str, object]]) -> str:
    """Return the markdown headline table of :func:`summary_rows`' rows."""
    def stats(value: object, signed: bool) -> str:
        if not isinstance(value, tuple):
            return "n/a"
        mean, low, high = value
        return format_stats(mean, low, high, signed=signed)

    header = ["sites", "features, model", "cells", "FedBN AUC", "FedBN bal. acc.",
              *[f"FedBN - {o} AUC" for o in (*OTHERS, "majority", "motion-only")],
              "target met", "subject bootstrap: FedBN - majority AUC",
              "subject bootstrap: FedBN - motion-only AUC", "target met (subject bootstrap)"]

    def met(value: object, bold: bool = True) -> str:
        return ("n/a" if value is None else ("**yes**" if bold else "yes") if value
                else "no")

    body = [[_sites(str(r["key"])), describe_key(str(r["key"]))[1], r["cells"],
             stats(r["fedbn_auc"], False), stats(r["fedbn_balanced_accuracy"], False),
             *[stats(r.get(f"minus_{o}"), True) for o in (*OTHERS, MAJORITY, MOTION)],
             met(r["target_met"]),
             *[stats(r.get(f"bootstrap_{o}"), True) for o in (MAJORITY, MOTION)],
             met(r.get("target_met_bootstrap"), bold=False)] for r in rows]
    return markdown_table(header, body)


def _needed(needed: object, mean: float, floor_: float) -> str:
    if needed is not None:
        return str(needed)
    if not mean > 0:
        return "none (FedBN not ahead)"
    if mean <= floor_:
        return "none (mean below the floor)"
    return f"more than {MAX_REPETITIONS}"


def render(rows: Sequence[Mapping[str, object]]) -> str:
    """Return the markdown table of :func:`power_rows`' rows."""
    header = ["federation", "difference", "cells", "mean (pp)", "corrected 95 % CI",
              "cell SD (pp)", *[f"half-width, {r} rep." for r in REPETITIONS],
              "floor (any rep.)", "repetitions to show FedBN ahead (projected)"]
    body = []
    for r in rows:
        needed = r["repetitions_needed"]
        excluded = float(r["corrected_low"]) > 0  # type: ignore[arg-type]
        body.append([
            f"{_sites(str(r['key']))} ({describe_key(str(r['key']))[1]})", r["difference"],
            r["cells"], _pp(r["mean"], True),
            f"[{_pp(r['corrected_low'], True)}, {_pp(r['corrected_high'], True)}]"
            + (" **excludes 0**" if excluded else ""),
            _pp(r["sd"]), *[_pp(r[f"half_width_{n}"]) for n in REPETITIONS],
            _pp(r["floor"]), _needed(needed, float(r["mean"]), float(r["floor"]))])
    return markdown_table(header, body)


def main(argv: Sequence[str] | None = None) -> int:
    """Print (and with --publish, publish) the power table of the published comparisons."""
    parser = argparse.ArgumentParser(prog=f"benchmarks/{NAME}.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default=None,
                        help="comma-separated published keys (default: every "
                             "real_compare-real-* folder of benchmarks/published/)")
    parser.add_argument("--metric", default="auc",
                        choices=("auc", "balanced_accuracy", "accuracy"),
                        help="the cells' metric (default auc)")
    parser.add_argument("--publish", action="store_true",
                        help="also publish into benchmarks/published/ and the README block")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    keys = ordered([k for k in args.keys.split(",") if k] if args.keys else comparison_keys())
    if not keys:
        parser.error("no published comparison to read: give --keys, or publish one with "
                     "benchmarks/real_compare.py --publish")
    try:
        summary = [summary_rows(key) for key in keys]
        rows = [row for key in keys for row in power_rows(key, args.metric)]
        baselines = [baseline_rows(key, args.metric) for key in keys]
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    met = sum(bool(r["target_met"]) for r in summary)
    boot_met = sum(bool(r.get("target_met_bootstrap")) for r in summary)
    boot_known = sum(r.get("target_met_bootstrap") is not None for r in summary)
    table = (f"FedBN on every published shared-sites comparison: site-mean test score at "
             f"the best-validation round, mean [corrected 95 % CI] over the cells; the "
             f"target is met where both reference rows' AUC intervals are above 0 "
             f"({met} of {len(summary)}). The last three columns give the issue's other "
             f"accepted interval, the subject-level bootstrap of each comparison's report "
             f"(subjects resampled within each site; it holds the trained models fixed, "
             f"so it leaves out the spread between runs that the corrected t counts): "
             f"met by it in {boot_met} of the {boot_known} with a subject-level table."
             f"\n\n{render_summary(summary)}\n\n"
             f"Could more repetitions meet it? FedBN minus each reference row, test "
             f"{METRIC_NAMES[args.metric]}:\n\n{render(rows)}\n\n"
             f"FedBN against the baselines that isolate its mechanism (FedAvg; SiloBN: BN "
             f"scale and shift shared, statistics local; FedAvg scored with each site's own "
             f"BN statistics; FedAvg on per-site z-scored or ComBat-harmonised features), "
             f"FedProx (mu 0.01; it equals FedAvg to the last digit where every site takes "
             f"one local step per round) and Centralized, test "
             f"{METRIC_NAMES[args.metric]} difference (pp), mean [corrected 95 % CI] over "
             f"the cells:\n\n{render_baselines(baselines)}")
    ratios = sorted({f"{float(r['ratio']):.3f}" for r in rows})  # type: ignore[arg-type]
    notes = (f"Read from the published comparisons' cells (no training). Corrected: "
             f"Nadeau-Bengio, n_test/n_train = {', '.join(ratios)}, as in the "
             f"comparison tables. Half-widths are projected for 5-fold designs of more "
             f"repetitions from the cells' spread, which is assumed to stay; the floor is "
             f"the limit of the half-width as the repetitions grow.")
    print(table)
    print(f"\n{notes}")
    if args.publish:
        from _published import publish

        from fedbn_med.evaluation.report import csv_text

        try:
            described = {str(load_meta(k)["data"]).split(", shared sites")[0] for k in keys}
        except (FileNotFoundError, ValueError) as err:
            parser.error(str(err))
        data = (f"{'; '.join(sorted(described))}, shared sites: the {len(keys)} published "
                f"comparisons in the table")
        folder = publish(f"{NAME}-real", name=NAME, argv=argv, report=f"{table}\n\n{notes}",
                         csv_text=csv_text(rows), data=data,
                         protocol="read from the published comparisons' cells",
                         wall_time_s=time.perf_counter() - start)
        print(f"published to {folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
