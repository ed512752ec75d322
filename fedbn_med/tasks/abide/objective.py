"""The ABIDE task's objective: cross-entropy to train, binary classification metrics to score.

The network outputs two logits per subject (control, ASD); the positive class is ASD
(label 1). These are the loss and the scores :class:`fedbn_med.training.trainer.SiteTrainer`
computes, written once so that a trainer can take them from the task.
"""

from __future__ import annotations

import torch
from torch.nn import functional

from fedbn_med.evaluation.metrics import METRIC_NAMES, classification_metrics

__all__ = ["METRIC_NAMES", "loss", "positive_probability", "score"]


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Return the mean cross-entropy of a batch.

    Parameters
    ----------
    logits : torch.Tensor
        ``(n, 2)`` network outputs.
    labels : torch.Tensor
        ``(n,)`` ``int64`` labels: 1 = ASD, 0 = control.

    Returns
    -------
    torch.Tensor
        A scalar, differentiable with respect to ``logits``.
    """
    return functional.cross_entropy(logits, labels)


def positive_probability(logits: torch.Tensor) -> torch.Tensor:
    """Return the probability of the positive class (ASD) for each row of ``logits``."""
    return torch.softmax(logits, dim=1)[:, 1]


def score(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Return the evaluation metrics of a split from its logits.

    Parameters
    ----------
    logits : torch.Tensor
        ``(n, 2)`` network outputs for the whole split, on the CPU.
    labels : torch.Tensor
        ``(n,)`` ``int64`` labels, on the CPU.

    Returns
    -------
    dict of str to float
        ``accuracy``, ``balanced_accuracy``, ``auc``, ``f1`` and ``loss`` (see
        :func:`fedbn_med.evaluation.metrics.classification_metrics`).
    """
    with torch.no_grad():
        value = float(loss(logits, labels))
        prob = positive_probability(logits).numpy()
    return classification_metrics(labels.numpy(), prob, value)
