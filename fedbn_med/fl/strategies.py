"""Federated strategies as small objects, and the aggregation they share.

A strategy answers three questions: which keys leave a site (``exchanged_keys``), what
is added to the local loss (``proximal_term``), and whether the sites' data are pooled
(``pooled``, the centralized upper bound). What it adds to a site's local round is the
round hooks it supplies (``site_hooks``, :mod:`fedbn_med.fl.hooks`): the proximal term,
client-level DP, SCAFFOLD. Aggregation itself is one pure function,
:func:`weighted_average`, used by the in-process driver and by the Flower server.

FedBN is FedAvg with the site-private keys kept home; FedProx is FedAvg plus a proximal
term; FedBN with FedProx is ``FedBN(mu=0.01)``; SCAFFOLD is FedAvg with control variates
(``controls``) on the exchanged parameters, and FedBN with SCAFFOLD keeps BN home, so its
BN layers have no control variate. Adding a strategy means one class (here, or in a
module of its own when it brings a round hook) and
one entry in :data:`fedbn_med.fl.registry.STRATEGIES`.

Baselines that isolate FedBN's mechanism: SiloBN shares the BN layers' affine weight and
bias and keeps only their running statistics home; ``fedavg_localbn`` trains exactly as
FedAvg and scores the shared model after each site re-estimates the BN running statistics
on its own training data; ``fedavg_sitez`` and ``fedavg_combat`` are FedAvg on features
harmonised per site (the task applies ``features``; only tabular-feature tasks offer it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # torch is imported where a tensor is computed: the run spec stays light
    import torch
    from torch import nn

    from fedbn_med.fl.hooks import HookedSite, Releases, RoundHook
    from fedbn_med.fl.partition import Partition
    from fedbn_med.fl.privacy import UpdatePrivacy

__all__ = [
    "Centralized",
    "FedAvg",
    "FedBN",
    "FedBNScaffold",
    "FedAvgCombat",
    "FedAvgLocalBN",
    "FedAvgSiteZ",
    "FedProx",
    "Scaffold",
    "SiloBN",
    "SingleSet",
    "Strategy",
    "weighted_average",
]


@dataclass(frozen=True)
class Strategy:
    """Base of every strategy: FedAvg semantics, nothing kept private, no proximal term.

    Attributes
    ----------
    mu : float
        Weight of the proximal term ``mu/2 * ||w - w_global||^2`` (0 disables it).
    """

    name: ClassVar[str] = "base"
    keeps_private: ClassVar[bool] = False
    exchanges: ClassVar[bool] = True
    pooled: ClassVar[bool] = False
    #: Reads every site's data in one place (pooled training, or ComBat's pooled fit):
    #: not federated, so it runs in process only, and no site runs it for a server.
    reads_every_site: ClassVar[bool] = False
    controls: ClassVar[bool] = False
    #: Score after re-estimating the BN running statistics on the site's training data.
    site_bn_at_score: ClassVar[bool] = False
    #: A feature transform the task applies to every site's data (None: the task's own).
    features: ClassVar[str | None] = None
    mu: float = 0.0

    def __post_init__(self) -> None:
        if not (self.mu >= 0.0):  # also rejects NaN
            raise ValueError(f"mu must be a non-negative number, got {self.mu}.")

    @property
    def label(self) -> str:
        """Return a display name, e.g. ``fedbn`` or ``fedbn+prox(mu=0.01)``."""
        if self.mu > 0 and self.name != "fedprox":
            return f"{self.name}+prox(mu={self.mu:g})"
        return self.name

    def kept_keys(self, partition: Partition) -> frozenset[str]:
        """Return the keys that never leave a site: every key it does not exchange."""
        return partition.all - self.exchanged_keys(partition)

    def exchanged_keys(self, partition: Partition) -> frozenset[str]:
        """Return the keys a site sends to and receives from the server."""
        if not self.exchanges:
            return frozenset()
        if self.keeps_private:
            partition.require_private(self.name)
            return partition.shared
        return partition.all

    def controlled_keys(self, partition: Partition, parameters: frozenset[str]
                        ) -> frozenset[str]:
        """Return the keys that carry a SCAFFOLD control variate (none unless ``controls``).

        These are the exchanged trainable parameters: buffers (BN running statistics) have
        no gradient, and keys kept at the site are never corrected.
        """
        if not self.controls:
            return frozenset()
        return self.exchanged_keys(partition) & parameters

    def proximal_term(
        self, model: nn.Module, anchor: Mapping[str, torch.Tensor]
    ) -> torch.Tensor | None:
        """Return ``mu/2 * ||w - w_anchor||^2`` over the anchored parameters, or None."""
        if self.mu == 0.0 or not anchor:
            return None
        import torch

        total: torch.Tensor | None = None
        for name, param in model.named_parameters():
            ref = anchor.get(name)
            if ref is None:
                continue
            sq = torch.sum((param - ref) ** 2)
            total = sq if total is None else total + sq
        return None if total is None else 0.5 * self.mu * total

    def site_hooks(self, site: HookedSite, privacy: UpdatePrivacy | None = None,
                   releases: Releases | None = None) -> list[RoundHook]:
        """Return the hooks of a site's local round, in the order they run.

        The proximal term (``mu > 0``), client-level DP (``privacy``, when the site sends
        anything; it extends ``releases``), then SCAFFOLD (``controls``): its variate is
        updated from what DP released.
        """
        from fedbn_med.fl.hooks import DPHook, ProximalHook, Releases
        from fedbn_med.fl.scaffold import ScaffoldHook

        hooks: list[RoundHook] = []
        if self.mu > 0:
            hooks.append(ProximalHook(self))
        if privacy is not None and site.exchanged:
            hooks.append(DPHook(privacy, releases if releases is not None else Releases()))
        parameters = frozenset(name for name, _ in site.model.named_parameters())
        controlled = self.controlled_keys(site.partition, parameters)
        if controlled:
            hooks.append(ScaffoldHook(site.model.state_dict(), controlled, site.lr))
        return hooks


@dataclass(frozen=True)
class FedAvg(Strategy):
    """Average every key across sites, BN statistics included (the paper's baseline)."""

    name: ClassVar[str] = "fedavg"


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg plus the proximal term in each site's local loss."""

    name: ClassVar[str] = "fedprox"
    mu: float = 1e-2


@dataclass(frozen=True)
class FedBN(FedAvg):
    """FedAvg with every normalisation-layer tensor kept at its site."""

    name: ClassVar[str] = "fedbn"
    keeps_private: ClassVar[bool] = True


@dataclass(frozen=True)
class Scaffold(FedAvg):
    """FedAvg with control variates that correct each site's drift (Karimireddy et al.)."""

    name: ClassVar[str] = "scaffold"
    controls: ClassVar[bool] = True


@dataclass(frozen=True)
class FedBNScaffold(FedBN):
    """FedBN with SCAFFOLD's control variates on the shared weights only."""

    name: ClassVar[str] = "fedbn-scaffold"
    controls: ClassVar[bool] = True


@dataclass(frozen=True)
class SiloBN(FedAvg):
    """Share the BN layers' weight and bias; keep their running statistics at each site.

    SiloBN (Andreux et al., 2020): between FedAvg, which averages every BN tensor, and
    FedBN, which keeps every BN tensor home. Which keys are statistics is decided by
    :func:`fedbn_med.fl.partition.partition_model` (BN layers found by type).
    """

    name: ClassVar[str] = "silobn"

    def exchanged_keys(self, partition: Partition) -> frozenset[str]:
        """Return every key except the BN running statistics."""
        partition.require_private(self.name)
        return partition.all - partition.statistics


@dataclass(frozen=True)
class FedAvgLocalBN(FedAvg):
    """FedAvg, scored with each site's own BN running statistics.

    Training and aggregation are FedAvg's. Before scoring, a site re-estimates the BN
    running mean and variance of the shared model on its own training data; the
    re-estimated statistics stay at the site and are dropped after scoring, so what the
    site sends next round is FedAvg's update.
    """

    name: ClassVar[str] = "fedavg_localbn"
    site_bn_at_score: ClassVar[bool] = True


@dataclass(frozen=True)
class FedAvgSiteZ(FedAvg):
    """FedAvg on features standardised per site with the site's training statistics."""

    name: ClassVar[str] = "fedavg_sitez"
    features: ClassVar[str | None] = "site_z"


@dataclass(frozen=True)
class FedAvgCombat(FedAvg):
    """FedAvg on ComBat-harmonised features, ComBat fitted on training rows only."""

    name: ClassVar[str] = "fedavg_combat"
    features: ClassVar[str | None] = "combat"
    reads_every_site: ClassVar[bool] = True  # ComBat's pooled mean and variance


@dataclass(frozen=True)
class SingleSet(Strategy):
    """Train each site on its own data; nothing is exchanged."""

    name: ClassVar[str] = "singleset"
    exchanges: ClassVar[bool] = False


@dataclass(frozen=True)
class Centralized(Strategy):
    """Pool every site's training data into one model (an upper bound, not federated)."""

    name: ClassVar[str] = "centralized"
    pooled: ClassVar[bool] = True
    reads_every_site: ClassVar[bool] = True


def weighted_average(
    updates: Sequence[tuple[Mapping[str, torch.Tensor], int]],
) -> dict[str, torch.Tensor]:
    """Average state tensors key by key, weighted by each site's number of examples.

    Parameters
    ----------
    updates : sequence of (state, num_examples)
        Every state must hold the same keys with the same shapes.

    Returns
    -------
    dict of str to torch.Tensor
        The weighted mean, computed in float64 and cast back to each key's dtype
        (integer counters such as ``num_batches_tracked`` are rounded).
    """
    import torch

    if not updates:
        raise ValueError("Cannot aggregate: no site sent an update.")
    total = sum(int(n) for _, n in updates)
    if total <= 0:
        raise ValueError(
            f"Cannot aggregate: the sites reported {total} training examples in all "
            "(expected a positive number)."
        )
    keys = list(updates[0][0].keys())
    for state, _ in updates[1:]:
        if set(state.keys()) != set(keys):
            missing = sorted(set(keys) ^ set(state.keys()))
            raise ValueError(f"Updates disagree on their keys: {missing[:5]} ...")
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        ref = updates[0][0][key]
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for state, n in updates:
            tensor = state[key]
            if tensor.shape != ref.shape:
                raise ValueError(
                    f"Updates disagree on the shape of '{key}': {tuple(ref.shape)} "
                    f"and {tuple(tensor.shape)}."
                )
            acc += tensor.detach().to("cpu", torch.float64) * (int(n) / total)
        if ref.dtype.is_floating_point:
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = torch.round(acc).to(ref.dtype)
    return out
