"""The metrics written with NumPy agree with scikit-learn's reference scorers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score, roc_auc_score

from fedbn_med.evaluation.metrics import classification_metrics, roc_auc


@pytest.mark.parametrize("seed", range(20))
def test_metrics_equal_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    labels = rng.integers(0, 2, n)
    # coarse scores, so that ties (within and across classes) are common
    scores = np.round(rng.random(n), int(rng.integers(1, 3)))
    got = classification_metrics(labels, scores, loss=0.3)
    pred = (scores >= 0.5).astype(int)
    assert got["accuracy"] == pytest.approx(accuracy_score(labels, pred))
    assert got["f1"] == pytest.approx(f1_score(labels, pred, zero_division=0))
    assert got["loss"] == 0.3
    if np.unique(labels).size == 2:
        assert got["auc"] == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
        assert got["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, pred))
    else:
        assert math.isnan(got["auc"])


def test_edge_cases():
    # one class only: AUC undefined, balanced accuracy is that class's recall
    got = classification_metrics(np.array([1, 1, 1]), np.array([0.9, 0.2, 0.7]), 0.0)
    assert math.isnan(got["auc"]) and got["balanced_accuracy"] == pytest.approx(2 / 3)
    # nothing predicted positive and no positives: F1 is 0, as scikit-learn's zero_division=0
    assert classification_metrics(np.array([0, 0]), np.array([0.1, 0.2]), 0.0)["f1"] == 0.0
    assert roc_auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5  # a tie is worth half
    assert roc_auc(np.array([0, 1, 1]), np.array([0.1, 0.9, 0.8])) == 1.0
    with pytest.raises(ValueError, match="empty"):
        classification_metrics(np.array([]), np.array([]), 0.0)
    with pytest.raises(ValueError, match="do not match"):
        classification_metrics(np.array([0, 1]), np.array([0.5]), 0.0)


@pytest.mark.parametrize("seed", range(5))
def test_counts_positive_share_and_majority_rate(seed):
    from sklearn.dummy import DummyClassifier

    rng = np.random.default_rng(seed)
    train, labels = rng.integers(0, 2, 31), rng.integers(0, 2, 17)
    scores = rng.random(17)
    majority = int(train.mean() >= 0.5)
    got = classification_metrics(labels, scores, 0.0, majority=majority)
    assert got["n"] == 17.0
    assert got["positive_rate"] == pytest.approx(np.mean(scores >= 0.5))
    # the majority rate is what scikit-learn's most-frequent dummy scores on these labels
    dummy = DummyClassifier(strategy="most_frequent").fit(np.zeros((31, 1)), train)
    assert got["majority_rate"] == pytest.approx(dummy.score(np.zeros((17, 1)), labels))
    assert "majority_rate" not in classification_metrics(labels, scores, 0.0)
    with pytest.raises(ValueError, match="majority must be the class 0 or 1, got 2"):
        classification_metrics(labels, scores, 0.0, majority=2)
