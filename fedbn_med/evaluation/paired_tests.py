"""Paired tests of two methods on the same subjects, as their out-of-fold predictions give.

- :func:`mcnemar`: exact McNemar test of two classifiers' correctness on the same subjects.
- :func:`delong`: DeLong's test of two correlated AUCs on the same subjects, optionally
  stratified (per site, then combined), with the fast midrank algorithm of Sun and Xu
  (2014).
- :func:`bootstrap_difference`: a bootstrap over subjects stratified by site of the
  difference of a site-mean score; :func:`bootstrap_repeated_difference` does it for a
  repeated cross-validation, every repetition scored on the same resample (the AUC of a
  cross-validation, each fold's subjects ranked among themselves, is in
  :mod:`fedbn_med.evaluation.fold_auc`).

The intervals over cross-validation cells are in :mod:`fedbn_med.evaluation.intervals`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedbn_med.evaluation.intervals import check_level
from fedbn_med.evaluation.metrics import roc_auc

__all__ = [
    "DeLong", "McNemar", "balanced_accuracy", "bootstrap_difference",
    "bootstrap_repeated_difference", "delong", "mcnemar", "percentile_interval", "two_sided_p",
]


@dataclass(frozen=True)
class McNemar:
    """McNemar's test: ``a_only`` subjects only A gets right, ``b_only`` only B; exact p."""

    a_only: int
    b_only: int
    p_value: float


def mcnemar(correct_a: np.ndarray, correct_b: np.ndarray) -> McNemar:
    """Return the exact (binomial) two-sided McNemar test of paired correctness.

    Raises
    ------
    ValueError
        If the two arrays differ in shape.
    """
    from scipy import stats

    a, b = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"McNemar needs the same subjects for both classifiers; got "
                         f"{a.shape} and {b.shape}.")
    a_only, b_only = int(np.sum(a & ~b)), int(np.sum(~a & b))
    n = a_only + b_only
    p = 1.0 if n == 0 else float(stats.binomtest(a_only, n, 0.5).pvalue)
    return McNemar(a_only, b_only, p)


@dataclass(frozen=True)
class DeLong:
    """DeLong's test of AUC(A) - AUC(B): the difference, its standard error, z and p."""

    auc_a: float
    auc_b: float
    difference: float
    se: float
    p_value: float

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Return the normal interval of the difference."""
        from scipy import stats

        half = float(stats.norm.ppf(0.5 + level / 2)) * self.se
        return self.difference - half, self.difference + half


def _delong_parts(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     np.ndarray]:
    """Return (aucs, V10, V01) of several score rows (Sun and Xu's midrank form)."""
    from scipy.stats import rankdata

    pos, neg = scores[:, labels], scores[:, ~labels]
    m, n = pos.shape[1], neg.shape[1]
    tx = rankdata(pos, axis=1)
    ty = rankdata(neg, axis=1)
    tz = rankdata(np.concatenate([pos, neg], axis=1), axis=1)
    aucs = (tz[:, :m].sum(axis=1) - m * (m + 1) / 2) / (m * n)
    v10 = (tz[:, :m] - tx) / n
    v01 = 1.0 - (tz[:, m:] - ty) / m
    return aucs, v10, v01


def _delong_one(labels: np.ndarray, a: np.ndarray, b: np.ndarray
                ) -> tuple[float, float, float, float] | None:
    """Return (auc_a, auc_b, diff, var) for one stratum, or None without 2 of each class."""
    m = int(labels.sum())
    n = labels.size - m
    if m < 2 or n < 2:
        return None
    aucs, v10, v01 = _delong_parts(labels, np.stack([a, b]))
    s = np.cov(v10) / m + np.cov(v01) / n
    var = float(s[0, 0] + s[1, 1] - 2 * s[0, 1])
    return float(aucs[0]), float(aucs[1]), float(aucs[0] - aucs[1]), max(var, 0.0)


def delong(labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray,
           strata: np.ndarray | None = None) -> DeLong:
    """Return DeLong's test of two AUCs on the same subjects.

    Parameters
    ----------
    labels : numpy.ndarray
        Binary labels (1 = positive).
    scores_a, scores_b : numpy.ndarray
        The two classifiers' scores of the same subjects.
    strata : numpy.ndarray, optional
        A stratum (site) per subject. The AUCs are then computed within each stratum
        (scores of different sites need not share a scale) and combined as their mean
        weighted by stratum size, with the variance of that weighted mean; strata
        without two subjects of each class are left out.

    Returns
    -------
    DeLong
        NaN fields when no stratum has two subjects of each class.
    """
    y = np.asarray(labels).astype(bool)
    a = np.asarray(scores_a, dtype=np.float64)
    b = np.asarray(scores_b, dtype=np.float64)
    if not (y.shape == a.shape == b.shape):
        raise ValueError(f"DeLong needs one label and two scores per subject; got shapes "
                         f"{y.shape}, {a.shape} and {b.shape}.")
    groups = np.zeros(y.size, dtype=int) if strata is None else np.asarray(strata)
    parts, sizes = [], []
    for g in dict.fromkeys(groups.tolist()):
        mask = groups == g
        part = _delong_one(y[mask], a[mask], b[mask])
        if part is not None:
            parts.append(part)
            sizes.append(int(mask.sum()))
    if not parts:
        return DeLong(math.nan, math.nan, math.nan, math.nan, math.nan)
    w = np.array(sizes, dtype=float) / sum(sizes)
    arr = np.array(parts)
    auc_a, auc_b, diff = (float(w @ arr[:, i]) for i in range(3))
    se = math.sqrt(float(w ** 2 @ arr[:, 3]))
    return DeLong(auc_a, auc_b, diff, se, two_sided_p(diff, se))


def two_sided_p(difference: float, se: float) -> float:
    """Return the two-sided normal p-value of a difference and its standard error.

    With no error (``se == 0``): 1 for no difference, else 0.
    """
    from scipy import stats

    if se == 0:
        return 1.0 if difference == 0 else 0.0
    return float(2 * stats.norm.sf(abs(difference) / se))


def balanced_accuracy(labels: np.ndarray, prob: np.ndarray) -> float:
    """Return the mean recall of the classes present, predicting positive at ``prob >= 0.5``."""
    y = np.asarray(labels).astype(bool)
    pred = np.asarray(prob) >= 0.5
    recalls = []
    for cls in (True, False):
        keep = y == cls
        if keep.any():
            recalls.append(float(np.mean(pred[keep] == cls)))
    return float(np.mean(recalls)) if recalls else math.nan


def _threshold_scores(y: np.ndarray, pred: np.ndarray, metric: str) -> np.ndarray:
    """Return ``metric`` of each row of ``(resamples, subjects)`` labels and predictions."""
    y = y.astype(bool)
    if metric == "accuracy":
        return np.asarray(np.mean(pred == y, axis=1), dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        recalls = np.stack([np.sum(pred & y, axis=1) / np.sum(y, axis=1),
                            np.sum(~pred & ~y, axis=1) / np.sum(~y, axis=1)])
    return np.asarray(np.nanmean(recalls, axis=0), dtype=float)


def _auc(labels: np.ndarray, prob: np.ndarray) -> float:
    return roc_auc(labels, prob)


SCORES: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "balanced_accuracy": balanced_accuracy,
    "auc": _auc,
    "accuracy": lambda y, p: float(np.mean((np.asarray(p) >= 0.5) == np.asarray(y, bool))),
}


def bootstrap_difference(labels: np.ndarray, prob_a: np.ndarray, prob_b: np.ndarray,
                         strata: np.ndarray, metric: str = "balanced_accuracy", *,
                         n_boot: int = 2000, seed: int = 0, level: float = 0.95
                         ) -> tuple[float, float, float]:
    """Return (difference, low, high) of the site-mean ``metric`` of A minus B.

    Subjects are resampled with replacement within each stratum (site), so every
    resample keeps each site's size; the score is computed per site and averaged over
    the sites, as the tables do. The interval is the percentile interval. For the AUC
    of a cross-validation use
    :func:`fedbn_med.evaluation.fold_auc.bootstrap_fold_auc_difference`: here a site's
    scores are ranked together, which is biased when they come from several models.

    Raises
    ------
    ValueError
        If ``metric`` is unknown or ``n_boot`` < 100.
    """
    if metric not in SCORES:
        raise ValueError(f"Unknown metric '{metric}'. Valid: {', '.join(SCORES)}.")
    if n_boot < 100:
        raise ValueError(f"n_boot must be at least 100 for a percentile interval, got {n_boot}.")
    check_level(level)
    score = SCORES[metric]
    y = np.asarray(labels).astype(int)
    a, b, g = np.asarray(prob_a), np.asarray(prob_b), np.asarray(strata)
    groups = [np.flatnonzero(g == s) for s in dict.fromkeys(g.tolist())]

    def site_mean(idx_per_site: Sequence[np.ndarray]) -> float:
        diffs = [score(y[i], a[i]) - score(y[i], b[i]) for i in idx_per_site]
        finite = [d for d in diffs if math.isfinite(d)]
        return float(np.mean(finite)) if finite else math.nan

    point = site_mean(groups)
    rng = np.random.default_rng(seed)
    draws = [i[rng.integers(0, i.size, size=(n_boot, i.size))] for i in groups]
    if metric == "auc":
        boots = np.array([site_mean([d[k] for d in draws]) for k in range(n_boot)])
    else:  # the threshold scores, all resamples at once
        per_site = np.stack([_threshold_scores(y[d], a[d] >= 0.5, metric)
                             - _threshold_scores(y[d], b[d] >= 0.5, metric) for d in draws])
        with np.errstate(invalid="ignore"):
            boots = np.nanmean(per_site, axis=0) if per_site.size else np.array([])
    boots = boots[np.isfinite(boots)]
    if boots.size == 0:
        return point, math.nan, math.nan
    low, high = np.quantile(boots, [0.5 - level / 2, 0.5 + level / 2])
    return point, float(low), float(high)


def _weighted_scores(weights: np.ndarray, y: np.ndarray, pred: np.ndarray, tested: np.ndarray,
                     metric: str) -> np.ndarray:
    """Return ``metric`` of the tested subjects under each row of subject ``weights``."""
    pos, neg = tested & y, tested & ~y
    with np.errstate(invalid="ignore", divide="ignore"):
        tp = weights @ (pos & pred).astype(float)
        tn = weights @ (neg & ~pred).astype(float)
        n_pos, n_neg = weights @ pos.astype(float), weights @ neg.astype(float)
        if metric == "accuracy":
            return np.asarray((tp + tn) / (n_pos + n_neg), dtype=float)
        return np.asarray(np.nanmean(np.stack([tp / n_pos, tn / n_neg]), axis=0), dtype=float)


def bootstrap_repeated_difference(labels: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray,
                                  strata: np.ndarray, tested: np.ndarray | None = None, *,
                                  metric: str = "balanced_accuracy", n_boot: int = 2000,
                                  seed: int = 0, level: float = 0.95
                                  ) -> tuple[float, float, float]:
    """Return (difference, low, high) of a repeated cross-validation's site-mean score.

    The estimate is the mean over repetitions of the site-mean ``metric`` difference of
    each repetition's pooled out-of-fold predictions (what the cells estimate). Each
    bootstrap resamples the subjects once, within each stratum (site), and scores every
    repetition on that same resample, so what the repetitions share (their subjects)
    stays shared; the interval is the percentile interval.

    Parameters
    ----------
    labels : numpy.ndarray
        ``(n,)`` binary labels.
    pred_a, pred_b : numpy.ndarray
        ``(repetitions, n)`` predicted labels (bool) of the two methods.
    strata : numpy.ndarray
        ``(n,)`` site of each subject.
    tested : numpy.ndarray, optional
        ``(repetitions, n)`` bool: which subjects each repetition tested (all by default).

    Raises
    ------
    ValueError
        If ``metric`` is not a threshold score, ``n_boot`` < 100 or the shapes disagree.
    """
    if metric not in ("balanced_accuracy", "accuracy"):
        raise ValueError(f"Unknown metric '{metric}'. Valid: balanced_accuracy, accuracy.")
    if n_boot < 100:
        raise ValueError(f"n_boot must be at least 100 for a percentile interval, got {n_boot}.")
    check_level(level)
    y = np.asarray(labels).astype(bool)
    a, b = np.atleast_2d(np.asarray(pred_a, bool)), np.atleast_2d(np.asarray(pred_b, bool))
    mask = np.ones_like(a) if tested is None else np.atleast_2d(np.asarray(tested, bool))
    if not (a.shape == b.shape == mask.shape and a.shape[1] == y.size):
        raise ValueError(f"Expected (repetitions, {y.size}) predictions and masks, got "
                         f"{a.shape}, {b.shape} and {mask.shape}.")
    g = np.asarray(strata)
    rng = np.random.default_rng(seed)
    boot_parts = []
    for s in dict.fromkeys(g.tolist()):
        idx = np.flatnonzero(g == s)
        draws = rng.multinomial(idx.size, np.full(idx.size, 1.0 / idx.size), size=n_boot)
        weights = np.vstack([np.ones(idx.size), draws]).astype(float)
        per_rep = np.stack([_weighted_scores(weights, y[idx], a[r, idx], mask[r, idx], metric)
                            - _weighted_scores(weights, y[idx], b[r, idx], mask[r, idx],
                                               metric) for r in range(a.shape[0])])
        boot_parts.append(per_rep)  # (repetitions, 1 + n_boot) for this site
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN site or repetition
        by_site = np.nanmean(np.stack(boot_parts), axis=0)  # mean over sites
        total = np.nanmean(by_site, axis=0)  # mean over repetitions
    return percentile_interval(total, level)


def percentile_interval(total: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Return (estimate, low, high) from ``total``: the estimate first, then the resamples.

    The interval is the percentile interval of the finite resamples (NaN bounds if none).
    """
    point, boots = float(total[0]), total[1:]
    boots = boots[np.isfinite(boots)]
    if boots.size == 0:
        return point, math.nan, math.nan
    low, high = np.quantile(boots, [0.5 - level / 2, 0.5 + level / 2])
    return point, float(low), float(high)
