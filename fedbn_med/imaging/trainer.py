"""Site trainers for images: :class:`SiteTrainer` fed by MONAI datasets instead of tensors.

The federated contract (which keys leave the site, the proximal term, seeding per round,
``train``/``evaluate`` results) is the parent's; what changes is batching (a MONAI
``CacheDataset`` with random augmentation, collated by ``list_data_collate``), the loss,
and the scores: Dice per tissue class for segmentation, ROC AUC for classification.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from monai.data import CacheDataset, DataLoader, Dataset, list_data_collate
from monai.fl.utils.exchange_object import ExchangeObject
from monai.losses import DiceCELoss
from monai.metrics import DiceMetric
from monai.transforms import Compose
from torch import nn
from torch.utils.data import ConcatDataset

from fedbn_med.imaging.readers import decode_items
from fedbn_med.strategies import Strategy
from fedbn_med.trainer import SiteTrainer, derive_seed

__all__ = [
    "ClassificationTrainer",
    "ImageSiteData",
    "ImageTrainer",
    "SegmentationTrainer",
    "make_dataset",
]

logger = logging.getLogger(__name__)

Weights = dict[str, torch.Tensor]


def make_dataset(items: Sequence[Mapping[str, Any]], keys: Sequence[str], transform: Compose,
                 *, cache: bool = True, site: str = "") -> Dataset:
    """Return a MONAI dataset over a split's datalist items, unreadable items left out.

    With ``cache`` each file is decoded once and the deterministic head of ``transform``
    (up to the first random transform) is kept in memory by ``CacheDataset``, so rounds
    only pay for augmentation; without it every epoch decodes and preprocesses again.
    """
    usable = decode_items(items, keys, site, decode=cache)
    if cache:
        return CacheDataset(usable, transform=transform, cache_rate=1.0, num_workers=0,
                            progress=False, copy_cache=False)
    return Dataset(usable, transform=transform)


@dataclass(frozen=True)
class ImageSiteData:
    """A site's training, validation and test MONAI datasets.

    Attributes
    ----------
    input_shape : tuple of int
        Shape of one network input, channel first (``(1, 64, 64)``).
    """

    train: Dataset | ConcatDataset
    val: Dataset
    test: Dataset
    input_shape: tuple[int, ...]

    @property
    def num_train(self) -> int:
        """Return the number of training items (volumes or radiographs)."""
        return len(self.train)

    @staticmethod
    def pooled(datas: Sequence[ImageSiteData]) -> ImageSiteData:
        """Return every site's training data together (no validation/test: sites score)."""
        empty = Dataset([])
        return ImageSiteData(ConcatDataset([d.train for d in datas]), empty, empty,
                             datas[0].input_shape)


def _seed_transforms(dataset: Dataset | ConcatDataset, seed: int) -> None:
    parts = dataset.datasets if isinstance(dataset, ConcatDataset) else [dataset]
    for i, part in enumerate(parts):
        transform = getattr(part, "transform", None)
        if transform is not None and hasattr(transform, "set_random_state"):
            transform.set_random_state(seed=(seed + i) & 0x7FFFFFFF)


class ImageTrainer(SiteTrainer):
    """A :class:`SiteTrainer` whose data are MONAI datasets of ``{"image", "label"}`` dicts.

    Parameters are those of :class:`SiteTrainer`, with ``data`` an :class:`ImageSiteData`
    and ``amp`` (default: on when training on CUDA) for mixed precision. The optimiser is
    Adam, re-created each round as the SGD of the parent is: imaging networks from scratch
    need far fewer rounds with it, which matters on a CPU.
    """

    def __init__(self, site: str, model: nn.Module, data: ImageSiteData, strategy: Strategy,
                 *, lr: float = 1e-3, batch_size: int = 8, local_epochs: int = 1,
                 seed: int = 0, device: str | torch.device | None = "auto",
                 amp: bool | None = None) -> None:
        super().__init__(site, model, data, strategy, lr=lr,  # type: ignore[arg-type]
                         batch_size=batch_size, local_epochs=local_epochs, seed=seed,
                         device=device)
        self.data: ImageSiteData = data  # type: ignore[assignment]
        self.amp = (self.device.type == "cuda") if amp is None else bool(amp)

    def derive(self, site: str, data: ImageSiteData) -> ImageTrainer:
        """Return a fresh trainer like this one (same class, settings, initial model) on other data.

        Used for the pooled (Centralized) trainer over every site's training data.
        """
        twin = copy.copy(self)
        twin.site, twin.data, twin.rounds_trained = site, data, 0
        twin.model = copy.deepcopy(self.model)
        return twin

    def _check_data(self) -> None:
        if self.data.num_train < 2:
            raise ValueError(f"Site '{self.site}' has {self.data.num_train} readable training "
                             "images; at least 2 are needed (batch norm).")

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return the training loss of a batch."""
        raise NotImplementedError

    def score(self, dataset: Dataset) -> dict[str, float]:
        """Return the metrics of the current model on a validation or test dataset."""
        raise NotImplementedError

    def _target(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return torch.as_tensor(batch["label"]).to(self.device)

    def train(self, data: Mapping[str, torch.Tensor] | ExchangeObject,
              extra: dict | None = None) -> tuple[Weights, int, dict[str, float]]:
        """Load the global weights, train on the site's augmented batches, return the update.

        Same contract as :meth:`SiteTrainer.train`; ``num_examples`` counts training items.
        """
        rnd, epochs, anchor = self._begin_round(data, extra)
        _seed_transforms(self.data.train, derive_seed(self.seed, self.site, rnd, "augment"))
        gen = torch.Generator().manual_seed(derive_seed(self.seed, self.site, rnd, "shuffle"))
        loader = DataLoader(self.data.train, batch_size=self.batch_size, shuffle=True,
                            generator=gen, num_workers=0, collate_fn=list_data_collate)
        optimiser = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp)
        self.model.train()
        losses: list[float] = []
        for _ in range(epochs):
            for batch in loader:
                image = torch.as_tensor(batch["image"]).to(self.device, non_blocking=True)
                if image.shape[0] < 2:  # batch norm cannot train on a single example
                    continue
                optimiser.zero_grad(set_to_none=True)
                with torch.autocast(self.device.type, enabled=self.amp):
                    loss = self.loss(self.model(image), self._target(batch))
                prox = self.strategy.proximal_term(self.model, anchor)
                if prox is not None:
                    loss = loss + prox
                scaler.scale(loss).backward()
                scaler.step(optimiser)
                scaler.update()
                losses.append(float(loss.detach()))
        return self._end_round(rnd, self.data.num_train, losses)

    def evaluate(self, data: Mapping[str, torch.Tensor] | ExchangeObject | None = None,
                 extra: dict | None = None) -> dict[str, float] | ExchangeObject:
        """Load the given global weights and score the validation and test datasets."""
        as_exchange = isinstance(data, ExchangeObject)
        weights = data.weights if isinstance(data, ExchangeObject) else data
        self.load_shared(weights or {})
        self.model.eval()
        metrics: dict[str, float] = {}
        for split in ("val", "test"):
            dataset = getattr(self.data, split)
            if len(dataset) == 0:
                continue
            with torch.no_grad(), torch.autocast(self.device.type, enabled=self.amp):
                scores = self.score(dataset)
            metrics.update({f"{split}_{k}": v for k, v in scores.items()})
        return ExchangeObject(metrics=metrics) if as_exchange else metrics


class SegmentationTrainer(ImageTrainer):
    """Segment 2D slices; score Dice per class on each subject's whole slab of slices.

    Training items are slices (``(1, H, W)`` images, ``(1, H, W)`` integer labels);
    validation/test items are volumes ``(1, H, W, D)`` scored slice by slice and stacked.
    """

    def __init__(self, *args: Any, class_names: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.class_names = tuple(class_names)
        self.loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return Dice + cross-entropy against integer label maps."""
        return self.loss_fn(output.float(), target)

    def score(self, dataset: Dataset) -> dict[str, float]:
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


class ClassificationTrainer(ImageTrainer):
    """Classify whole images (binary); scores come from the parent's metrics (AUC, ...)."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return the cross-entropy of the logits."""
        return nn.functional.cross_entropy(output.float(), target.long().reshape(-1))

    def score(self, dataset: Dataset) -> dict[str, float]:
        """Return accuracy, balanced accuracy, ROC AUC, F1 and loss on a dataset."""
        items = [dataset[i] for i in range(len(dataset))]
        x = torch.stack([torch.as_tensor(it["image"]).float() for it in items])
        y = torch.as_tensor([int(it["label"]) for it in items], dtype=torch.int64)
        return self._score(x, y)
