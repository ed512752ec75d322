"""The X-ray task's objective: cross-entropy to train; ROC AUC, accuracy, F1 to score."""

from __future__ import annotations

import torch
from monai.data import Dataset
from torch import nn

from fedbn_med.tasks.imaging.trainer import ImageObjective, plain
from fedbn_med.training.objective import binary_scores

__all__ = ["Classification"]


class Classification(ImageObjective):
    """Classify whole images (binary); scores are the binary classification metrics (AUC, ...)."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return the cross-entropy of the logits."""
        return nn.functional.cross_entropy(output.float(), target.long().reshape(-1))

    def score_dataset(self, model: nn.Module, dataset: Dataset, device: torch.device
                      ) -> dict[str, float]:
        """Return accuracy, balanced accuracy, ROC AUC, F1, loss, n and the positive share.

        No majority rate: the training labels stay unread here.
        """
        items = [dataset[i] for i in range(len(dataset))]
        x = torch.stack([plain(it["image"]).float() for it in items])
        y = torch.as_tensor([int(it["label"]) for it in items], dtype=torch.int64)
        return binary_scores(model, x, y, device)
