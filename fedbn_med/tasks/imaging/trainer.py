"""The imaging objective: :class:`SiteTrainer` fed by MONAI datasets instead of tensors.

The federated contract (which keys leave the site, the round hooks, seeding per round,
``train``/``evaluate`` results) is the trainer's; what changes is batching (a MONAI
``CacheDataset`` with random augmentation, collated by ``list_data_collate``) and the
optimiser (Adam, afresh every round, with a gradient scaler under mixed precision). Each
task gives the loss and the scores in its ``objective`` module: Dice per tissue class
for MRI segmentation (:mod:`fedbn_med.tasks.mri.objective`), ROC AUC for X-ray
classification (:mod:`fedbn_med.tasks.xray.objective`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch
from monai.data import DataLoader, Dataset, list_data_collate
from torch import nn
from torch.utils.data import ConcatDataset, RandomSampler, Sampler

from fedbn_med.tasks.imaging.datasets import ImageSiteData
from fedbn_med.training.objective import Objective, Seeds, batch_bounds
from fedbn_med.training.optim import Adam
from fedbn_med.training.trainer import SiteTrainer

__all__ = ["ImageObjective", "image_optimiser", "plain", "pooled_trainer"]


def plain(value: Any) -> torch.Tensor:
    """Return ``value`` as a plain :class:`torch.Tensor`, sharing its memory.

    MONAI's transforms give ``MetaTensor``s, and ``torch.as_tensor`` returns one unchanged:
    every operation of a forward and backward pass on it then goes through its
    ``__torch_function__`` in Python, to carry the metadata along. The networks need the
    values only; the numbers are the same.
    """
    if isinstance(value, torch.Tensor):
        return value.as_subclass(torch.Tensor)
    return torch.as_tensor(value)


def _seed_transforms(dataset: Dataset | ConcatDataset, seed: int) -> None:
    parts = dataset.datasets if isinstance(dataset, ConcatDataset) else [dataset]
    for i, part in enumerate(parts):
        transform = getattr(part, "transform", None)
        if transform is not None and hasattr(transform, "set_random_state"):
            transform.set_random_state(seed=(seed + i) & 0x7FFFFFFF)


class _Batches(Sampler[list[int]]):
    """Index batches of one shuffled pass, cut by :func:`batch_bounds`.

    A last batch of fewer than four items joins the one before it, as in every task.
    """

    def __init__(self, sampler: RandomSampler, batch_size: int) -> None:
        self.sampler = sampler
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[int]]:
        order = list(self.sampler)
        for start, stop in batch_bounds(len(order), self.batch_size):
            yield order[start:stop]

    def __len__(self) -> int:
        return len(batch_bounds(len(self.sampler), self.batch_size))


def image_optimiser(lr: float) -> Adam:
    """Return the imaging tasks' optimiser: Adam, created afresh every round.

    Imaging networks from scratch need far fewer rounds with it than with SGD, which
    matters on a CPU.
    """
    return Adam(lr, per_round=True)


class ImageObjective(Objective):
    """Batching of an :class:`ImageSiteData` (``{"image", "label"}`` dicts); tasks add the rest.

    Subclasses give :meth:`loss` and :meth:`score_dataset`. Mixed precision is on by
    default on CUDA.
    """

    mixed_precision: ClassVar[bool] = True

    def check(self, site: str, model: nn.Module, data: Any) -> None:
        """Refuse a site with fewer than 2 readable training images (batch norm)."""
        if data.num_train < 2:
            raise ValueError(f"Site '{site}' has {data.num_train} readable training "
                             "images; at least 2 are needed (batch norm).")

    def batches(self, data: Any, batch_size: int, epochs: int, seeds: Seeds
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield the round's augmented, shuffled batches (augmentation seeded per round)."""
        _seed_transforms(data.train, seeds("augment"))
        gen = torch.Generator().manual_seed(seeds("shuffle"))
        # the order DataLoader(shuffle=True) would draw, cut by the trainer's one batch rule
        sampler = _Batches(RandomSampler(data.train, generator=gen), batch_size)
        # the loader draws each pass's base seed from ``gen`` first, as with shuffle=True
        loader = DataLoader(data.train, batch_sampler=sampler, generator=gen, num_workers=0,
                            collate_fn=list_data_collate)
        for _ in range(epochs):
            for batch in loader:
                image = plain(batch["image"])
                if image.shape[0] < 2:  # batch norm cannot train on a single example
                    continue
                yield image, self.target(batch)

    def target(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Return a batch's training target."""
        return plain(batch["label"])

    def bn_inputs(self, data: Any, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
        """Yield the site's training inputs as training sees them (augmented, seeded).

        What the BN running statistics are re-estimated from (``fedavg_localbn``): one
        pass of training-sized batches of the training items' augmented patches, slices
        or images, drawn with a fixed seed so that every scoring sees the same pass.
        """
        _seed_transforms(data.train, seed)
        loader = DataLoader(data.train, batch_size=batch_size, shuffle=False,
                            num_workers=0, collate_fn=list_data_collate)
        for batch in loader:
            yield plain(batch["image"])

    def score(self, model: nn.Module, data: Any, split: str, device: torch.device
              ) -> dict[str, float]:
        """Return :meth:`score_dataset` of a split (``{}`` when it is empty)."""
        dataset = getattr(data, split)
        if len(dataset) == 0:
            return {}
        return self.score_dataset(model, dataset, device)

    def score_dataset(self, model: nn.Module, dataset: Dataset, device: torch.device
                      ) -> dict[str, float]:
        """Return the metrics of ``model`` on a validation or test dataset."""
        raise NotImplementedError


def pooled_trainer(trainers: Mapping[str, SiteTrainer], config: object = None
                   ) -> SiteTrainer:
    """Return a trainer over every site's training data (the Centralized baseline).

    It is the first imaging site's trainer derived (same settings and initial model) onto
    :meth:`ImageSiteData.pooled` of the sites' data.
    """
    sites = [t for t in trainers.values() if isinstance(t.objective, ImageObjective)]
    if not sites:
        raise ValueError("The pooled imaging trainer needs at least one imaging site trainer.")
    return sites[0].derive("pooled", ImageSiteData.pooled([t.data for t in sites]))
