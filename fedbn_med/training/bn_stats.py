"""Batch-norm running statistics estimated from a site's data: the one place that does it.

The BN layers are those :func:`fedbn_med.fl.partition.bn_layers` finds (by type). A site
trainer starts them from its training data before its first step
(:meth:`~fedbn_med.training.trainer.SiteTrainer.fit` with ``bn_init="data"``), scores
with re-estimated ones under ``fedavg_localbn`` (:func:`site_bn_statistics`), and
onboarding gives a new site its own (:func:`fedbn_med.onboarding.bn_adapt.adapt_model`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from fedbn_med.fl.partition import bn_layers

__all__ = ["site_bn_statistics", "start_bn_statistics"]

_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


@torch.no_grad()
def start_bn_statistics(model: nn.Module, batches: Iterable[torch.Tensor],
                        device: torch.device | str = "cpu", *, only_bn: bool = True) -> bool:
    """Set every BN layer's running mean and variance from one pass over ``batches``.

    The layers are reset and see the batches with a cumulative average
    (``momentum=None``), in training mode; their momentum and every module's mode are
    restored afterwards. Batches of one example are skipped (batch norm cannot use them).

    Parameters
    ----------
    model : torch.nn.Module
        Any network; a model without BN layers is left as it is.
    batches : iterable of torch.Tensor
        Input batches, e.g. a site's training data in training-sized batches.
    device : torch.device or str
        Where the model computes.
    only_bn : bool
        Put only the BN layers in training mode (dropout and the rest stay in evaluation
        mode, as when the model is scored); False: the whole model trains.

    Returns
    -------
    bool
        Whether any BN layer saw a batch.
    """
    layers = bn_layers(model)
    if not layers:
        return False
    saved = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over this pass
    modes = [(m, m.training) for m in model.modules()]
    if only_bn:
        model.eval()
        for m in layers:
            m.train()
    else:
        model.train()
    seen = False
    try:
        for batch in batches:
            if batch.shape[0] >= 2:
                model(batch.to(device))
                seen = True
    finally:
        for m, momentum in zip(layers, saved):
            m.momentum = momentum
        for module, mode in modes:
            module.training = mode
    return seen


@contextmanager
def site_bn_statistics(model: nn.Module, batches: Iterable[torch.Tensor],
                       device: torch.device | str = "cpu") -> Iterator[None]:
    """Hold BN running statistics re-estimated on ``batches`` inside the block.

    Every BN layer holds statistics from one pass of the current model over the
    batches, with only the BN layers in training mode (no dropout, as when scoring); on
    leaving the block the layers' buffers are put back, so the re-estimated statistics
    never reach an update.
    """
    layers = bn_layers(model)
    saved = [{k: v.clone() for k, v in m.state_dict().items() if k in _STATISTICS}
             for m in layers]
    try:
        start_bn_statistics(model, batches, device, only_bn=True)
        yield
    finally:
        with torch.no_grad():
            for m, state in zip(layers, saved):
                for key, value in state.items():
                    getattr(m, key).copy_(value)
