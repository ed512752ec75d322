"""Dice and the aggregated Jaccard index (AJI), the MoNuSeg challenge's metric.

AJI (Kumar et al., IEEE TMI 2017): for every ground-truth nucleus ``G_i``, take the
predicted nucleus ``S_j`` of the highest Jaccard index with it; add ``|G_i & S_j|`` to
the intersection ``C`` and ``|G_i | S_j|`` to the union ``U`` (a nucleus no prediction
touches adds its area to ``U`` only). Then add the area of every predicted nucleus never
chosen to ``U``. ``AJI = C / U``: merged or split nuclei and false detections all lower it,
which pixel Dice does not see.
"""

from __future__ import annotations

import numpy as np

__all__ = ["aggregated_jaccard", "dice"]


def dice(pred: np.ndarray, truth: np.ndarray) -> float:
    """Return the Dice of two binary masks (1.0 when both are empty)."""
    p, t = np.asarray(pred) > 0, np.asarray(truth) > 0
    total = int(p.sum()) + int(t.sum())
    return 1.0 if total == 0 else 2.0 * int((p & t).sum()) / total


def aggregated_jaccard(truth: np.ndarray, pred: np.ndarray) -> float:
    """Return the AJI of an instance mask ``pred`` against the instance mask ``truth``.

    Both are integer label maps of one shape (0 background). 1.0 when both are empty.

    Raises
    ------
    ValueError
        When the shapes differ.
    """
    truth, pred = np.asarray(truth), np.asarray(pred)
    if truth.shape != pred.shape:
        raise ValueError(f"AJI needs masks of one shape, got {truth.shape} and {pred.shape}.")
    _, t = np.unique(truth, return_inverse=True)  # relabel 0..n-1 (0 stays background)
    _, p = np.unique(pred, return_inverse=True)
    t, p = t.reshape(-1), p.reshape(-1)
    has_bg_t, has_bg_p = bool((truth == 0).any()), bool((pred == 0).any())
    n_t, n_p = int(t.max()) + 1, int(p.max()) + 1
    joint = np.bincount(t * n_p + p, minlength=n_t * n_p).reshape(n_t, n_p).astype(np.int64)
    area_t, area_p = joint.sum(axis=1), joint.sum(axis=0)
    rows = slice(1, None) if has_bg_t else slice(None)
    cols = slice(1, None) if has_bg_p else slice(None)
    inter = joint[rows, cols]
    at, ap = area_t[rows], area_p[cols]
    if inter.shape[0] == 0:
        return 1.0 if inter.shape[1] == 0 else 0.0
    if inter.shape[1] == 0:
        return 0.0
    union = at[:, None] + ap[None, :] - inter
    iou = inter / np.maximum(union, 1)
    best = iou.argmax(axis=1)
    idx = np.arange(inter.shape[0])
    matched = inter[idx, best] > 0
    c = int(inter[idx, best][matched].sum())
    u = int(union[idx, best][matched].sum()) + int(at[~matched].sum())
    used = np.zeros(inter.shape[1], dtype=bool)
    used[best[matched]] = True
    u += int(ap[~used].sum())
    return c / u if u else 1.0
