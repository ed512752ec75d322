"""How the built-in cohort's site shift and diagnosis signal look on its features.

For each strength of the site effect, the cohort is generated and read through the real
loader (nilearn correlations, Fisher z), and this prints, per site:

- ``gain`` and ``offset``: the least-squares line of the site's mean feature vector on the
  pooled mean vector (gain 1 and offset 0 for a site that looks like the pool). A gain
  that differs between sites is the multiplicative shift BN can undo at each site;
- ``oracle AUC``: each subject's features projected on the generator's true diagnosis
  pattern (the best a classifier could ever find, without estimation error);
- ``logreg acc``: a within-site, 5-fold cross-validated L2 logistic regression on the
  standardised features (what a simple model learns from the site's own subjects);

and, over all sites, how well a logistic regression tells the sites apart. For cohort
version 3 it then measures, at ``site_effect=1``, the calibration figures of
``benchmarks/cohort_calibrate.py`` on the cohort (the training parts of the four sites'
splits, the same :func:`fedbn_med.tasks.abide.cohort.calibration.measure`) and prints
them beside the figures measured on the real shared sites
(:data:`fedbn_med.tasks.abide.cohort.figures_v3.REAL_FIGURES`).

``--quick`` checks one half-size cohort (site effect 1, half the subjects per site) in
seconds.

    python benchmarks/cohort_check.py [--quick] [--site-effects 0,1] [--seed 0] [--version 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import RESULTS_DIR, float_list, markdown_table

NAME = "cohort_check"
#: --quick: the site effects and the subject-count scale of the cohort.
QUICK_EFFECTS, QUICK_SCALE = (1.0,), 0.5


def _features(site_effect: float, seed: int, data_dir: Path | None, version: str,
              scale: float = 1.0
              ) -> tuple[Path, dict[str, tuple[np.ndarray, np.ndarray, tuple]]]:
    from fedbn_med.tasks.abide.cohort import DEFAULT_SITE_IDS, ensure_cohort
    from fedbn_med.tasks.abide.data import load_site_features
    from fedbn_med.tasks.abide.sites import load_sites

    root = ensure_cohort(sites=DEFAULT_SITE_IDS, seed=seed, site_effect=site_effect,
                         n_subjects_scale=scale, data_dir=data_dir, version=version)
    out = {}
    for name, cfg in load_sites(["NYU", "UM", "USM", "UCLA"]).items():
        feats = load_site_features(root, cfg.abide_site_ids, name=name)
        out[name] = (np.asarray(feats.features, dtype=float), np.asarray(feats.labels),
                     feats.roi_labels)
    return root, out


def _calibration_table(root: Path, seed: int) -> str:
    from fedbn_med.tasks.abide.cohort.calibration import edge_distance, load_samples, measure
    from fedbn_med.tasks.abide.cohort.figures_v3 import REAL_FIGURES
    from fedbn_med.tasks.abide.data import load_site_features

    samples = load_samples(root, ["NYU", "UM", "USM", "UCLA"])
    roi = load_site_features(root, ("NYU",), name="NYU").roi_labels
    found = measure(samples, distance=edge_distance(roi), seed=seed)["summary"]
    rows = [[k, f"{v:.4f}", f"{found[k]:.4f}"] for k, v in REAL_FIGURES.items()]
    return markdown_table(["figure", "real shared sites (14)", "cohort (4 sites)"], rows)


def _auc(score: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, score))


def _logreg_accuracy(x: np.ndarray, y: np.ndarray, seed: int) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(C=1e-3, max_iter=2000))
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    return float(np.mean(cross_val_score(model, x, y, cv=folds)))


def _site_accuracy(sites: dict[str, tuple], seed: int) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    x = np.concatenate([v[0] for v in sites.values()])
    s = np.concatenate([np.full(len(v[1]), i) for i, v in enumerate(sites.values())])
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    return float(np.mean(cross_val_score(LogisticRegression(C=1.0, max_iter=2000), x, s,
                                         cv=folds)))


def main(argv: Sequence[str] | None = None) -> int:
    """Generate the cohort at each strength and print its site and diagnosis figures."""
    parser = argparse.ArgumentParser(prog=f"benchmarks/{NAME}.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"CI-sized run: site effect {QUICK_EFFECTS[0]:g} only, "
                             f"{QUICK_SCALE:g} x the subjects")
    parser.add_argument("--site-effects", type=float_list, default=None,
                        help="site effects to generate (default 0,1; --quick: 1)")
    parser.add_argument("--seed", type=int, default=0, help="cohort seed")
    parser.add_argument("--version", default=None,
                        help="cohort generator version (default: the built-in one)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where cohorts are generated (default: $FEDBN_MED_DATA)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / NAME)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    from fedbn_med.tasks.abide.cohort import COHORT_VERSION, COHORT_VERSIONS
    from fedbn_med.tasks.abide.cohort.diagnostics import dx_pattern, site_lines

    effects = args.site_effects or (QUICK_EFFECTS if args.quick else (0.0, 1.0))
    scale = QUICK_SCALE if args.quick else 1.0
    version = args.version or COHORT_VERSION
    if version not in COHORT_VERSIONS:
        parser.error(f"--version must be one of {', '.join(COHORT_VERSIONS)}, got {version!r}")
    roots = {}
    body, site_rows = [], []
    for effect in effects:
        roots[effect], sites = _features(effect, args.seed, args.data_dir, version, scale)
        lines = site_lines({name: x for name, (x, _, _) in sites.items()})
        for name, (x, y, roi_labels) in sites.items():
            pattern = dx_pattern(args.seed, roi_labels, version)
            gain, offset = lines[name]
            body.append([f"{effect:g}", name, len(y), f"{gain:.3f}", f"{offset:+.3f}",
                         f"{_auc(x @ pattern, y):.3f}",
                         f"{100 * _logreg_accuracy(x, y, args.seed):.1f}"])
        site_rows.append([f"{effect:g}", f"{100 * _site_accuracy(sites, args.seed):.1f}"])
        print(f"site_effect {effect:g} done", file=sys.stderr)
    size = "" if scale == 1 else f", {scale:g} x the subjects"
    table = (f"Built-in cohort v{version}, seed {args.seed}{size}\n\n"
             + markdown_table(["site effect", "site", "subjects", "gain", "offset (z)",
                               "oracle AUC", "logreg acc (%)"], body)
             + "\n\nSite identification from the features (5-fold logistic regression)\n\n"
             + markdown_table(["site effect", "accuracy (%)"], site_rows))
    if version == "3":
        root = roots.get(1.0) or _features(1.0, args.seed, args.data_dir, version, scale)[0]
        table += ("\n\nCalibration figures (benchmarks/cohort_calibrate.py), site_effect 1, "
                  "training parts\n\n" + _calibration_table(root, args.seed))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"\n{NAME}: {time.perf_counter() - started:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
