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
``benchmarks/research/cohort_calibrate.py`` on the cohort (the training parts of the four sites'
splits, the same :func:`fedbn_med.tasks.abide.cohort.calibration.measure`) and prints
them beside the figures of the 14 real shared sites: measured now on ``--real-dir`` (the
folder holding the real ``ABIDE_pcp/``; ``benchmarks/research/cohort_calibrate.py``'s measurement,
the two first sites with ``--quick``), else the stored ones v3 is drawn from
(:data:`fedbn_med.tasks.abide.cohort.figures_v3.REAL_FIGURES`), with how v3 gets each.

``--quick`` checks one half-size cohort (site effect 1, half the subjects per site) in
seconds.

    python benchmarks/research/cohort_check.py [--quick] [--site-effects 0,1] [--seed 0]
        [--version 3] [--cohort-seeds 0,1,2] [--real-dir DIR] [--publish]

``--cohort-seeds`` measures the calibration figures on the cohort of each seed (site
effect 1) and gives each figure's mean and range over them: how much of a match (or a
miss) is one draw's luck.

It writes ``table.md`` (what it printed) and ``table.csv`` (one row per site, site effect
and figure) into ``benchmarks/results/cohort_check/`` (or ``--out``). ``--publish`` also
writes what it printed into ``benchmarks/published/cohort_check`` (with
``--real-dir``: ``cohort_check-real``) and rewrites the README block.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
import numpy as np
from _common import RESULTS_DIR, float_list, markdown_table

NAME = "cohort_check"
#: --quick: the site effects and the subject-count scale of the cohort.
QUICK_EFFECTS, QUICK_SCALE = (1.0,), 0.5
#: The calibration figures as tabulated: label, keys (shown as "a / b"), how v3 gets it
#: (the rows below the first 17 have no such entry: figures also measured).
FIGURES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("site location effect (noise-corrected)", ("location",), "generated to match"),
    ("site global offset (sd, z)", ("offset_sd",), "generated to match"),
    ("per-edge location", ("edge_location",), "generated to match"),
    ("scale effect (noise-corrected)", ("scale",), "generated to match"),
    ("site global scale (sd of log)", ("site_scale_log_sd",), "generated to match"),
    ("within-site sd of an edge (z)", ("within_sd_median",), "not matched"),
    ("share of an edge's variance from global connectivity", ("global_r2",), "not matched"),
    ("global connectivity vs log FD (r)", ("global_log_fd_corr",), "generated to match"),
    ("edges vs log FD (mean r)", ("log_fd_mean_r",), "not matched"),
    ("FD-alone AUC, pooled", ("fd_auc_pooled",), "a result"),
    ("age effect (sd over edges)", ("age_effect_sd",), "none generated"),
    ("sex effect (sd over edges)", ("sex_effect_sd",), "generated to match"),
    ("diagnosis d, consistent part", ("dx_consistent_sd",), "strength set"),
    ("diagnosis d, site-specific part", ("dx_site_specific_sd",), "none generated"),
    ("correlation of two sites' effect maps", ("dx_map_corr",), "a result"),
    ("logistic regression per site: AUC / balanced acc", ("site_auc_mean", "site_bacc_mean"),
     "a result"),
    ("pooled, per-site z: AUC / balanced acc", ("pooled_auc", "pooled_bacc"),
     "strength set"),
    ("ASD - control gap in log FD: pooled / between-site sd", ("log_fd_gap", "log_fd_gap_tau"),
     ""),
    ("sex: mean r over edges", ("sex_mean_r",), ""),
    ("diagnosis: mean d over edges", ("dx_global_d",), ""),
    ("mean edge (z)", ("edge_mean",), ""),
    ("within-site sd of global connectivity (z)", ("global_sd",), ""),
    ("within-group sd of log FD", ("log_fd_within_sd",), ""),
    ("FD-alone AUC, mean over sites", ("fd_auc_site_mean",), ""),
    ("edges vs log FD (sd of the true effect)", ("log_fd_effect_sd",), ""),
)
HOW = {"generated to match": "generated to match the real figure",
       "strength set": "scaled by the one diagnosis strength, set so that the pooled "
                       "logistic regression's AUC matches",
       "a result": "not generated directly: a result of the rest",
       "not matched": "not matched yet",
       "none generated": "none generated (the real sites show none above the null)"}


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


def _calibration_table(roots: dict[int, Path], seed: int, version: str,
                       real_dir: Path | None, quick: bool
                       ) -> tuple[str, list[dict[str, object]]]:
    """Return the calibration table, its legend and its CSV rows (one per figure).

    ``roots``: the cohort of each cohort seed; with several, the cohort's column gives
    each figure's mean over them and its range, and the CSV each seed's figure.
    """
    from cohort_calibrate import QUICK_SITES, SHARED_SITES, calibrate

    from fedbn_med.tasks.abide.cohort.calibration import edge_distance, load_samples, measure
    from fedbn_med.tasks.abide.cohort.figures_v3 import REAL_FIGURES
    from fedbn_med.tasks.abide.data import load_site_features

    by_seed = {}
    for cohort_seed, root in roots.items():
        samples = load_samples(root, ["NYU", "UM", "USM", "UCLA"])
        roi = load_site_features(root, ("NYU",), name="NYU").roi_labels
        by_seed[cohort_seed] = measure(samples, distance=edge_distance(roi),
                                       seed=seed)["summary"]
    found = {k: float(np.mean([f[k] for f in by_seed.values()])) for k in REAL_FIGURES}
    low = {k: min(f[k] for f in by_seed.values()) for k in REAL_FIGURES}
    high = {k: max(f[k] for f in by_seed.values()) for k in REAL_FIGURES}

    def cohort(k: str) -> str:
        if len(by_seed) == 1:
            return f"{found[k]:.3f}"
        return f"{found[k]:.3f} ({low[k]:.3f} to {high[k]:.3f})"
    real, column = dict(REAL_FIGURES), f"real, {len(SHARED_SITES)} shared sites (stored)"
    if real_dir is not None:
        sites = SHARED_SITES[:QUICK_SITES] if quick else SHARED_SITES
        real = calibrate(real_dir, sites, seed=seed)["summary"]
        column = f"real, {len(sites)} shared sites"
    body, rows = [], []
    for label, keys, how in FIGURES:
        body.append([label, " / ".join(f"{real[k]:.3f}" for k in keys),
                     " / ".join(cohort(k) for k in keys)])
        rows += [{"figure": k, "label": label, "real": real[k], "cohort": found[k],
                  **({f"cohort_seed{s}": f[k] for s, f in by_seed.items()}
                     if len(by_seed) > 1 else {}),
                  "how_v3_gets_it": how} for k in keys]
    legend = "; ".join(
        f"{HOW[how]}: {', '.join(label for label, _, h in FIGURES if h == how)}"
        for how in HOW)
    note = ""
    if real_dir is not None and not quick:
        moved = [k for k, v in REAL_FIGURES.items() if abs(real[k] - v) > 5e-4]
        note = ("\n\nMeasured now as stored in figures_v3.py." if not moved else
                f"\n\nDiffers from figures_v3.py (the figures v3 is drawn from): "
                f"{', '.join(f'{k} {REAL_FIGURES[k]:.4f}' for k in moved)}.")
    seeds = ", ".join(map(str, by_seed))
    head = (f"cohort v{version}, 4 sites" if len(by_seed) == 1 else
            f"cohort v{version}, 4 sites, cohort seeds {seeds}: mean (range)")
    table = markdown_table(["figure", column, head], body)
    return f"{table}\n\nHow v3 gets each figure. {legend}.{note}", rows


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(dict.fromkeys(int(t) for t in text.split(",") if t.strip()))
    except ValueError:
        seeds = ()
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds >= 0 such as "
                                         f"0,1,2, got {text!r}")
    return seeds


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


def _publish(args: argparse.Namespace, argv: Sequence[str] | None, table: str,
             rows: list[dict[str, object]], version: str, scale: float,
             seconds: float) -> None:
    """Write the tables into ``benchmarks/published/`` and rewrite the README block."""
    from _published import publish
    from cohort_calibrate import QUICK_SITES, SHARED_SITES

    from fedbn_med.evaluation.report import csv_text

    data = f"built-in cohort v{version}, seed {args.seed}, sites NYU, UM, USM, UCLA"
    if args.cohort_seeds and args.cohort_seeds != (args.seed,):
        data += f" (calibration figures: cohort seeds {', '.join(map(str, args.cohort_seeds))})"
    if scale != 1:
        data += f" ({scale:g} x the subjects)"
    if args.real_dir is not None:
        sites = SHARED_SITES[:QUICK_SITES] if args.quick else SHARED_SITES
        data += (f"; real ABIDE Preprocessed (C-PAC, filt_noglobal, rois_ho), shared sites "
                 f"{', '.join(sites)}, each site's subjects outside its test fold")
        table = table.replace(str(args.real_dir), "DATA_DIR")
    effects = args.site_effects or (QUICK_EFFECTS if args.quick else (0.0, 1.0))
    protocol = (f"site effects {', '.join(f'{e:g}' for e in effects)}; 5-fold "
                f"cross-validation (seed {args.seed}) for the logistic regressions; "
                f"calibration figures on the training parts, site effect 1")
    folder = publish(f"{NAME}-real" if args.real_dir is not None else NAME, name=NAME,
                     argv=argv, report=table, csv_text=csv_text(rows), data=data,
                     protocol=protocol, wall_time_s=seconds)
    print(f"published to {folder}", file=sys.stderr)


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
    parser.add_argument("--cohort-seeds", type=_seeds, default=None,
                        help="cohort seeds of the calibration table, comma-separated "
                             "(default: --seed); with several, each figure's mean and "
                             "range over them")
    parser.add_argument("--version", default=None,
                        help="cohort generator version (default: the built-in one)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where cohorts are generated (default: $FEDBN_MED_DATA)")
    parser.add_argument("--real-dir", type=Path, default=None,
                        help="folder holding the real ABIDE_pcp/: measure the shared sites' "
                             "figures there (default: the stored ones)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / NAME)
    parser.add_argument("--publish", action="store_true",
                        help="also copy the tables into benchmarks/published/ and rewrite "
                             "the README's block for them (see benchmarks/_published.py)")
    args = parser.parse_args(argv)
    if args.real_dir is not None:
        args.real_dir = args.real_dir.expanduser().resolve()
        if not (args.real_dir / "ABIDE_pcp").is_dir():
            parser.error(f"--real-dir must hold ABIDE_pcp/ (the ABIDE Preprocessed layout); "
                         f"{args.real_dir} does not")
    started = time.perf_counter()
    from fedbn_med.tasks.abide.cohort import COHORT_VERSION, COHORT_VERSIONS
    from fedbn_med.tasks.abide.cohort.diagnostics import dx_pattern, site_lines

    effects = args.site_effects or (QUICK_EFFECTS if args.quick else (0.0, 1.0))
    scale = QUICK_SCALE if args.quick else 1.0
    version = args.version or COHORT_VERSION
    if version not in COHORT_VERSIONS:
        parser.error(f"--version must be one of {', '.join(COHORT_VERSIONS)}, got {version!r}")
    if args.cohort_seeds and version != "3":
        parser.error(f"--cohort-seeds are for the calibration table of cohort version 3; "
                     f"version {version} has none")
    roots = {}
    body, site_rows, csv_rows = [], [], []
    for effect in effects:
        roots[effect], sites = _features(effect, args.seed, args.data_dir, version, scale)
        lines = site_lines({name: x for name, (x, _, _) in sites.items()})
        for name, (x, y, roi_labels) in sites.items():
            pattern = dx_pattern(args.seed, roi_labels, version)
            gain, offset = lines[name]
            auc, acc = _auc(x @ pattern, y), _logreg_accuracy(x, y, args.seed)
            body.append([f"{effect:g}", name, len(y), f"{gain:.3f}", f"{offset:+.3f}",
                         f"{auc:.3f}", f"{100 * acc:.1f}"])
            csv_rows.append({"table": "site", "site_effect": effect, "site": name,
                             "subjects": len(y), "gain": gain, "offset": offset,
                             "oracle_auc": auc, "logreg_accuracy": acc})
        identified = _site_accuracy(sites, args.seed)
        site_rows.append([f"{effect:g}", f"{100 * identified:.1f}"])
        csv_rows.append({"table": "site identification", "site_effect": effect,
                         "site_accuracy": identified})
        print(f"site_effect {effect:g} done", file=sys.stderr)
    size = "" if scale == 1 else f", {scale:g} x the subjects"
    table = (f"Built-in cohort v{version}, seed {args.seed}{size}\n\n"
             + markdown_table(["site effect", "site", "subjects", "gain", "offset (z)",
                               "oracle AUC", "logreg acc (%)"], body)
             + "\n\nSite identification from the features (5-fold logistic regression)\n\n"
             + markdown_table(["site effect", "accuracy (%)"], site_rows))
    if version == "3":
        cohorts = {}
        for cohort_seed in args.cohort_seeds or (args.seed,):
            root = (roots.get(1.0) if cohort_seed == args.seed else None) or _features(
                1.0, cohort_seed, args.data_dir, version, scale)[0]
            cohorts[cohort_seed] = root
        calibration, rows = _calibration_table(cohorts, args.seed, version, args.real_dir,
                                               args.quick)
        table += ("\n\nCalibration figures (benchmarks/research/cohort_calibrate.py), "
                  "site_effect 1, training parts\n\n" + calibration)
        csv_rows += [{"table": "calibration", **r} for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table + "\n", encoding="utf-8")
    from fedbn_med.evaluation.report import csv_text

    (args.out / "table.csv").write_text(csv_text(csv_rows), encoding="utf-8")
    if args.publish:
        _publish(args, argv, table, csv_rows, version, scale, time.perf_counter() - started)
    print(table)
    print(f"\n{NAME}: {time.perf_counter() - started:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
