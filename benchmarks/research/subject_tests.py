"""Recompute a published comparison's subject-level tests from its runs' own predictions.

A comparison published with ``cell_predictions.csv.gz`` (every run's test prediction of
every subject) needs no training to test again: this rebuilds the per-subject part of
the comparison from that file, recomputes McNemar, DeLong and both bootstraps of FedBN
against every other row, prints the table, and says whether it is the one the
benchmark published in ``report.md``.

    python benchmarks/research/subject_tests.py --key real_compare-real-PITT_YALE_KKI_TRINITY
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import gzip
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _published import PUBLISHED_DIR, subject_level_table

from fedbn_med.evaluation.comparison import Comparison, comparison_from_predictions

NAME = "subject_tests"
FILE = "cell_predictions.csv.gz"
_SITES = re.compile(r"^\| method \| (?P<sites>.+) \| mean \|$", re.MULTILINE)


def load(key: str, folder: Path | None = None) -> tuple[Comparison, str]:
    """Return the comparison rebuilt from a key's predictions, and its ``report.md``.

    Raises
    ------
    FileNotFoundError, ValueError
        Naming the file when it is missing, not gzip or not the predictions' CSV.
    """
    base = (folder or PUBLISHED_DIR) / key
    path = base / FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no per-run predictions for '{key}' (comparisons "
                                f"published before they were kept have none; rerun the "
                                f"benchmark with --publish)")
    report = (base / "report.md").read_text(encoding="utf-8") \
        if (base / "report.md").is_file() else ""
    found = _SITES.search(report)
    sites = [s.strip() for s in found["sites"].split("|")] if found else None
    try:
        with gzip.open(path, "rt", newline="", encoding="utf-8") as handle:
            comparison = comparison_from_predictions(csv.DictReader(handle), sites,
                                                     source=str(path))
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable gzip CSV ({err})") from None
    if not comparison.cells:
        raise ValueError(f"{path}: holds no predictions")
    return comparison, report


def main(argv: Sequence[str] | None = None) -> int:
    """Print the recomputed table; exit 1 if it differs from the published one."""
    parser = argparse.ArgumentParser(prog=f"benchmarks/{NAME}.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--key", required=True,
                        help="a folder of benchmarks/published/ holding " + FILE)
    parser.add_argument("--n-boot", type=int, default=2000,
                        help="bootstrap resamples (default 2000, as the benchmarks)")
    args = parser.parse_args(argv)
    if args.n_boot < 1:
        parser.error(f"--n-boot must be at least 1, got {args.n_boot}")
    from _published import check_hashes

    try:
        comparison, report = load(args.key)
        damaged = check_hashes(args.key) if (PUBLISHED_DIR / args.key / "meta.json"
                                             ).is_file() else []
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    if damaged:
        parser.error("; ".join(damaged))
    table = comparison.subject_table(args.n_boot)
    if not table:
        parser.error(f"benchmarks/published/{args.key}/{FILE}: no pair of FedBN and another "
                     f"method to test (its strategies: {', '.join(comparison.strategies)})")
    print(table)
    expected = subject_level_table(report)
    if expected is None:
        print(f"\n(benchmarks/published/{args.key}/report.md has no subject-level table to "
              f"compare with)", file=sys.stderr)
        return 0
    same = table.strip() == expected.strip()
    print(f"\n{'Identical to' if same else 'DIFFERS from'} the subject-level table of "
          f"benchmarks/published/{args.key}/report.md"
          + ("" if args.n_boot == 2000 else f" (recomputed with --n-boot {args.n_boot})"),
          file=sys.stderr)
    return 0 if same or args.n_boot != 2000 else 1


if __name__ == "__main__":
    raise SystemExit(main())
