"""Measure on real ABIDE sites the summary figures the built-in cohort v3 is drawn from.

Reads every site through the project's loader (nilearn correlations, Fisher z) from
``--data-dir`` (the folder holding ``ABIDE_pcp/``), keeps each site's subjects outside
its test fold (fold 0 of the site file's own split: its training and validation
subjects, so that no test subject is measured), and prints and writes
(:func:`fedbn_med.tasks.abide.cohort.calibration.measure`):

- per-edge site location effect (spread of site means over the within-site sd) and
  scale effect (spread of log within-site sds), with the sites' global offset and scale;
- per-site mean FD by group, the ASD - control gap in log FD, the AUC of FD alone;
- the within-site edge correlations with age, sex and log FD (effect sd over edges);
- the diagnosis effect per edge per site (Cohen's d): consistent part, site-specific
  part, correlation of the sites' effect maps;
- the reachable accuracy: cross-validated L2 logistic regression per site and pooled with
  per-site z-scored features (balanced accuracy, AUC). Calibration, not a test: the CV
  runs on the training parts only.

    python benchmarks/research/cohort_calibrate.py --data-dir DIR [--quick] [--sites PITT,YALE,...]
                                          [--part train|all] [--c 0.01] [--seed 0]

``--quick`` measures only the first two shared sites (PITT, YALE) unless ``--sites`` says
otherwise: the same figures, in seconds, on any folder that holds those two.

Writes ``table.md``, ``sites.csv`` and ``summary.json`` into
``benchmarks/results/cohort_calibrate/`` (or ``--out``).
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import RESULTS_DIR, markdown_table

NAME = "cohort_calibrate"
SHARED_SITES = ("PITT", "YALE", "MAX_MUN", "KKI", "TRINITY", "STANFORD", "CALTECH", "SDSU",
                "OLIN", "LEUVEN_2", "SBL", "LEUVEN_1", "CMU", "OHSU")
#: --quick: how many of the shared sites (from the first) are measured.
QUICK_SITES = 2
SITE_COLUMNS = ("site", "n", "asd_share", "fd_median_asd", "fd_median_control",
                "log_fd_gap", "fd_auc", "site_bacc", "site_auc", "pooled_auc")


def _names(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if len(names) < 2:
        raise argparse.ArgumentTypeError(f"expected at least two comma-separated sites, "
                                         f"got {text!r}")
    return names


def calibrate(data_dir: Path, sites: Sequence[str], *, part: str = "train", seed: int = 0,
              c: float = 1e-2) -> dict:
    """Measure ``sites`` in ``data_dir``; return ``{"summary": ..., "sites": [...]}``."""
    from fedbn_med.tasks.abide.cohort.calibration import edge_distance, load_samples, measure
    from fedbn_med.tasks.abide.data import load_site_features
    from fedbn_med.tasks.abide.sites import load_site

    samples = load_samples(data_dir, sites, part=part)  # type: ignore[arg-type]
    first = load_site(sites[0])
    roi = load_site_features(data_dir, first.abide_site_ids, name=first.name).roi_labels
    result = measure(samples, distance=edge_distance(roi), seed=seed, c=c)
    result["summary"].update({"part": part, "sites": list(sites)})
    return result


def tables(result: dict, title: str) -> str:
    """Return the summary and per-site markdown tables of a :func:`calibrate` result."""
    summary = [[k, f"{v:.4f}" if isinstance(v, float) else v]
               for k, v in result["summary"].items() if k != "sites"]
    rows = [[f"{r[k]:.3f}" if isinstance(r[k], float) else r[k] for k in SITE_COLUMNS]
            for r in result["sites"]]
    return (f"{title}\n\n" + markdown_table(["figure", "value"], summary) + "\n\n"
            + markdown_table(SITE_COLUMNS, rows))


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the calibration figures on real sites; print and write them."""
    parser = argparse.ArgumentParser(prog=f"benchmarks/{NAME}.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="folder holding ABIDE_pcp/ (the real release)")
    parser.add_argument("--quick", action="store_true",
                        help=f"CI-sized run: the first {QUICK_SITES} shared sites "
                             f"({','.join(SHARED_SITES[:QUICK_SITES])}) unless --sites")
    parser.add_argument("--sites", type=_names, default=None,
                        help="comma-separated sites with a file in sites/ "
                             "(default: the 14 shared real sites)")
    parser.add_argument("--part", choices=("train", "all"), default="train",
                        help="train: only subjects outside each site's test fold")
    parser.add_argument("--c", type=float, default=1e-2,
                        help="inverse L2 strength of the logistic regression (fixed)")
    parser.add_argument("--seed", type=int, default=0, help="CV shuffle seed")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / NAME)
    args = parser.parse_args(argv)
    if not (args.data_dir / "ABIDE_pcp").is_dir():
        parser.error(f"--data-dir {args.data_dir} has no ABIDE_pcp/ folder; expected the "
                     "folder holding the ABIDE Preprocessed release.")
    sites = args.sites or (SHARED_SITES[:QUICK_SITES] if args.quick else SHARED_SITES)
    started = time.perf_counter()
    result = calibrate(args.data_dir, sites, part=args.part, seed=args.seed, c=args.c)
    table = tables(result, f"Calibration figures, {len(sites)} sites, {args.part} "
                           f"part, {args.data_dir}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table + "\n", encoding="utf-8")
    (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n",
                                           encoding="utf-8")
    lines = [",".join(SITE_COLUMNS)] + [",".join(str(r[k]) for k in SITE_COLUMNS)
                                        for r in result["sites"]]
    (args.out / "sites.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(table)
    print(f"\n{NAME}: {time.perf_counter() - started:.1f} s; results in {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
