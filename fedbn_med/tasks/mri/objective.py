"""The MRI task's objective: Dice + cross-entropy to train, Dice per tissue class to score.

Training items are 3D patches ``(1, p, p, p)`` or 2D slices ``(1, H, W)`` with integer
labels of the same shape. Validation and test items are whole volumes ``(1, H, W, D)``:
a MONAI inferer predicts each one (``SlidingWindowInferer`` over 3D patches, or
``SliceInferer`` over its axial slices in 2D mode), so Dice (``DiceMetric``) is measured
on each subject's volume whatever the network's dimensions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, cast

import numpy as np
import torch
from monai.data import Dataset
from monai.inferers import Inferer, SliceInferer, SlidingWindowInferer
from monai.losses import DiceCELoss
from monai.metrics import DiceMetric

from fedbn_med.tasks import Selection
from fedbn_med.tasks.imaging.trainer import ImageObjective, plain

__all__ = ["Segmentation", "volume_inferer"]


def volume_inferer(spatial_dims: int, roi: int, batch: int = 4) -> Inferer:
    """Return the inferer that predicts a whole volume with a 3D or 2D network.

    Parameters
    ----------
    spatial_dims : {3, 2}
        The network's: 3 uses a sliding window of ``roi`` cubes (a quarter overlap,
        Gaussian blending); 2 runs the network on every axial slice (``roi`` squares).
    roi : int
        Edge of the window (the training patch) or of the slice.
    batch : int
        Windows or slices per forward pass.
    """
    if spatial_dims == 3:
        return SlidingWindowInferer(roi_size=(roi,) * 3, sw_batch_size=batch, overlap=0.25,
                                    mode="gaussian")
    if spatial_dims == 2:
        return SliceInferer(roi_size=(roi, roi), spatial_dim=2, sw_batch_size=16 * batch,
                            overlap=0.0)
    raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims!r}.")


class Segmentation(ImageObjective):
    """Segment patches or slices; score Dice per class on each subject's whole volume.

    Parameters
    ----------
    class_names : sequence of str
        The label classes, background first.
    inferer : monai.inferers.Inferer
        How a whole volume is predicted (see :func:`volume_inferer`).
    """

    #: A run's round is the one of lowest mean validation loss (Dice + cross-entropy),
    #: as for every task so far; ``Selection("dice", lower=False)`` would pick by Dice.
    selection: ClassVar[Selection] = Selection("loss", lower=True)

    def __init__(self, class_names: Sequence[str], inferer: Inferer) -> None:
        self.class_names = tuple(class_names)
        self.inferer = inferer
        self.loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return Dice + cross-entropy against integer label maps."""
        return self.loss_fn(output.float(), target)

    def score_dataset(self, model: torch.nn.Module, dataset: Dataset, device: torch.device
                      ) -> dict[str, float]:
        """Return mean Dice, Dice per foreground class and the loss, over subjects."""
        dice = DiceMetric(include_background=False, reduction="mean_batch",
                          num_classes=len(self.class_names))
        losses = []
        for i in range(len(dataset)):
            item = dataset[i]
            image = plain(item["image"])[None].to(device)  # (1, 1, H, W, D)
            label = plain(item["label"])[None].to(device)
            logits = self.inferer(image, model).float()  # (1, C, H, W, D)
            losses.append(float(self.loss_fn(logits, label)))
            dice(y_pred=logits.argmax(1, keepdim=True), y=label)
        per_class = cast(torch.Tensor, dice.aggregate()).cpu().numpy()
        out = {f"dice_{name}": float(v) for name, v in zip(self.class_names[1:], per_class)}
        out["dice"] = float(np.nanmean(per_class))
        out["loss"] = float(np.mean(losses))
        return out
