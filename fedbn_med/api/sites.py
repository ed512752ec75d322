"""A site's data from MONAI datasets, and a site's trainer: what a task's ``build_site`` needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from monai.data import Dataset
from torch import nn

from fedbn_med.fl.registry import get_strategy
from fedbn_med.tasks.imaging.datasets import ImageSiteData
from fedbn_med.tasks.imaging.trainer import ImageObjective, image_optimiser
from fedbn_med.training.objective import Objective
from fedbn_med.training.trainer import SiteTrainer

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

__all__ = ["image_site", "site_trainer"]


def image_site(train: Dataset, val: Dataset, test: Dataset,
               input_shape: tuple[int, ...] | None = None) -> ImageSiteData:
    """Return a site's data from its three MONAI datasets of ``{"image", "label"}`` items.

    Parameters
    ----------
    train, val, test : monai.data.Dataset
        The site's splits; a training item is what the network trains on (a patch),
        a validation or test item what the objective scores (a whole image).
    input_shape : tuple of int, optional
        One network input, channel first; default: the first training item's image.

    Raises
    ------
    ValueError
        When the training split is empty and no ``input_shape`` is given, or its first
        item has no ``"image"``.
    """
    if input_shape is None:
        if len(train) == 0:
            raise ValueError("The training split is empty: give input_shape, or at least "
                             "one training item.")
        first = train[0]
        if isinstance(first, list):  # a transform that cuts several patches per item
            first = first[0]
        if not isinstance(first, Mapping) or "image" not in first:
            raise ValueError(f"A training item is a dict with an 'image' (and 'label'), got "
                             f"{type(first).__name__} with keys "
                             f"{sorted(first) if isinstance(first, Mapping) else '-'}.")
        input_shape = tuple(int(d) for d in torch.as_tensor(first["image"]).shape)
    return ImageSiteData(train, val, test, tuple(input_shape))


def site_trainer(name: str, model: nn.Module, data: Any, objective: Objective, *,
                 spec: RunSpec | None = None, strategy: str = "fedbn", mu: float | None = None,
                 lr: float = 1e-3, batch_size: int = 4, local_epochs: int = 1, seed: int = 0,
                 device: str = "auto", threads: int | None = 1) -> SiteTrainer:
    """Return one site's trainer: its model, data and objective under a strategy.

    With ``spec`` (a task's ``build_site``), the strategy, learning rate, batch size,
    local epochs, seed, BN start and threads are the spec's; the keyword values are the
    defaults of a run without one. Imaging objectives train with Adam, afresh every
    round; others with SGD.
    """
    if spec is not None:
        strategy_obj = spec.strategy_obj()
        lr, batch_size, local_epochs = spec.lr, spec.batch_size, spec.local_epochs
        seed, threads, bn_init = spec.seed, spec.threads, spec.bn_init
        device = device if device != "auto" else spec.device
    else:
        strategy_obj, bn_init = get_strategy(strategy, mu), "data"
    optimiser = image_optimiser(lr) if isinstance(objective, ImageObjective) else "sgd"
    return SiteTrainer(name, model, data, strategy_obj, objective, optimiser, lr=lr,
                       batch_size=batch_size, local_epochs=local_epochs, seed=seed,
                       device=device, bn_init=bn_init, threads=threads)
