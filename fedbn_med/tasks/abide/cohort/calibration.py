"""Measure, on any ABIDE-format sites, the summary figures cohort v3 is generated from.

``benchmarks/research/cohort_calibrate.py`` runs :func:`measure` on the real shared ABIDE sites;
``benchmarks/research/cohort_check.py`` runs it on the built-in cohort, so that both are held to
the same figures computed the same way. Every figure is a summary over edges and sites
(no subject data leaves this module). Sampling noise inflates most raw figures at
ABIDE's site sizes (30 to 60 subjects), so each comes with a noise-corrected estimate
(method of moments) where the raw one depends on the sample size: those are the ones
the generator takes, and the ones comparable between samples of different sizes.

Figures (Fisher-z edges ``x``, within-site units unless stated):

- site effects: per-edge spread of the site means over the pooled within-site sd
  (``location``), the sites' global offset (mean over edges), the per-edge spread of the
  log within-site sd (``scale``) and the sites' global scale;
- motion: per-site median mean FD by group, the ASD - control gap in log FD, the AUC of
  FD alone, per site and pooled;
- age, sex and log FD on edges: the edge-wise correlation with each, within sites; the
  excess of its mean square over the null ``1 / (N - S - 1)`` estimates the variance
  over edges of the true standardised effect;
- diagnosis: per-site standardised mean differences (Cohen's d) per edge, the pooled
  effect and its between-site heterogeneity (DerSimonian-Laird), the correlation of the
  sites' effect maps;
- reachable accuracy: cross-validated L2 logistic regression per site and pooled with
  per-site z-scored features (balanced accuracy, AUC).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedbn_med.tasks.abide.data.atlas import HO_CENTROIDS_MM, HO_LABELS

__all__ = ["SiteSample", "edge_distance", "load_samples", "measure", "reachable_figures"]


@dataclass(frozen=True, eq=False)
class SiteSample:
    """One site's subjects as the calibration reads them.

    Attributes
    ----------
    name : str
        Site name.
    features : numpy.ndarray
        ``(n, n_edges)`` Fisher-z connectivity.
    labels : numpy.ndarray
        1 = ASD, 0 = control.
    mean_fd : numpy.ndarray
        Mean framewise displacement (mm); NaN where not recorded.
    age : numpy.ndarray
        Age at scan (years).
    female : numpy.ndarray
        1 for female, 0 for male.
    """

    name: str
    features: np.ndarray
    labels: np.ndarray
    mean_fd: np.ndarray
    age: np.ndarray
    female: np.ndarray

    def __post_init__(self) -> None:
        """Check that every per-subject array has one entry per row."""
        n = len(self.features)
        lengths = {k: len(getattr(self, k)) for k in ("labels", "mean_fd", "age", "female")}
        if self.features.ndim != 2 or any(v != n for v in lengths.values()):
            raise ValueError(f"SiteSample {self.name!r}: expected 2-D features and one entry "
                             f"per row ({n}); got shape {self.features.shape}, {lengths}.")
        if min(int(self.labels.sum()), int((1 - self.labels).sum())) < 3:
            raise ValueError(f"SiteSample {self.name!r}: each class needs at least 3 "
                             f"subjects, got {int(self.labels.sum())} ASD of {n}.")


def load_samples(data_dir: str | Path, site_names: Sequence[str], *,
                 part: Literal["train", "all"] = "train") -> list[SiteSample]:
    """Read sites through the project's loader, as :func:`measure` takes them.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Folder holding ``ABIDE_pcp/`` (the real release or a built-in cohort).
    site_names : sequence of str
        Sites with a file in ``sites/`` (their ``abide_site_ids`` and ``split_seed``).
    part : {"train", "all"}, default="train"
        ``"train"``: only the subjects outside the site's test fold (fold 0 of the site
        file's own split, repetition 0: its training and validation subjects), so that
        nothing measured here saw a test subject. ``"all"``: every subject.

    Returns
    -------
    list of SiteSample
        One per site, in the given order.
    """
    from fedbn_med.tasks.abide.data import load_site_features, read_phenotypic
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.tasks.abide.splits import site_splits

    if part not in ("train", "all"):
        raise ValueError(f"part must be 'train' or 'all', got {part!r}.")
    table = read_phenotypic(data_dir).set_index("SUB_ID")
    samples = []
    for name, cfg in load_sites(list(site_names)).items():
        feats = load_site_features(data_dir, cfg.abide_site_ids, name=name)
        keep = np.arange(feats.n_subjects)
        if part == "train":
            split = site_splits(feats.labels, seed=cfg.split_seed)
            keep = np.sort(np.concatenate([split.train, split.val]))
        rows = table.loc[[feats.subject_ids[i] for i in keep]]
        samples.append(SiteSample(
            name=name, features=np.asarray(feats.features, dtype=np.float64)[keep],
            labels=feats.labels[keep], mean_fd=feats.mean_fd[keep],
            age=rows["AGE_AT_SCAN"].to_numpy(dtype=np.float64),
            female=(rows["SEX"].to_numpy() == 2).astype(np.int64)))
    return samples


def edge_distance(roi_labels: Sequence[object]) -> np.ndarray:
    """Return the centroid distance (mm) of every feature's ROI pair (loader order)."""
    keep = [HO_LABELS.index(int(str(label).lstrip("#"))) for label in roi_labels]
    xyz = HO_CENTROIDS_MM[keep]
    rows, cols = np.triu_indices(len(keep), k=1)
    return np.sqrt(((xyz[rows] - xyz[cols]) ** 2).sum(axis=1))


def _auc(score: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    ok = np.isfinite(score)
    return float(roc_auc_score(labels[ok], score[ok]))


def site_effect_figures(samples: Sequence[SiteSample]) -> dict[str, float]:
    """Return the location and scale site effects of the edges."""
    n = np.array([len(s.labels) for s in samples], dtype=float)
    means = np.stack([s.features.mean(axis=0) for s in samples])
    var = np.stack([s.features.var(axis=0, ddof=1) for s in samples])
    within = np.sqrt(((n[:, None] - 1) * var).sum(0) / (n - 1).sum())
    between = means.var(axis=0, ddof=1)
    noise = (var / n[:, None]).mean(axis=0)
    offsets = (means - means.mean(axis=0)).mean(axis=1)
    residual = means - means.mean(axis=0) - offsets[:, None]
    # an edge of an all-zero ROI has no spread at some site: no log SD, left out of scale
    spread = (var > 0).all(axis=0)
    var_s, within_s = var[:, spread], within[spread]
    log_sd = 0.5 * np.log(var_s / within_s**2)
    log_noise = float(np.mean(1.0 / (2.0 * (n - 1))))
    site_scale = np.median(np.sqrt(var_s) / within_s, axis=1)
    resid_log_sd = log_sd - np.log(site_scale)[:, None]
    med_within = float(np.median(within))
    return {
        "edge_mean": float(means.mean()),
        "edge_sd_across_edges": float(means.mean(axis=0).std()),
        "within_sd_median": med_within,
        "location_raw": float(np.median(np.sqrt(between) / within)),
        "location": float(np.median(np.sqrt(np.clip(between - noise, 0, None)) / within)),
        "offset_sd": float(offsets.std(ddof=1)),
        "offset_sd_rel": float(offsets.std(ddof=1) / med_within),
        "edge_location": float(np.median(np.sqrt(np.clip(
            residual.var(axis=0, ddof=1) - noise, 0, None)) / within)),
        "scale_raw": float(np.median(log_sd.std(axis=0, ddof=1))),
        "scale": float(np.sqrt(max(float(np.median(log_sd.var(axis=0, ddof=1))) - log_noise,
                                   0.0))),
        "site_scale_log_sd": float(np.log(site_scale).std(ddof=1)),
        "edge_scale": float(np.sqrt(max(float(np.median(resid_log_sd.var(axis=0, ddof=1)))
                                        - log_noise, 0.0))),
    }


def motion_figures(samples: Sequence[SiteSample]) -> tuple[dict[str, float], list[dict]]:
    """Return the motion-diagnosis link, pooled and per site."""
    rows, gaps, gap_var, levels, resid = [], [], [], [], []
    for s in samples:
        ok = np.isfinite(s.mean_fd) & (s.mean_fd > 0)
        fd, y = s.mean_fd[ok], s.labels[ok]
        log_fd = np.log(fd)
        a, c = log_fd[y == 1], log_fd[y == 0]
        gaps.append(a.mean() - c.mean())
        gap_var.append(a.var(ddof=1) / len(a) + c.var(ddof=1) / len(c))
        levels.append(log_fd.mean())
        resid.extend((a - a.mean()).tolist() + (c - c.mean()).tolist())
        rows.append({"site": s.name, "n": int(ok.sum()),
                     "fd_median_asd": float(np.median(fd[y == 1])),
                     "fd_median_control": float(np.median(fd[y == 0])),
                     "log_fd_gap": float(gaps[-1]), "fd_auc": _auc(fd, y)})
    g, v = np.array(gaps), np.array(gap_var)
    w = 1.0 / v
    pooled = float((w * g).sum() / w.sum())
    q = float((w * (g - pooled) ** 2).sum())
    tau2 = max(0.0, (q - (len(g) - 1)) / (w.sum() - (w**2).sum() / w.sum()))
    fd_all = np.concatenate([s.mean_fd for s in samples])
    y_all = np.concatenate([s.labels for s in samples])
    summary = {
        "log_fd_gap": pooled, "log_fd_gap_tau": float(np.sqrt(tau2)),
        "log_fd_within_sd": float(np.std(resid, ddof=len(samples) * 2)),
        "log_fd_site_sd": float(np.std(levels, ddof=1)),
        "fd_auc_pooled": _auc(fd_all, y_all),
        "fd_auc_site_mean": float(np.mean([r["fd_auc"] for r in rows])),
    }
    return summary, rows


def _centred(samples: Sequence[SiteSample], values: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([v - np.nanmean(v) for v in values])


def covariate_figures(samples: Sequence[SiteSample],
                      distance: np.ndarray | None = None) -> dict[str, float]:
    """Return the within-site edge correlations with age, sex, log FD and diagnosis."""
    x = _centred(samples, [s.features for s in samples])
    x = x / x.std(axis=0)
    covariates = {
        "age": [s.age for s in samples],
        "sex": [s.female.astype(float) for s in samples],
        "log_fd": [np.log(np.where(s.mean_fd > 0, s.mean_fd, np.nan)) for s in samples],
        "dx": [s.labels.astype(float) for s in samples],
    }
    # The subject's global connectivity (mean edge): a large shared part of edge variance.
    raw = _centred(samples, [s.features.mean(axis=1, keepdims=True) for s in samples])[:, 0]
    g = (raw - raw.mean()) / raw.std()
    log_fd = _centred(samples, [np.log(np.where(s.mean_fd > 0, s.mean_fd, np.nan))
                                for s in samples])
    ok = np.isfinite(log_fd)
    out: dict[str, float] = {
        "global_sd": float(raw.std(ddof=len(samples))),
        "global_r2": float(np.mean((g @ x / len(g)) ** 2)),
        "global_log_fd_corr": float(np.corrcoef(raw[ok], log_fd[ok])[0, 1]),
    }
    for name, values in covariates.items():
        c = _centred(samples, values)
        ok = np.isfinite(c)
        cz = (c[ok] - c[ok].mean()) / c[ok].std()
        r = cz @ x[ok] / ok.sum()
        null = 1.0 / (ok.sum() - len(samples) - 1)
        out[f"{name}_r2"] = float(np.mean(r**2))
        out[f"{name}_r2_null"] = float(null)
        out[f"{name}_effect_sd"] = float(np.sqrt(max(float(np.mean(r**2)) - null, 0.0)))
        out[f"{name}_mean_r"] = float(np.mean(r))
        if distance is not None:
            out[f"{name}_distance_corr"] = float(np.corrcoef(r, distance)[0, 1])
    return out


def _centred_d(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    a, c = x[labels == 1], x[labels == 0]
    pooled = np.sqrt(((len(a) - 1) * a.var(0, ddof=1) + (len(c) - 1) * c.var(0, ddof=1))
                     / (len(a) + len(c) - 2))
    d = (a.mean(0) - c.mean(0)) / pooled
    return d - d.mean()


def diagnosis_figures(samples: Sequence[SiteSample], n_permutations: int = 20
                      ) -> dict[str, float]:
    """Return the per-edge diagnosis effect (Cohen's d) and how it varies across sites."""
    d, v = [], []
    for s in samples:
        a, c = s.features[s.labels == 1], s.features[s.labels == 0]
        pooled = np.sqrt(((len(a) - 1) * a.var(0, ddof=1) + (len(c) - 1) * c.var(0, ddof=1))
                         / (len(a) + len(c) - 2))
        d.append((a.mean(0) - c.mean(0)) / pooled)
        v.append(1.0 / len(a) + 1.0 / len(c))
    dm, var = np.stack(d), np.array(v)
    w = 1.0 / var
    pooled_d = (w[:, None] * dm).sum(0) / w.sum()
    q = (w[:, None] * (dm - pooled_d) ** 2).sum(0)
    tau2 = np.clip((q - (len(w) - 1)) / (w.sum() - (w**2).sum() / w.sum()), 0, None)
    centred = dm - dm.mean(axis=1, keepdims=True)
    pairs = list(combinations(range(len(samples)), 2))
    cross_cov = float(np.mean([centred[i] @ centred[j] / dm.shape[1] for i, j in pairs]))
    map_corr = float(np.mean([np.corrcoef(dm[i], dm[j])[0, 1] for i, j in pairs]))
    # The sampling variance of a centred effect map, edges correlated as they are: from
    # label permutations within each site (the closed form 1/n1 + 1/n0 ignores that).
    rng = np.random.default_rng(0)
    noise = np.array([np.mean([_centred_d(s.features, rng.permutation(s.labels)).var()
                               for _ in range(n_permutations)]) for s in samples])
    within_var = float(np.mean(centred.var(axis=1) - noise))
    return {
        "dx_d_site_sd_raw": float(np.mean(dm.std(axis=1))),
        "dx_d_sampling_sd": float(np.sqrt(var.mean())),
        "dx_d_permutation_sd": float(np.sqrt(noise.mean())),
        "dx_global_d": float(np.mean(dm.mean(axis=1))),
        "dx_pooled_sd": float(pooled_d.std()),
        "dx_pooled_sampling_sd": float(np.sqrt(1.0 / w.sum())),
        "dx_consistent_sd": float(np.sqrt(max(cross_cov, 0.0))),
        "dx_site_specific_sd": float(np.sqrt(max(within_var - max(cross_cov, 0.0), 0.0))),
        "dx_tau_median": float(np.median(np.sqrt(tau2))),
        "dx_tau_positive_share": float(np.mean(tau2 > 0)),
        "dx_map_corr": map_corr,
    }


def _logreg(c: float) -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=3000, class_weight="balanced")


def reachable_figures(samples: Sequence[SiteSample], *, seed: int = 0, c: float = 1e-2,
                      n_folds: int = 5) -> tuple[dict[str, float], list[dict]]:
    """Return cross-validated logistic-regression figures, per site and pooled.

    Per site: standardised features, L2 logistic regression (``C = c``, balanced class
    weights), ``n_folds``-fold stratified CV. Pooled: every site's features z-scored with
    that site's training-fold mean and sd, one model on all sites, folds stratified by
    site and label. Balanced accuracy at the 0.5 threshold; AUC of the out-of-fold
    probabilities, per site, and over the pooled subjects.
    """
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rows = []
    for s in samples:
        # a small site (CMU keeps 4 subjects of a class) gets as many folds as it can
        k = min(n_folds, int(s.labels.sum()), int((1 - s.labels).sum()))
        folds = StratifiedKFold(k, shuffle=True, random_state=seed)
        p = cross_val_predict(make_pipeline(StandardScaler(), _logreg(c)), s.features,
                              s.labels, cv=folds, method="predict_proba")[:, 1]
        rows.append({"site": s.name, "n": len(s.labels), "asd_share": float(s.labels.mean()),
                     "site_bacc": float(balanced_accuracy_score(s.labels, p > 0.5)),
                     "site_auc": _auc(p, s.labels)})
    site_of = np.concatenate([np.full(len(s.labels), i) for i, s in enumerate(samples)])
    x = np.concatenate([s.features for s in samples]).astype(np.float64)
    y = np.concatenate([s.labels for s in samples])
    strata = site_of * 2 + y
    p = np.empty(len(y))
    folds = StratifiedKFold(n_folds, shuffle=True, random_state=seed)
    with warnings.catch_warnings():  # a site-and-class stratum smaller than n_folds
        warnings.simplefilter("ignore", UserWarning)
        splits = list(folds.split(x, strata))
    for train, test in splits:
        z = np.empty_like(x)
        for i in range(len(samples)):
            tr, rows_i = train[site_of[train] == i], np.flatnonzero(site_of == i)
            mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-8
            z[rows_i] = (x[rows_i] - mu) / sd
        p[test] = _logreg(c).fit(z[train], y[train]).predict_proba(z[test])[:, 1]
    for i, row in enumerate(rows):
        row["pooled_auc"] = _auc(p[site_of == i], y[site_of == i])
    summary = {
        "site_bacc_mean": float(np.mean([r["site_bacc"] for r in rows])),
        "site_auc_mean": float(np.mean([r["site_auc"] for r in rows])),
        "pooled_bacc": float(balanced_accuracy_score(y, p > 0.5)),
        "pooled_auc": _auc(p, y),
        "pooled_site_auc_mean": float(np.mean([r["pooled_auc"] for r in rows])),
        "logreg_c": c,
    }
    return summary, rows


def measure(samples: Sequence[SiteSample], *, distance: np.ndarray | None = None,
            seed: int = 0, c: float = 1e-2) -> dict[str, Any]:
    """Return every calibration figure of ``samples``: a summary and per-site rows.

    Parameters
    ----------
    samples : sequence of SiteSample
        At least two sites.
    distance : numpy.ndarray or None
        ROI-centroid distance per edge (mm), for the distance dependence of the effects.
    seed, c
        CV shuffle seed and the logistic regression's inverse L2 strength.

    Returns
    -------
    dict
        ``{"summary": {...}, "sites": [{...}, ...]}``, JSON-serialisable.
    """
    if len(samples) < 2:
        raise ValueError(f"Expected at least two sites to measure site effects, got "
                         f"{len(samples)}.")
    # An edge constant at a site (an all-zero ROI there, set to 0) has no spread to scale.
    varying = np.logical_and.reduce([s.features.std(axis=0) > 0 for s in samples])
    samples = [SiteSample(s.name, s.features[:, varying], s.labels, s.mean_fd, s.age,
                          s.female) for s in samples]
    distance = None if distance is None else distance[varying]
    motion, motion_rows = motion_figures(samples)
    reach, reach_rows = reachable_figures(samples, seed=seed, c=c)
    summary = {"n_sites": len(samples), "n_subjects": int(sum(len(s.labels) for s in samples)),
               "n_edges": int(varying.sum()),
               **site_effect_figures(samples), **motion,
               **covariate_figures(samples, distance), **diagnosis_figures(samples), **reach}
    sites = [{**m, **r} for m, r in zip(motion_rows, reach_rows, strict=True)]
    return {"summary": summary, "sites": sites}
