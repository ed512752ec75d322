"""Per-site classification metrics for binary labels (1 = the positive class).

Written with NumPy rather than scikit-learn's scorers: they run for every site, split
and round, and scikit-learn's input checks cost milliseconds per call, more than the
arithmetic. ``tests/test_metrics.py`` holds them equal to scikit-learn's.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["METRIC_NAMES", "classification_metrics", "roc_auc"]

#: The names :func:`classification_metrics` returns (``majority_rate`` when told the
#: training majority). ``n`` is a count (subjects scored); every other one is a rate but
#: ``loss``. ``positive_rate`` is the share of subjects predicted positive: 0 or 1 means
#: the model predicts one class only.
METRIC_NAMES = ("accuracy", "balanced_accuracy", "auc", "f1", "loss", "n", "positive_rate",
                "majority_rate")


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Return the area under the ROC curve (NaN unless both classes are present).

    Computed as the Mann-Whitney statistic with tied scores given their mean rank,
    which equals the trapezoidal area under the ROC curve.
    """
    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # average rank (1-based) of each run of equal scores
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    mean_rank = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def classification_metrics(
    labels: np.ndarray, prob_positive: np.ndarray, loss: float, *,
    majority: int | None = None, threshold: float = 0.5,
) -> dict[str, float]:
    """Return accuracy, balanced accuracy, ROC AUC, F1 and loss for binary predictions.

    AUC is NaN when the labels hold a single class (it is undefined there); balanced
    accuracy averages the recall of the classes present in ``labels``. With them come
    ``n`` (the subjects scored) and ``positive_rate`` (the share predicted positive,
    at the threshold accuracy uses).

    Parameters
    ----------
    labels, prob_positive : np.ndarray
        Each subject's label (0 or 1) and predicted probability of the positive class.
    loss : float
        The loss of these predictions (reported as given).
    majority : {0, 1}, optional
        The majority class of the training split: adds ``majority_rate``, the accuracy of
        a predictor that always says that class (the share of ``labels`` equal to it).
    threshold : float, default=0.5
        A subject is predicted positive when its probability is at least this (AUC does
        not depend on it).
    """
    labels = np.asarray(labels)
    prob_positive = np.asarray(prob_positive, dtype=np.float64)
    if labels.size == 0:
        raise ValueError("Cannot compute metrics on an empty set of labels.")
    if labels.shape != prob_positive.shape:
        raise ValueError(f"Labels of shape {labels.shape} and scores of shape "
                         f"{prob_positive.shape} do not match.")
    truth = labels == 1
    if not (math.isfinite(threshold) and 0.0 <= threshold <= 1.0):
        raise ValueError(f"threshold must be a probability in [0, 1], got {threshold!r}.")
    pred = prob_positive >= threshold
    tp = int(np.sum(pred & truth))
    fp = int(np.sum(pred & ~truth))
    fn = int(np.sum(~pred & truth))
    tn = labels.size - tp - fp - fn
    recalls = [r for r, n in ((tp / max(1, tp + fn), tp + fn), (tn / max(1, tn + fp), tn + fp))
               if n > 0]
    denom = 2 * tp + fp + fn
    scores = {
        "accuracy": (tp + tn) / labels.size,
        "balanced_accuracy": float(sum(recalls) / len(recalls)),
        "auc": roc_auc(truth, prob_positive),
        "f1": 2 * tp / denom if denom else 0.0,
        "loss": float(loss),
        "n": float(labels.size),
        "positive_rate": (tp + fp) / labels.size,
    }
    if majority is not None:
        if majority not in (0, 1):
            raise ValueError(f"majority must be the class 0 or 1, got {majority!r}.")
        scores["majority_rate"] = float(np.mean(truth == bool(majority)))
    return scores
