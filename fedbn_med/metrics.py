"""Per-site classification metrics, computed with scikit-learn."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score, roc_auc_score

__all__ = ["classification_metrics", "METRIC_NAMES"]

METRIC_NAMES = ("accuracy", "balanced_accuracy", "auc", "f1", "loss")


def classification_metrics(
    labels: np.ndarray, prob_positive: np.ndarray, loss: float
) -> dict[str, float]:
    """Return accuracy, balanced accuracy, ROC AUC, F1 and loss for binary predictions.

    AUC is NaN when the labels hold a single class (it is undefined there).
    """
    labels = np.asarray(labels)
    prob_positive = np.asarray(prob_positive, dtype=np.float64)
    if labels.size == 0:
        raise ValueError("Cannot compute metrics on an empty set of labels.")
    pred = (prob_positive >= 0.5).astype(labels.dtype)
    auc = roc_auc_score(labels, prob_positive) if np.unique(labels).size == 2 else math.nan
    return {
        "accuracy": float(accuracy_score(labels, pred)),
        "balanced_accuracy": float(balanced_accuracy_score(labels, pred)),
        "auc": float(auc),
        "f1": float(f1_score(labels, pred, zero_division=0)),
        "loss": float(loss),
    }
