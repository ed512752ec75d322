"""Round hooks: what a strategy adds to a site's local round, and the site state it keeps.

A site's round (:meth:`fedbn_med.training.trainer.SiteTrainer.fit`) is one loop; what a
strategy adds to it is a :class:`RoundHook` that the strategy supplies
(:meth:`fedbn_med.fl.strategies.Strategy.site_hooks`). The trainer calls every hook, in
order, at these points:

- ``begin``: the global weights are loaded (and the BN statistics started), before the
  first local step;
- ``penalty``: a term added to each batch's loss (FedProx's proximal term);
- ``after_backward``: after each backward pass, before the optimiser's step (SCAFFOLD's
  gradient correction);
- ``end``: on the weights the site is about to send; a hook may replace them (client-level
  DP clips and noises them) and add to the round's metrics;
- ``state`` / ``load``: what survives a restart, saved with the site's private layers
  (tensors named ``<hook>/<key>``, :func:`split_site_state`).

This module holds the base, :class:`ProximalHook` and :class:`DPHook` with the site's
release history (:class:`Releases`); SCAFFOLD's hook is
:class:`fedbn_med.fl.scaffold.ScaffoldHook`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:  # the hooks compute on tensors, but importing them loads no torch
    import torch
    from torch import nn

    from fedbn_med.fl.partition import Partition
    from fedbn_med.fl.privacy import UpdatePrivacy
    from fedbn_med.fl.strategies import Strategy

__all__ = ["DPHook", "HookedSite", "ProximalHook", "Releases", "RoundHook", "split_site_state"]

Weights = dict[str, "torch.Tensor"]

logger = logging.getLogger(__name__)
#: (strategy, site, mu) already told that one local step leaves the proximal term idle
_ONE_STEP_TOLD: set[tuple[str, str, float]] = set()


def split_site_state(tensors: Mapping[str, torch.Tensor]) -> tuple[Weights, Weights]:
    """Return ``(layers, hooks)`` of a saved site state.

    A hook names the tensors it saves ``<hook>/<key>`` (SCAFFOLD's ``control/<key>``);
    a model's keys never hold a ``/``. So a site's state file needs no list of hooks.
    """
    layers: Weights = {}
    hooks: Weights = {}
    for key, value in tensors.items():
        (hooks if "/" in key else layers)[key] = value
    return layers, hooks


class HookedSite(Protocol):
    """What a hook may read of the site it runs at (a site trainer)."""

    @property
    def site(self) -> str:
        """Return the site's name."""
        ...

    @property
    def seed(self) -> int:
        """Return the run's base seed."""
        ...

    @property
    def lr(self) -> float:
        """Return the local learning rate."""
        ...

    @property
    def device(self) -> torch.device:
        """Return where the model computes."""
        ...

    @property
    def model(self) -> nn.Module:
        """Return the site's network."""
        ...

    @property
    def partition(self) -> Partition:
        """Return the split of the model's keys into shared and private."""
        ...

    @property
    def exchanged(self) -> frozenset[str]:
        """Return the keys the site sends and receives."""
        ...

    def shared_weights(self) -> Weights:
        """Return copies of the exchanged tensors, on the CPU."""
        ...


class RoundHook:
    """A strategy's part of a local round; every method does nothing unless overridden."""

    def begin(self, site: HookedSite, rnd: int, server: Mapping[str, torch.Tensor]) -> None:
        """Prepare round ``rnd`` (``server``: what the server sent besides the weights)."""

    def penalty(self, model: nn.Module) -> torch.Tensor | None:
        """Return a term to add to a batch's loss, or None."""
        return None

    def after_backward(self, scale: float) -> None:
        """Act on the gradients of one step (``scale``: a gradient scaler's current scale)."""

    def end(self, site: HookedSite, rnd: int, sent: Weights,
            metrics: dict[str, float]) -> Weights:
        """Return the weights to send (``sent``, or a replacement); may add to ``metrics``."""
        return sent

    def state(self) -> tuple[Weights, dict[str, object]]:
        """Return the tensors and values this hook keeps across a restart."""
        return {}, {}

    def load(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, object]) -> None:
        """Restore what :meth:`state` returned."""


class ProximalHook(RoundHook):
    """FedProx: add ``mu/2 * ||w - w_global||^2`` over the exchanged parameters to the loss.

    The term and its gradient are zero at a round's first local step (the weights are
    the received ones), so a site that takes one step per round (its training split fits
    in one batch and it trains one local epoch) trains exactly as under FedAvg. The hook
    says so at the end of the first such round, once per strategy, site and ``mu`` in a
    process (a benchmark runs the same site many times): on small real sites FedProx and
    FedAvg then give the same numbers to the last digit. A strategy with another term
    that acts from the first step (a dynamic regulariser using this hook for its
    quadratic part) turns the warning off with ``tell_one_step``.
    """

    def __init__(self, strategy: Strategy, tell_one_step: bool = True) -> None:
        self.strategy = strategy
        #: whether a one-step round is worth a warning (False where another term acts)
        self.tell_one_step = tell_one_step
        self.anchor: Weights = {}
        self.steps = 0

    def begin(self, site: HookedSite, rnd: int, server: Mapping[str, torch.Tensor]) -> None:
        """Hold the received values of the exchanged keys."""
        self.anchor = {k: v.detach().clone() for k, v in site.model.state_dict().items()
                       if k in site.exchanged}
        self.steps = 0

    def penalty(self, model: nn.Module) -> torch.Tensor | None:
        """Return the strategy's proximal term around the received weights."""
        self.steps += 1
        return self.strategy.proximal_term(model, self.anchor)

    def end(self, site: HookedSite, rnd: int, sent: Weights,
            metrics: dict[str, float]) -> Weights:
        """Warn (once) when the round had one local step, where the term had no effect."""
        told = (self.strategy.name, site.site, float(self.strategy.mu))
        if (self.steps == 1 and self.anchor and self.tell_one_step
                and told not in _ONE_STEP_TOLD):
            _ONE_STEP_TOLD.add(told)
            logger.warning(
                "Site %s took %d local step in round %d: the proximal term (mu=%g) is "
                "zero at a round's first step, so it had no effect (with one step per "
                "round FedProx trains as FedAvg does). More local epochs, or a batch "
                "smaller than the site's training split, give the term steps to act on.",
                site.site, self.steps, rnd,
                self.strategy.mu)
        return sent


class Releases:
    """A site's DP releases, as Opacus's accountant history: ``(noise, sample_rate, n)``.

    Site state: it survives a restart in the site's state file (``dp_history``), whether
    or not this run adds noise, so that the epsilon a site spent is never counted from zero.
    """

    def __init__(self) -> None:
        self.history: list[tuple[float, float, int]] = []

    @property
    def count(self) -> int:
        """Return the number of releases."""
        return sum(n for _, _, n in self.history)

    def record(self, noise: float) -> None:
        """Count one release of noise multiplier ``noise`` (sampling rate 1)."""
        last = self.history[-1] if self.history else None
        if last is not None and last[0] == noise:
            self.history[-1] = (last[0], last[1], last[2] + 1)
        else:
            self.history.append((noise, 1.0, 1))

    def spent(self, delta: float) -> float:
        """Return the epsilon of every release at ``delta``."""
        from fedbn_med.fl.privacy import epsilon

        return epsilon(0.0, 0, delta, self.history)

    def to_list(self) -> list[list[float]]:
        """Return the history as lists (for a state file's metadata)."""
        return [list(h) for h in self.history]

    def load(self, history: object) -> None:
        """Restore a history written by :meth:`to_list` (None: no release yet)."""
        rows = cast("list[list[float]]", history or [])
        self.history = [(float(s), float(q), int(n)) for s, q, n in rows]


class DPHook(RoundHook):
    """Client-level DP: clip and noise the update a site sends; count the release.

    Parameters
    ----------
    privacy : UpdatePrivacy
        The site's clip norm, noise multiplier and delta.
    releases : Releases
        The site's release history, which this hook extends once per round.
    """

    def __init__(self, privacy: UpdatePrivacy, releases: Releases) -> None:
        self.privacy = privacy
        self.releases = releases
        self._start: Weights = {}
        self._variances: frozenset[str] | None = None

    def begin(self, site: HookedSite, rnd: int, server: Mapping[str, torch.Tensor]) -> None:
        """Hold the received weights: the reference of the update."""
        self._start = site.shared_weights()
        if self._variances is None:  # the model's BN variances, found by type, once
            from fedbn_med.fl.partition import bn_variance_keys

            self._variances = bn_variance_keys(site.model)

    def end(self, site: HookedSite, rnd: int, sent: Weights,
            metrics: dict[str, float]) -> Weights:
        """Return the privatised weights; report the epsilon spent so far."""
        from fedbn_med.fl.dp_terms import noise_generator, replace_one_epsilon

        privacy = self.privacy
        sent = privacy.privatize(sent, self._start,
                                 noise_generator(privacy, site.seed, site.site, rnd),
                                 nonnegative=self._variances or ())
        self.releases.record(privacy.noise)
        metrics.update(dp_epsilon=self.releases.spent(privacy.delta), dp_delta=privacy.delta,
                       dp_noise=privacy.noise, dp_clip=privacy.clip,
                       dp_epsilon_replace_one=replace_one_epsilon(self.releases.history,
                                                                  privacy.delta),
                       dp_seeded=float(privacy.seeded))
        return sent
