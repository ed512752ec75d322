"""Nuclei segmentation's objective: Dice + cross-entropy to train; Dice and AJI to score.

A validation or test tile is predicted whole by a sliding window of training patches
(a quarter overlap, Gaussian blending); the predicted nuclei are the connected
components of the foreground, scored against the annotated instances by the aggregated
Jaccard index (:func:`fedbn_med.tasks.histo.metrics.aggregated_jaccard`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from monai.inferers import SlidingWindowInferer
from scipy import ndimage

import fedbn_med as fb
from fedbn_med.tasks.histo.metrics import aggregated_jaccard, dice

__all__ = ["NucleiSegmentation"]


class NucleiSegmentation(fb.Segmentation):
    """Segment nuclei (background, nucleus); score Dice and AJI per tile, averaged.

    Parameters
    ----------
    patch : int
        Edge of the sliding window (the training patch).
    batch : int
        Windows per forward pass.
    """

    def __init__(self, patch: int, batch: int = 8) -> None:
        super().__init__(("background", "nucleus"), SlidingWindowInferer(
            roi_size=(patch, patch), sw_batch_size=batch, overlap=0.25, mode="gaussian"))

    def score_dataset(self, model: torch.nn.Module, dataset: Any, device: torch.device
                      ) -> dict[str, float]:
        """Return the mean Dice, AJI and loss over the split's tiles."""
        dices, ajis, losses = [], [], []
        for i in range(len(dataset)):
            item = dataset[i]
            image = torch.as_tensor(item["image"]).as_subclass(torch.Tensor)[None].to(device)
            label = torch.as_tensor(item["label"]).as_subclass(torch.Tensor)[None].to(device)
            logits = self.inferer(image, model).float()
            losses.append(float(self.loss_fn(logits, label)))
            pred = logits.argmax(1)[0].cpu().numpy()
            truth = np.asarray(item["inst"])[0]
            dices.append(dice(pred, truth))
            ajis.append(aggregated_jaccard(truth, ndimage.label(pred)[0]))
        return {"dice": float(np.mean(dices)), "aji": float(np.mean(ajis)),
                "loss": float(np.mean(losses))}
