"""The imaging site trainer: :class:`SiteTrainer` fed by MONAI datasets instead of tensors.

The federated contract (which keys leave the site, the proximal term, seeding per round,
``train``/``evaluate`` results) is the parent's; what changes is batching (a MONAI
``CacheDataset`` with random augmentation, collated by ``list_data_collate``). Each task
gives the loss and the scores in its ``objective`` module: Dice per tissue class for MRI
segmentation (:mod:`fedbn_med.tasks.mri.objective`), ROC AUC for X-ray classification
(:mod:`fedbn_med.tasks.xray.objective`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from typing import Any

import torch
from monai.data import DataLoader, Dataset, list_data_collate
from torch import nn
from torch.utils.data import ConcatDataset

from fedbn_med.fl.privacy import UpdatePrivacy
from fedbn_med.fl.strategies import Strategy
from fedbn_med.tasks.imaging.datasets import ImageSiteData
from fedbn_med.training.trainer import SiteTrainer, derive_seed

__all__ = ["ImageTrainer", "pooled_trainer"]

Weights = dict[str, torch.Tensor]


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
                 amp: bool | None = None, privacy: UpdatePrivacy | None = None,
                 threads: int | None = None) -> None:
        super().__init__(site, model, data, strategy, lr=lr,  # type: ignore[arg-type]
                         batch_size=batch_size, local_epochs=local_epochs, seed=seed,
                         device=device, privacy=privacy, threads=threads)
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

    def score_dataset(self, dataset: Dataset) -> dict[str, float]:
        """Return the metrics of the current model on a validation or test dataset."""
        raise NotImplementedError

    def _bn_batches(self) -> Iterator[torch.Tensor]:
        """Yield the site's training inputs as training sees them (augmented, seeded).

        What the BN running statistics are re-estimated from (``fedavg_localbn``): one
        pass of training-sized batches of the training items' augmented patches, slices
        or images, drawn with a fixed seed so that every scoring sees the same pass.
        """
        _seed_transforms(self.data.train, derive_seed(self.seed, self.site, "bn-statistics"))
        loader = DataLoader(self.data.train, batch_size=self.batch_size, shuffle=False,
                            num_workers=0, collate_fn=list_data_collate)
        for batch in loader:
            yield torch.as_tensor(batch["image"])

    def _target(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return torch.as_tensor(batch["label"]).to(self.device)

    def fit(self, data: Mapping[str, torch.Tensor], extra: dict | None = None,
            control: Mapping[str, torch.Tensor] | None = None
            ) -> tuple[Weights, int, dict[str, float]]:
        """Load the global weights, train on the site's augmented batches, return the update.

        Same contract as :meth:`SiteTrainer.fit`; ``num_examples`` counts training items.
        """
        rnd, epochs, anchor = self._begin_round(data, extra, control)
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
                # SCAFFOLD's correction, applied to the gradient Adam then uses
                self._correct_gradients(scale=scaler.get_scale() if self.amp else 1.0)
                scaler.step(optimiser)
                scaler.update()
                losses.append(float(loss.detach()))
        return self._end_round(rnd, self.data.num_train, losses)

    def score(self, data: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Load the given global weights and score the validation and test datasets.

        Same contract as :meth:`SiteTrainer.score`; each split is scored by
        :meth:`score_dataset`, which the task's objective defines. Under a strategy that
        scores with the site's own BN statistics (``fedavg_localbn``) they are first
        re-estimated on this site's training data (:meth:`_bn_batches`) and put back after.
        """
        self.load_shared(data or {})
        metrics: dict[str, float] = {}
        # fedavg_localbn: the shared model with BN statistics of this site's training data
        with (self.site_bn_statistics() if self.strategy.site_bn_at_score
              else nullcontext()):
            self.model.eval()
            for split in ("val", "test"):
                dataset = getattr(self.data, split)
                if len(dataset) == 0:
                    continue
                with torch.no_grad(), torch.autocast(self.device.type, enabled=self.amp):
                    scores = self.score_dataset(dataset)
                metrics.update({f"{split}_{k}": v for k, v in scores.items()})
        return metrics


def pooled_trainer(trainers: Mapping[str, SiteTrainer], config: object = None
                   ) -> ImageTrainer:
    """Return a trainer over every site's training data (the Centralized baseline).

    It is the first site's trainer derived (same class, settings and initial model) onto
    :meth:`ImageSiteData.pooled` of the sites' data.
    """
    sites = [t for t in trainers.values() if isinstance(t, ImageTrainer)]
    if not sites:
        raise ValueError("The pooled imaging trainer needs at least one imaging site trainer.")
    return sites[0].derive("pooled", ImageSiteData.pooled([t.data for t in sites]))
