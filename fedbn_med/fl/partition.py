"""Decide which tensors of a model are site-private and which are shared.

This module is the single owner of that decision. A tensor is site-private when it
belongs to a batch-normalisation layer, found by type
(``torch.nn.modules.batchnorm._BatchNorm``: BatchNorm1d/2d/3d, SyncBatchNorm and their
subclasses), never by name: MONAI calls its BN layers ``adn.N`` or ``norm0``, and a
name rule would silently turn FedBN into FedAvg.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = [
    "NoPrivateKeysError",
    "Partition",
    "bn_layers",
    "bn_statistics_keys",
    "bn_variance_keys",
    "partition_model",
    "select",
    "site_private_keys",
]


class NoPrivateKeysError(ValueError):
    """Raised when a strategy needs site-private keys and the model has none."""


@dataclass(frozen=True)
class Partition:
    """An immutable split of a model's state-dict keys into shared and private.

    Attributes
    ----------
    shared : frozenset of str
        Keys that may leave the site and are averaged across sites.
    private : frozenset of str
        Keys of normalisation layers: they never leave the site under FedBN.
    statistics : frozenset of str
        The part of ``private`` that is running statistics (``running_mean``,
        ``running_var``, ``num_batches_tracked``): what SiloBN keeps home while it
        shares the layers' affine ``weight`` and ``bias``.
    """

    shared: frozenset[str]
    private: frozenset[str]
    statistics: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.statistics <= self.private:
            raise ValueError(
                "A partition's statistics keys must be private keys; these are not: "
                f"{sorted(self.statistics - self.private)[:5]}.")

    @property
    def affine(self) -> frozenset[str]:
        """Return the private keys that are trainable parameters (BN weight and bias)."""
        return self.private - self.statistics

    @property
    def all(self) -> frozenset[str]:
        """Return every key of the model's state dict."""
        return self.shared | self.private

    def require_private(self, strategy: str, model_name: str = "model") -> None:
        """Raise if there is nothing site-private for a strategy that keeps it home."""
        if not self.private:
            raise NoPrivateKeysError(
                f"Strategy '{strategy}' keeps normalisation layers at each site, but the "
                f"{model_name} has no batch-normalisation layer (expected at least one "
                "torch.nn.BatchNorm1d/2d/3d or SyncBatchNorm). Use a network with "
                "norm='batch', or choose strategy 'fedavg'."
            )


def _normalisation_modules(model: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm):
            yield name, module


def bn_layers(model: nn.Module, *, tracking: bool = True) -> list[_BatchNorm]:
    """Return the model's batch-normalisation layers, found by type, in module order.

    Parameters
    ----------
    model : torch.nn.Module
        Any network.
    tracking : bool
        Only the layers that keep running statistics (``track_running_stats``).
    """
    return [m for _, m in _normalisation_modules(model)  # type: ignore[misc]
            if not tracking or m.track_running_stats]


def bn_statistics_keys(model: nn.Module) -> frozenset[str]:
    """Return the state-dict keys of the BN layers' buffers (their running statistics)."""
    state_keys = set(model.state_dict().keys())
    keys: set[str] = set()
    for prefix, module in _normalisation_modules(model):
        dotted = f"{prefix}." if prefix else ""
        keys.update(dotted + name for name, _ in module.named_buffers(recurse=False))
    return frozenset(keys & state_keys)


def bn_variance_keys(model: nn.Module) -> frozenset[str]:
    """Return the state-dict keys of the BN layers' running variances (never negative)."""
    state_keys = set(model.state_dict().keys())
    return frozenset({f"{prefix}.running_var" if prefix else "running_var"
                      for prefix, _ in _normalisation_modules(model)} & state_keys)


def site_private_keys(model: nn.Module) -> frozenset[str]:
    """Return the state-dict keys of every parameter and buffer of the BN layers.

    Parameters
    ----------
    model : torch.nn.Module
        Any network; BN layers are found by type at any depth.

    Returns
    -------
    frozenset of str
        Keys such as ``"net.1.weight"``, ``"net.1.running_mean"``,
        ``"net.1.num_batches_tracked"``; empty when the model has no BN layer.
    """
    state_keys = set(model.state_dict().keys())
    keys: set[str] = set()
    for prefix, module in _normalisation_modules(model):
        dotted = f"{prefix}." if prefix else ""
        for local_name, _ in module.named_parameters(recurse=False):
            keys.add(dotted + local_name)
        for local_name, _ in module.named_buffers(recurse=False):
            keys.add(dotted + local_name)
    # Non-persistent buffers are not in the state dict and are never exchanged.
    return frozenset(keys & state_keys)


def partition_model(model: nn.Module) -> Partition:
    """Split a model's state-dict keys into shared and site-private ones."""
    private = site_private_keys(model)
    shared = frozenset(model.state_dict().keys()) - private
    return Partition(shared=shared, private=private, statistics=bn_statistics_keys(model))


def select(state: Mapping[str, torch.Tensor], keys: Iterable[str]) -> dict[str, torch.Tensor]:
    """Return the entries of ``state`` whose key is in ``keys``, in state order."""
    wanted = frozenset(keys)
    return {k: v for k, v in state.items() if k in wanted}
