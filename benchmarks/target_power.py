"""Can a published comparison ever show FedBN beating the reference rows? Its power, read
from its cells.

The shared-sites target asks that FedBN's site-mean test AUC beat the majority-class and
the motion-only rows with a corrected interval (Nadeau-Bengio) that excludes them. This
reads the cells of published comparisons (``benchmarks/published/<key>/table.csv``: no
training) and, for FedBN minus each reference row, gives the paired mean and the
corrected interval exactly as the comparison table does, the spread ``s`` of the cells'
differences, and the corrected half-width that more repetitions of the same 5-fold
design would give if ``s`` stayed: ``t * s * sqrt(1 / cells + n_test / n_train)``. No
number of repetitions takes it below the floor ``1.96 * s * sqrt(n_test / n_train)``:
where the mean difference is smaller than that floor, these sites cannot show it with
this design whatever is run, and only more subjects (sites) can. The last column is the
fewest repetitions whose projected half-width is below the observed mean difference,
i.e. the design that would exclude zero *if* the mean and the spread stayed as they are:
a projection from a few cells is rough, and a rerun re-draws the mean as well.

    python benchmarks/target_power.py [--keys KEY,KEY] [--metric auc] [--publish]
"""

from __future__ import annotations

import fedbn_med  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from _common import markdown_table
from _published import PUBLISHED_DIR, load_meta

from fedbn_med.evaluation.comparison import MAJORITY, MOTION
from fedbn_med.evaluation.intervals import corrected_t_interval

NAME = "target_power"
FEDBN = "FedBN"
REPETITIONS = (3, 10, 50)
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
    for row in rows:
        cells.setdefault(row["strategy"], {})[(int(row["fold"]), int(row["seed"]))] = row
    folds = len({fold for by_cell in cells.values() for fold, _ in by_cell})
    report = (folder / key / "report.md").read_text(encoding="utf-8") \
        if (folder / key / "report.md").is_file() else ""
    found = _RATIO.search(report)
    ratio = float(found["ratio"]) if found else 1.0 / max(folds - 1, 1)
    return cells, ratio, folds


def projected_half_width(s: float, ratio: float, cells: int, level: float = 0.95) -> float:
    """Return the corrected half-width over ``cells`` cells of spread ``s``."""
    from scipy import stats

    if cells < 2 or not math.isfinite(s):
        return math.nan
    return float(stats.t.ppf(0.5 + level / 2, cells - 1) * s
                 * math.sqrt(1 / cells + ratio))


def repetitions_needed(mean: float, s: float, ratio: float, folds: int) -> int | None:
    """Return the fewest repetitions whose projected half-width is below ``|mean|``.

    None when no number up to :data:`MAX_REPETITIONS` reaches it (the floor is too high).
    """
    if not (math.isfinite(mean) and math.isfinite(s)) or mean == 0:
        return None
    for reps in range(1, MAX_REPETITIONS + 1):
        if projected_half_width(s, ratio, folds * reps) < abs(mean):
            return reps
    return None


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
        shared = sorted(set(cells[FEDBN]) & set(cells[other]))
        try:
            diffs = [float(cells[FEDBN][c][column]) - float(cells[other][c][column])
                     for c in shared]
        except KeyError:
            raise ValueError(f"{folder / key / 'table.csv'}: no column '{column}' "
                             f"(metric {metric!r} at {at!r})") from None
        diffs = [d for d in diffs if math.isfinite(d)]
        mean, low, high = corrected_t_interval(diffs, ratio)
        s = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else math.nan
        row: dict[str, object] = {
            "key": key, "difference": f"{FEDBN} - {other}", "metric": metric, "at": at,
            "cells": len(diffs), "repetitions": len(diffs) // max(folds, 1),
            "mean": mean, "corrected_low": low, "corrected_high": high, "sd": s,
            "ratio": ratio}
        for reps in REPETITIONS:
            row[f"half_width_{reps}"] = projected_half_width(s, ratio, folds * reps)
        row["floor"] = 1.96 * s * math.sqrt(ratio) if math.isfinite(s) else math.nan
        row["repetitions_needed"] = repetitions_needed(mean, s, ratio, folds)
        out.append(row)
    return out


def _pp(value: object, signed: bool = False) -> str:
    v = float(value)  # type: ignore[arg-type]
    return "n/a" if not math.isfinite(v) else (f"{100 * v:+.1f}" if signed
                                               else f"{100 * v:.1f}")


def _federation(key: str) -> str:
    name = key.removeprefix("real_compare-real-")
    for variant in ("-tangent-linear-wd100", "-tangent"):
        if name.endswith(variant):
            return f"{name.removesuffix(variant).replace('_', ' ')} ({variant[1:]})"
    return name.replace("_", " ")


def render(rows: Sequence[Mapping[str, object]]) -> str:
    """Return the markdown table of :func:`power_rows`' rows."""
    header = ["federation (key)", "difference", "cells", "mean (pp)", "corrected 95 % CI",
              "cell SD (pp)", *[f"half-width, {r} rep." for r in REPETITIONS],
              "floor (any rep.)", "repetitions to exclude 0 (projected)"]
    body = []
    for r in rows:
        needed = r["repetitions_needed"]
        excluded = float(r["corrected_low"]) > 0  # type: ignore[arg-type]
        body.append([
            _federation(str(r["key"])), r["difference"], r["cells"], _pp(r["mean"], True),
            f"[{_pp(r['corrected_low'], True)}, {_pp(r['corrected_high'], True)}]"
            + (" **excludes 0**" if excluded else ""),
            _pp(r["sd"]), *[_pp(r[f"half_width_{n}"]) for n in REPETITIONS],
            _pp(r["floor"]),
            "none (mean below the floor)" if needed is None else str(needed)])
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
    keys = [k for k in args.keys.split(",") if k] if args.keys else comparison_keys()
    if not keys:
        parser.error("no published comparison to read: give --keys, or publish one with "
                     "benchmarks/real_compare.py --publish")
    try:
        rows = [row for key in keys for row in power_rows(key, args.metric)]
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    table = render(rows)
    ratios = sorted({f"{float(r['ratio']):.3f}" for r in rows})  # type: ignore[arg-type]
    notes = (f"FedBN minus each reference row, site-mean test {args.metric} at the "
             f"best-validation round, from each published comparison's cells (no training). "
             f"Corrected: Nadeau-Bengio, n_test/n_train = {', '.join(ratios)}, as in the "
             f"comparison tables. Half-widths are projected for 5-fold designs of more "
             f"repetitions from the cells' spread, which is assumed to stay; the floor is "
             f"the limit of the half-width as the repetitions grow. Keys: "
             f"{', '.join(keys)}.")
    print(table)
    print(f"\n{notes}")
    if args.publish:
        from _published import publish

        from fedbn_med.evaluation.report import csv_text

        data = "; ".join(f"{k}: {load_meta(k)['data']}" for k in keys)
        folder = publish(f"{NAME}-real", name=NAME, argv=argv, report=f"{table}\n\n{notes}",
                         csv_text=csv_text(rows), data=data,
                         protocol="read from the published comparisons' cells",
                         wall_time_s=time.perf_counter() - start)
        print(f"published to {folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
