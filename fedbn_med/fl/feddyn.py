"""FedDyn: a strategy whose site hook carries state from round to round.

FedDyn (Acar et al., ICLR 2021) adds a dynamic regulariser to each site's local loss,

    L_i(w) - <g_i, w> + alpha/2 * ||w - w_global||^2,

where ``g_i`` is the site's estimate of its own loss gradient at its last local model
(zero at first). After the round the site updates it with

    g_i <- g_i - alpha * (w_i - w_global),

so that the sites' local optima agree with the global one at the fixed point. The
quadratic part is FedProx's proximal term with ``mu = alpha`` (:class:`ProximalHook`); the
linear part and ``g_i`` are :class:`DynamicHook`.

The paper's server also keeps ``h``, the mean of the sites' changes of ``g_i``, and
subtracts ``h / alpha`` from the average. With every site in every round and ``h``
starting at zero, ``h`` is exactly the (same-weighted) mean of the sites' ``g_i``, so each
site sends ``w_i - g_i / alpha`` and the plain average is the paper's server step: the
server stays FedAvg's. A round in which a site's reply is refused breaks that identity for
the round. ``g_i`` is site state: it survives a restart with the site's kept layers.

This module and one entry in :data:`fedbn_med.fl.registry.STRATEGIES` are the whole
strategy: no engine, server or trainer knows its name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, cast

from fedbn_med.fl.hooks import HookedSite, ProximalHook, RoundHook
from fedbn_med.fl.strategies import FedAvg

if TYPE_CHECKING:  # the registry imports this module: the run spec stays free of torch
    import torch
    from torch import nn

    from fedbn_med.fl.hooks import Releases
    from fedbn_med.fl.privacy import UpdatePrivacy

__all__ = ["STATE_PREFIX", "DynamicHook", "FedDyn"]

Weights = dict[str, "torch.Tensor"]

#: Prefix of the site's gradient estimate in its saved state (``feddyn/<key>``).
STATE_PREFIX = "feddyn/"


class DynamicHook(RoundHook):
    """FedDyn's linear term and the site's gradient estimate ``g_i``.

    Parameters
    ----------
    template : mapping of str to tensor
        The model's state (shapes of ``keys``).
    keys : iterable of str
        The exchanged trainable parameters (buffers have no gradient).
    alpha : float
        The regulariser's weight.
    """

    def __init__(self, template: Mapping[str, torch.Tensor], keys: Iterable[str],
                 alpha: float) -> None:
        import torch

        self.alpha = float(alpha)
        self.grad: Weights = {k: torch.zeros(template[k].shape, dtype=torch.float32)
                              for k in sorted(keys)}
        self._start: Weights = {}
        self._terms: list[tuple[nn.Parameter, torch.Tensor]] = []

    def begin(self, site: HookedSite, rnd: int, server: Mapping[str, torch.Tensor]) -> None:
        """Hold the received weights; pair each parameter with its ``g_i``."""
        import torch

        received = site.shared_weights()
        self._start = {k: received[k] for k in self.grad}
        params = dict(site.model.named_parameters())
        self._terms = [(params[k], g.to(site.device)) for k, g in self.grad.items()
                       if bool(torch.any(g != 0))]

    def penalty(self, model: nn.Module) -> torch.Tensor | None:
        """Return ``-<g_i, w>`` (None while ``g_i`` is zero)."""
        import torch

        total: torch.Tensor | None = None
        for param, g in self._terms:
            term = -torch.sum(param * g)
            total = term if total is None else total + term
        return total

    def end(self, site: HookedSite, rnd: int, sent: Weights,
            metrics: dict[str, float]) -> Weights:
        """Update ``g_i`` from the trained weights; return ``w_i - g_i / alpha`` to send."""
        import torch

        out = dict(sent)
        with torch.no_grad():
            for key, g in self.grad.items():
                trained = sent[key].to(torch.float32)
                g = g - self.alpha * (trained - self._start[key].to(torch.float32))
                self.grad[key] = g
                out[key] = (trained - g / self.alpha).to(sent[key].dtype)
        return out

    def state(self) -> tuple[Weights, dict[str, object]]:
        """Return ``g_i`` as ``feddyn/<key>`` tensors."""
        return {STATE_PREFIX + k: v.clone() for k, v in self.grad.items()}, {}

    def load(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, object]) -> None:
        """Restore a saved ``g_i``; its keys, shapes and values are checked first."""
        import torch

        saved = {k[len(STATE_PREFIX):]: v for k, v in tensors.items()
                 if k.startswith(STATE_PREFIX)}
        if not saved:
            return
        if set(saved) != set(self.grad):
            raise ValueError(f"A saved FedDyn state holds keys {sorted(saved)[:5]}, "
                             f"expected {sorted(self.grad)[:5]}.")
        for key, value in saved.items():
            if tuple(value.shape) != tuple(self.grad[key].shape):
                raise ValueError(f"A saved FedDyn state '{key}' has shape "
                                 f"{tuple(value.shape)}, expected {tuple(self.grad[key].shape)}.")
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"A saved FedDyn state '{key}' holds NaN or infinity.")
        self.grad = {k: v.detach().to("cpu", torch.float32).clone() for k, v in saved.items()}


@dataclass(frozen=True)
class FedDyn(FedAvg):
    """FedAvg with FedDyn's dynamic regulariser at each site (``mu`` is FedDyn's alpha)."""

    name: ClassVar[str] = "feddyn"
    mu: float = 1e-2

    def __post_init__(self) -> None:
        if not (self.mu > 0.0 and math.isfinite(self.mu)):
            raise ValueError(f"FedDyn's alpha (mu) must be a positive number, got {self.mu}.")

    @property
    def label(self) -> str:
        """Return ``feddyn`` (its alpha is the run's ``mu``)."""
        return self.name

    def site_hooks(self, site: HookedSite, privacy: UpdatePrivacy | None = None,
                   releases: Releases | None = None) -> list[RoundHook]:
        """Return the proximal hook, then :class:`DynamicHook`, then DP's (what is released).

        The hook corrects the weights before DP clips and noises them, so the release is
        of the corrected weights and ``g_i`` never leaves the site.
        """
        hooks = super().site_hooks(site, privacy, releases)
        parameters = frozenset(name for name, _ in site.model.named_parameters())
        keys = site.exchanged & parameters
        at = next((i + 1 for i, h in enumerate(hooks) if isinstance(h, ProximalHook)), 0)
        if at:  # the linear term acts from the first step: one step is not FedAvg here
            cast(ProximalHook, hooks[at - 1]).tell_one_step = False
        hooks.insert(at, DynamicHook(site.model.state_dict(), keys, self.mu))
        return hooks
