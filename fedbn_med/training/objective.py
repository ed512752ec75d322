"""What a site trains for and how it is scored: a task's objective.

:class:`~fedbn_med.training.trainer.SiteTrainer` has one training loop and one scoring
loop; what differs between tasks is here. An :class:`Objective` says how a site's data
are batched (for training and for estimating BN statistics), the loss of a batch, and
the metrics of a validation or test split. :class:`BinaryClassification` is the one of
tensor data with two logits per row (ABIDE: control or ASD); the imaging tasks' are
:class:`fedbn_med.tasks.imaging.trainer.ImageObjective` and its subclasses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from fedbn_med.evaluation.metrics import classification_metrics
from fedbn_med.tasks import Selection

__all__ = ["MIN_LAST_BATCH", "THRESHOLDS", "BinaryClassification", "Objective",
           "ShapeMismatchError", "batch_bounds", "binary_scores", "prior_threshold"]

#: How a binary objective turns probabilities into predicted classes: at 0.5, or at the
#: site's own training prevalence (:func:`prior_threshold`).
THRESHOLDS = ("0.5", "site_prior")

#: The fewest examples a last training batch keeps on its own; a smaller remainder joins
#: the batch before it (:meth:`BinaryClassification.batches`).
MIN_LAST_BATCH = 4

def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """Return ``(start, stop)`` of each training batch of an epoch over ``n`` examples.

    Batches of ``batch_size`` in order; a last batch of fewer than
    :data:`MIN_LAST_BATCH` examples joins the one before it (a split smaller than one
    batch is one batch). Every task's training batches follow this rule.
    """
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] < MIN_LAST_BATCH:
        starts.pop()
    return list(zip(starts, [*starts[1:], n]))


#: ``seeds(*labels)``: a seed derived from the run's seed, the site and the round.
Seeds = Callable[..., int]


class ShapeMismatchError(ValueError):
    """Raised when weights or data do not fit a site's model."""


class Objective:
    """A task's batching, loss and scores; subclasses give each.

    ``mixed_precision``: whether the trainer computes in mixed precision on CUDA by
    default (imaging networks), or never unless asked (the ABIDE MLP). ``selection``:
    the validation metric that selects a run's round and its direction (by default the
    mean validation loss, lower is better); the task registers the same
    (:attr:`fedbn_med.tasks.Task.selection`).
    """

    mixed_precision: ClassVar[bool] = False
    selection: ClassVar[Selection] = Selection()

    def check(self, site: str, model: nn.Module, data: Any) -> None:
        """Raise when a site's data cannot train this model."""

    def batches(self, data: Any, batch_size: int, epochs: int, seeds: Seeds
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(inputs, targets)`` training batches (CPU) of a round's epochs.

        Batches of one example are left out: batch norm cannot train on them.
        """
        raise NotImplementedError

    def bn_inputs(self, data: Any, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
        """Yield the training inputs the BN running statistics are estimated from."""
        raise NotImplementedError

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return the training loss of a batch."""
        raise NotImplementedError

    def score(self, model: nn.Module, data: Any, split: str, device: torch.device
              ) -> dict[str, float]:
        """Return the metrics of ``model`` on a split (``{}`` when the split is empty)."""
        raise NotImplementedError

    def score_splits(self, model: nn.Module, data: Any, splits: Sequence[str],
                     device: torch.device) -> dict[str, float]:
        """Return the metrics of every split, each prefixed with its name (``val_loss``)."""
        return {f"{split}_{k}": v for split in splits
                for k, v in self.score(model, data, split, device).items()}

    def predict(self, model: nn.Module, x: torch.Tensor, device: torch.device
                ) -> torch.Tensor:
        """Return each example's predicted probability of the positive class (CPU).

        What a comparison keeps per test subject for the paired tests (binary tasks);
        an objective without one says so.
        """
        raise NotImplementedError(f"{type(self).__name__} gives no per-example probability "
                                  "of a positive class; subject-level predictions need a "
                                  "binary objective (BinaryClassification).")


@torch.no_grad()
def _logits(model: nn.Module, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Return the model's logits of ``x`` (CPU), in eval mode, computed in chunks of 512."""
    model.eval()
    return torch.cat([model(x[s:s + 512].to(device)).cpu() for s in range(0, x.shape[0], 512)])


@torch.no_grad()
def prior_threshold(model: nn.Module, data: Any, device: torch.device) -> float:
    """Return the threshold that predicts the site's training prevalence.

    At it, the site's training rows are predicted positive as often as they are. The
    model scores the site's own training split (in eval mode: with the BN statistics it
    is scored with), and the threshold is the ``1 - prevalence`` quantile of those
    probabilities. It is the site's own, like its BN layers: it shifts with the site's
    scores, so a site whose probabilities all lie on one side of 0.5 is not scored as one
    class. 0.5 when the split is empty or holds one class.
    """
    x, y = data.train
    if x.shape[0] == 0:
        return 0.5
    prevalence = float(y.double().mean())
    if not 0.0 < prevalence < 1.0:
        return 0.5
    prob = torch.softmax(_logits(model, x, device).double(), dim=1)[:, 1].numpy()
    return float(np.quantile(prob, 1.0 - prevalence))


@torch.no_grad()
def binary_scores(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
                  groups: torch.Tensor | None = None, majority: int | None = None,
                  threshold: float = 0.5) -> dict[str, float]:
    """Return the binary classification metrics of ``model`` on ``(x, y)``.

    Parameters
    ----------
    model : torch.nn.Module
        A network with two logits per row (positive class second); put in eval mode.
    x, y : torch.Tensor
        Inputs and ``int64`` labels.
    device : torch.device
        Where the model computes (in chunks of 512 rows).
    groups : torch.Tensor, optional
        The subject of each row (several rows per subject, e.g. sliding windows): a
        subject is scored once, by the mean of its rows' probabilities.
    majority : int, optional
        The training split's majority class, for the majority-class rate.
    threshold : float, default=0.5
        The probability from which a subject is predicted positive.

    Returns
    -------
    dict of str to float
        :func:`fedbn_med.evaluation.metrics.classification_metrics` of the split.
    """
    logits = _logits(model, x, device)
    if groups is None:
        loss = float(nn.functional.cross_entropy(logits, y))
        prob = torch.softmax(logits, dim=1)[:, 1].numpy()
        return classification_metrics(y.numpy(), prob, loss, majority=majority,
                                      threshold=threshold)
    # One score per subject: the mean of its rows' (windows') probabilities.
    _, inverse = torch.unique(groups, return_inverse=True)
    n = int(inverse.max()) + 1
    probs = torch.zeros(n, logits.shape[1], dtype=torch.float64).index_add_(
        0, inverse, torch.softmax(logits.double(), dim=1))
    probs /= torch.bincount(inverse, minlength=n).unsqueeze(1)
    labels = torch.zeros(n, dtype=torch.int64).scatter_(0, inverse, y)
    loss = float(nn.functional.nll_loss(torch.log(probs.clamp_min(1e-12)), labels))
    return classification_metrics(labels.numpy(), probs[:, 1].numpy(), loss, majority=majority,
                                  threshold=threshold)


class BinaryClassification(Objective):
    """Tensor data, two logits per row: cross-entropy to train, binary metrics to score.

    The data are a :class:`~fedbn_med.training.trainer.SiteData`. Training batches are
    drawn from a generator seeded per site and round; BN statistics come from the training
    split in its order. A split with ``<split>_groups`` is scored per subject.

    Parameters
    ----------
    threshold : {"0.5", "site_prior"}
        Where a probability becomes a positive prediction: at 0.5, or at the site's own
        training prevalence (:func:`prior_threshold`, computed each time a model is
        scored). AUC and the loss do not depend on it.
    """

    def __init__(self, threshold: str = "0.5") -> None:
        if threshold not in THRESHOLDS:
            raise ValueError(f"threshold must be one of {', '.join(THRESHOLDS)}, got "
                             f"{threshold!r}.")
        self.threshold = threshold

    def check(self, site: str, model: nn.Module, data: Any) -> None:
        """Check feature counts, label counts and finiteness of every split."""
        expected = getattr(model, "in_features", None)
        for split, (x, y) in zip(("train", "val", "test"), (data.train, data.val, data.test)):
            if expected is not None and x.ndim == 2 and x.shape[1] != expected:
                raise ShapeMismatchError(
                    f"Site '{site}' has {split} data of shape {tuple(x.shape)} but the "
                    f"federation's model expects {expected} features per example "
                    f"(shape (N, {expected}))."
                )
            if x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"Site '{site}' {split} split has {x.shape[0]} examples but "
                    f"{y.shape[0]} labels."
                )
            # a NaN or an Inf makes the sum NaN or infinite: a finite sum (one pass, no
            # mask) clears the split; an overflowing one is checked value by value
            if not (torch.isfinite(x.sum()) or torch.isfinite(x).all()):
                raise ValueError(f"Site '{site}' {split} data contains NaN or Inf.")

    def batches(self, data: Any, batch_size: int, epochs: int, seeds: Seeds
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield shuffled training batches, a new order every epoch.

        A last batch of fewer than :data:`MIN_LAST_BATCH` examples joins the batch before
        it: batch norm normalises a batch by its own statistics, and on two or three
        examples those are degenerate (on two, every feature becomes -1 or +1), which
        gave updates hundreds of times the other sites' at small batch sizes. A split
        that is one batch is trained on whole; a split of one example is not trained on.
        """
        gen = torch.Generator().manual_seed(seeds("shuffle"))
        x, y = data.train
        n = x.shape[0]
        bounds = batch_bounds(n, batch_size)
        for _ in range(epochs):
            order = torch.randperm(n, generator=gen)
            for start, stop in bounds:
                idx = order[start:stop]
                if idx.numel() < 2:  # batch norm cannot train on a single example
                    continue
                # index_select copies the same rows as x[idx], without advanced
                # indexing's overhead (a sixth of a step's time on the ABIDE MLP)
                yield x.index_select(0, idx), y.index_select(0, idx)

    def bn_inputs(self, data: Any, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
        """Yield the training inputs in training-sized batches, in split order."""
        x = data.train[0]
        for start in range(0, x.shape[0], batch_size):
            yield x[start:start + batch_size]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return the mean cross-entropy of the logits."""
        return nn.functional.cross_entropy(output, target)

    @torch.no_grad()
    def predict(self, model: nn.Module, x: torch.Tensor, device: torch.device
                ) -> torch.Tensor:
        """Return each row's probability of the positive class (the second logit's)."""
        if x.shape[0] == 0:
            return torch.empty(0)
        return torch.softmax(_logits(model, x, device), dim=1)[:, 1]

    def decision_threshold(self, model: nn.Module, data: Any, device: torch.device) -> float:
        """Return the P(ASD) at and above which ``model`` predicts ASD at this site."""
        return prior_threshold(model, data, device) if self.threshold == "site_prior" else 0.5

    def score(self, model: nn.Module, data: Any, split: str, device: torch.device
              ) -> dict[str, float]:
        """Return the split's metrics, per subject when it has groups."""
        if getattr(data, split)[0].shape[0] == 0:
            return {}  # nothing to score: no pass over the training split for a threshold
        return self._scores(model, data, split, device,
                            self.decision_threshold(model, data, device))

    def score_splits(self, model: nn.Module, data: Any, splits: Sequence[str],
                     device: torch.device) -> dict[str, float]:
        """Return every split's metrics, at the one threshold the model has at this site.

        The site-prior threshold costs a pass over the training split; it is computed once
        for all the splits (it depends on the model and the training split only).
        """
        threshold = self.decision_threshold(model, data, device)
        return {f"{split}_{k}": v for split in splits
                for k, v in self._scores(model, data, split, device, threshold).items()}

    def _scores(self, model: nn.Module, data: Any, split: str, device: torch.device,
                threshold: float) -> dict[str, float]:
        x, y = getattr(data, split)
        if x.shape[0] == 0:
            return {}
        return binary_scores(model, x, y, device, getattr(data, f"{split}_groups"),
                             majority=_train_majority(data), threshold=threshold)


def _train_majority(data: Any) -> int | None:
    """Return the majority class of the training split, None without one.

    Ties go to the positive class, as in the protocol's majority-class row (which
    predicts the training share of positives at the 0.5 threshold). Counted over the
    training rows: with sliding windows, a subject counts once per window.
    """
    train = getattr(data, "train", None)
    if not (isinstance(train, tuple) and len(train) == 2
            and isinstance(train[1], torch.Tensor) and train[1].numel() > 0):
        return None
    return int(float(train[1].double().mean()) >= 0.5)
