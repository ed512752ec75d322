"""The MRI task's objective: Dice + cross-entropy to train, Dice per tissue class to score.

Training items are slices (``(1, H, W)`` images, ``(1, H, W)`` integer labels);
validation/test items are volumes ``(1, H, W, D)`` scored slice by slice and stacked, so
Dice is measured on each subject's whole slab.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from monai.data import Dataset
from monai.losses import DiceCELoss
from monai.metrics import DiceMetric

from fedbn_med.tasks.imaging.trainer import ImageTrainer

__all__ = ["SegmentationTrainer"]


class SegmentationTrainer(ImageTrainer):
    """Segment 2D slices; score Dice per class on each subject's whole slab of slices.

    Parameters are those of :class:`~fedbn_med.tasks.imaging.trainer.ImageTrainer`, plus
    ``class_names`` (background first).
    """

    def __init__(self, *args: Any, class_names: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.class_names = tuple(class_names)
        self.loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return Dice + cross-entropy against integer label maps."""
        return self.loss_fn(output.float(), target)

    def score_dataset(self, dataset: Dataset) -> dict[str, float]:
        """Return mean Dice, Dice per foreground class and the loss, over subjects."""
        n_classes = len(self.class_names)
        dice = DiceMetric(include_background=False, reduction="mean_batch",
                          num_classes=n_classes)
        losses = []
        for item in dataset:
            image = torch.as_tensor(item["image"]).to(self.device)  # (1, H, W, D)
            label = torch.as_tensor(item["label"]).to(self.device)
            slices = image.permute(3, 0, 1, 2)  # each z slice a batch entry
            logits = torch.cat([self.model(slices[s:s + 64]).float()
                                for s in range(0, slices.shape[0], 64)])
            volume = logits.permute(1, 2, 3, 0)[None]  # (1, C, H, W, D)
            losses.append(float(self.loss_fn(volume, label[None])))
            dice(y_pred=volume.argmax(1, keepdim=True), y=label[None])
        per_class = dice.aggregate().cpu().numpy()
        out = {f"dice_{name}": float(v) for name, v in zip(self.class_names[1:], per_class)}
        out["dice"] = float(np.nanmean(per_class))
        out["loss"] = float(np.mean(losses))
        return out
