"""The AUC of a cross-validation, subject by subject: each subject ranked within its fold.

A site's out-of-fold predictions come from one model per test fold, and two models'
scores need not share a scale; :func:`bootstrap_fold_auc_difference` ranks a subject only
against subjects of its own site and fold, as a comparison's cells do, and resamples
subjects within sites.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from fedbn_med.evaluation.intervals import check_level
from fedbn_med.evaluation.paired_tests import percentile_interval

__all__ = ["bootstrap_fold_auc_difference"]


def _weighted_auc(weights: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Return the AUC of one group of subjects under each row of subject ``weights``.

    The Mann-Whitney statistic with ties counted a half, each (positive, negative) pair
    weighted by the product of the two subjects' weights; NaN where a row weighs no
    subject of a class.
    """
    pos, neg = scores[labels], scores[~labels]
    pairs = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    wp, wn = weights[:, labels], weights[:, ~labels]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.sum((wp @ pairs) * wn, axis=1)
                          / (wp.sum(axis=1) * wn.sum(axis=1)), dtype=float)


def bootstrap_fold_auc_difference(labels: np.ndarray, prob_a: np.ndarray, prob_b: np.ndarray,
                                  strata: np.ndarray, fold: np.ndarray, *, n_boot: int = 2000,
                                  seed: int = 0, level: float = 0.95
                                  ) -> tuple[float, float, float]:
    """Return (difference, low, high) of a cross-validation's mean site-mean AUC, A - B.

    The estimate is what the cells of a comparison estimate: for each (repetition, test
    fold) cell, the mean over sites of each site's AUC on that fold's subjects, averaged
    over the cells. A subject is ranked only against subjects of its own site and fold:
    each fold's scores come from a model of their own, which need not share a scale with
    another fold's (a constant model scores 50 % here, and below 50 % on a site's pooled
    folds when its constant tracks its training part's prevalence). Each bootstrap
    resamples the subjects once, within each stratum (site), and scores every
    repetition on that same resample; the interval is the percentile interval. A small
    (site, fold) can lose a class in a resample; that site then leaves that cell's mean
    for that resample.

    Parameters
    ----------
    labels : numpy.ndarray
        ``(n,)`` binary labels.
    prob_a, prob_b : numpy.ndarray
        ``(repetitions, n)`` scores of the two methods.
    strata : numpy.ndarray
        ``(n,)`` site of each subject.
    fold : numpy.ndarray
        ``(repetitions, n)`` integer test fold of each subject in each repetition; a
        negative value leaves the subject out of that repetition.

    Raises
    ------
    ValueError
        If ``n_boot`` < 100 or the shapes disagree.
    """
    if n_boot < 100:
        raise ValueError(f"n_boot must be at least 100 for a percentile interval, got {n_boot}.")
    check_level(level)
    y = np.asarray(labels).astype(bool)
    a, b = np.atleast_2d(np.asarray(prob_a, float)), np.atleast_2d(np.asarray(prob_b, float))
    folds = np.atleast_2d(np.asarray(fold))
    if not (a.shape == b.shape == folds.shape and a.shape[1] == y.size):
        raise ValueError(f"Expected (repetitions, {y.size}) scores and folds, got {a.shape}, "
                         f"{b.shape} and {folds.shape}.")
    g = np.asarray(strata)
    rng = np.random.default_rng(seed)
    cells: dict[tuple[int, int], list[np.ndarray]] = {}
    for s in dict.fromkeys(g.tolist()):
        idx = np.flatnonzero(g == s)
        draws = rng.multinomial(idx.size, np.full(idx.size, 1.0 / idx.size), size=n_boot)
        weights = np.vstack([np.ones(idx.size), draws]).astype(float)
        for r in range(a.shape[0]):
            for f in np.unique(folds[r, idx]):
                if f < 0:
                    continue
                sub = idx[folds[r, idx] == f]
                w = weights[:, folds[r, idx] == f]
                diff = (_weighted_auc(w, y[sub], a[r, sub])
                        - _weighted_auc(w, y[sub], b[r, sub]))
                cells.setdefault((r, int(f)), []).append(diff)
    if not cells:
        return math.nan, math.nan, math.nan
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a site or cell with no AUC
        by_cell = np.stack([np.nanmean(np.stack(parts), axis=0) for parts in cells.values()])
        total = np.nanmean(by_cell, axis=0)
    return percentile_interval(total, level)
