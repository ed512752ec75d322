"""Give a new site its own batch-normalisation layers under the federation's weights.

1. running mean and variance estimated on the site's *unlabeled* data (statistics reset,
   then forward passes with the BN layers in training mode and no gradient, cumulative
   average: ``momentum=None``): :func:`estimate_bn_statistics`;
2. scale and shift reset (``weight=1, bias=0``) or set to the average over the training
   sites, where the consortium opted in to share it (:func:`average_bn_affine`,
   :func:`save_bn_affine`, :func:`load_bn_affine`);
3. optionally fine-tuned on a few labeled cases (:func:`few_shot_indices`, seeded): only
   the BN scale and shift learn, every other parameter is frozen and the statistics of
   step 1 stay fixed (:func:`finetune_bn`).

:func:`adapt_model` does steps 1 and 2 on a fresh model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from fedbn_med.checkpoint import load_tensors, save_tensors
from fedbn_med.fl.partition import bn_layers, partition_model, select
from fedbn_med.fl.strategies import weighted_average
from fedbn_med.training.bn_stats import start_bn_statistics
from fedbn_med.training.trainer import ShapeMismatchError, SiteTrainer

__all__ = [
    "adapt_model",
    "average_bn_affine",
    "bn_affine_keys",
    "check_weights",
    "estimate_bn_statistics",
    "few_shot_indices",
    "finetune_bn",
    "load_bn_affine",
    "save_bn_affine",
]

Weights = dict[str, torch.Tensor]
#: ``loss(output, target) -> scalar tensor``: what BN fine-tuning minimises.
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_weights(model: nn.Module, weights: Mapping[str, torch.Tensor], source: str
                  ) -> bool:
    """Check keys and shapes; return whether the weights include the BN layers."""
    partition = partition_model(model)
    partition.require_private("onboarding")
    state = model.state_dict()
    unknown = sorted(set(weights) - set(state))
    missing = sorted(partition.shared - set(weights))
    if unknown or missing:
        raise ValueError(
            f"The weights from {source} do not fit the federation's model: "
            f"missing {missing[:5]}, unknown {unknown[:5]}. Expected the shared keys "
            f"{sorted(partition.shared)[:5]}... (and, for FedAvg, the BN keys too)."
        )
    for key, tensor in weights.items():
        if tuple(tensor.shape) != tuple(state[key].shape):
            raise ShapeMismatchError(
                f"Weight '{key}' from {source} has shape {tuple(tensor.shape)} but the "
                f"model has shape {tuple(state[key].shape)}."
            )
    return partition.private <= set(weights)


def bn_affine_keys(model: nn.Module) -> frozenset[str]:
    """Return the keys of the BN scale and shift parameters (private parameters, no buffers)."""
    params = {name for name, _ in model.named_parameters()}
    return frozenset(partition_model(model).private & params)


def average_bn_affine(trainers: Iterable[SiteTrainer]) -> Weights:
    """Average the training sites' BN scale and shift, weighted by training examples.

    Only sites whose consortium agreed to share these parameters should be passed.
    """
    trainers = list(trainers)
    if not trainers:
        raise ValueError("Cannot average BN scale and shift: no training site was given.")
    keys = bn_affine_keys(trainers[0].model)
    return weighted_average([(select(t.private_state(), keys), t.data.num_train)
                             for t in trainers])


def save_bn_affine(path: str | Path, affine: Mapping[str, torch.Tensor],
                   sites: Sequence[str]) -> Path:
    """Write averaged BN scale and shift to a safetensors file, atomically."""
    return save_tensors(path, affine, {"kind": "bn-affine-average", "sites": list(sites)})


def load_bn_affine(path: str | Path) -> Weights:
    """Read a file written by :func:`save_bn_affine`."""
    tensors, meta = load_tensors(path)
    if meta.get("kind") != "bn-affine-average":
        raise ValueError(
            f"{path} is not a file of averaged BN scale and shift (metadata kind "
            f"{meta.get('kind')!r}, expected 'bn-affine-average'; see save_bn_affine)."
        )
    return tensors


def _set_affine(model: nn.Module, affine: Mapping[str, torch.Tensor] | None) -> None:
    if affine is None:
        for module in bn_layers(model, tracking=False):
            if module.affine:
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        return
    keys = bn_affine_keys(model)
    if set(affine) != set(keys):
        raise ValueError(
            f"The BN scale/shift must hold exactly the model's BN parameters {sorted(keys)}; "
            f"got {sorted(affine)}."
        )
    state = model.state_dict()
    with torch.no_grad():
        for key, tensor in affine.items():
            if tuple(tensor.shape) != tuple(state[key].shape):
                raise ShapeMismatchError(
                    f"BN parameter '{key}' has shape {tuple(tensor.shape)} but the model "
                    f"has shape {tuple(state[key].shape)}."
                )
            state[key].copy_(tensor)


def estimate_bn_statistics(model: nn.Module, x: torch.Tensor | Sequence[torch.Tensor],
                           batch_size: int = 512) -> None:
    """Re-estimate every BN layer's running mean and variance on unlabeled inputs.

    The statistics are reset and accumulated as a cumulative average over the batches
    (``momentum=None``); with one batch they are exactly the data's. ``x`` is one tensor
    (cut into batches of ``batch_size``) or a sequence of batches as they come (e.g. a
    dataset site's patches). Only the BN layers run in training mode, so dropout stays
    off as at test time (which is why this does not use
    ``torch.optim.swa_utils.update_bn``): the pass of
    :func:`fedbn_med.training.bn_stats.start_bn_statistics`.
    """
    chunks = ([x[start:start + batch_size] for start in range(0, x.shape[0], batch_size)]
              if isinstance(x, torch.Tensor) else list(x))
    n = sum(int(c.shape[0]) for c in chunks)
    if n < 2:
        raise ValueError(f"Estimating BN statistics needs at least 2 examples, got {n}.")
    if not bn_layers(model):
        raise ValueError("The model has no BN layer with running statistics to estimate.")
    start_bn_statistics(model, iter(chunks), next(model.parameters()).device, only_bn=True)


def finetune_bn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int = 50,
                lr: float = 0.05, loss: Loss = nn.functional.cross_entropy) -> list[float]:
    """Fine-tune only the BN scale and shift on labeled cases; return the losses.

    Every other parameter is frozen. The model stays in evaluation mode, so the BN
    layers normalise with the statistics estimated on the site's unlabeled data: a few
    labeled cases would give poor batch statistics. ``loss(output, target)`` is the
    task's (its objective's; cross-entropy of class logits by default).
    """
    if steps < 1 or not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"steps must be >= 1 and lr positive, got steps={steps}, lr={lr}.")
    keys = bn_affine_keys(model)
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    trainable = [p for name, p in model.named_parameters() if name in keys]
    if not trainable:
        raise ValueError("The model has no BN scale or shift to fine-tune.")
    device = next(model.parameters()).device
    xb, yb = x.to(device), y.to(device)
    optimiser = torch.optim.SGD(trainable, lr=lr)
    was_training = model.training
    model.eval()
    losses = []
    try:
        for name, p in model.named_parameters():
            p.requires_grad_(name in keys)
        for _ in range(steps):
            optimiser.zero_grad(set_to_none=True)
            value = loss(model(xb), yb)
            value.backward()
            optimiser.step()
            losses.append(float(value.detach()))
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(flags[name])
        model.train(was_training)
    return losses


def adapt_model(model: nn.Module, weights: Mapping[str, torch.Tensor],
                unlabeled: torch.Tensor | Sequence[torch.Tensor], *,
                affine: Mapping[str, torch.Tensor] | None = None, batch_size: int = 512,
                source: str = "the federation") -> nn.Module:
    """Give a model the federation's shared weights and the site's own BN layers.

    Parameters
    ----------
    model : torch.nn.Module
        A fresh model of the federation's architecture; changed in place.
    weights : mapping
        The federation's weights; only the shared (non-BN) keys are used.
    unlabeled : torch.Tensor or sequence of torch.Tensor
        The site's inputs on which the BN statistics are estimated (one tensor, or its
        batches: see :func:`estimate_bn_statistics`).
    affine : mapping, optional
        BN scale and shift to use (e.g. averaged over the training sites); None resets
        them to ``weight=1, bias=0``.
    batch_size : int
        Batch size of the statistics pass (when ``unlabeled`` is one tensor).
    source : str
        Where the weights came from, for error messages.

    Returns
    -------
    torch.nn.Module
        ``model``, in evaluation mode.
    """
    check_weights(model, weights, source)
    shared = select(weights, partition_model(model).shared)
    state = model.state_dict()
    with torch.no_grad():
        for key, tensor in shared.items():
            state[key].copy_(tensor)
    _set_affine(model, affine)
    estimate_bn_statistics(model, unlabeled, batch_size)
    return model.eval()


def few_shot_indices(labels: torch.Tensor, shots: int, seed: int) -> torch.Tensor:
    """Draw ``shots`` examples of every class, reproducibly."""
    gen = torch.Generator().manual_seed(seed)
    picked = []
    for cls in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == cls).flatten()
        if idx.numel() < shots:
            counts = {int(c): int((labels == c).sum()) for c in torch.unique(labels)}
            raise ValueError(
                f"shots={shots} labeled cases per class were asked for, but class {cls} has "
                f"only {idx.numel()} (cases per class: {counts}). Use shots <= "
                f"{min(counts.values())}."
            )
        picked.append(idx[torch.randperm(idx.numel(), generator=gen)[:shots]])
    return torch.sort(torch.cat(picked)).values
