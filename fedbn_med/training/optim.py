"""A site's local optimiser: zero the gradients, back-propagate, step.

Two kinds: :class:`PlainSGD`, written out as in the FedBN paper (the first ``torch.optim``
optimiser of a process imports ``torch._dynamo``, which costs seconds at every site
start), and :class:`Adam` (``torch.optim.Adam``), either kept across rounds (the published
federated ABIDE code, Li et al. 2020) or created afresh every round, optionally with a
gradient scaler for mixed precision (the imaging tasks).
"""

from __future__ import annotations

import copy
import math

import torch

__all__ = ["OPTIMISERS", "Adam", "LocalOptimiser", "PlainSGD", "make_optimiser"]

#: The local optimisers a trainer offers by name: plain SGD (the FedBN paper) or Adam (the
#: published federated ABIDE code, Li et al. 2020: lr 1e-5, weight decay 5e-2).
OPTIMISERS = ("sgd", "adam")


class LocalOptimiser:
    """Base of a local optimiser; :meth:`start` is called at the start of every round.

    Parameters
    ----------
    lr : float
        Learning rate.
    weight_decay : float
        L2 penalty added to the gradients.
    """

    def __init__(self, lr: float, weight_decay: float = 0.0) -> None:
        if lr <= 0 or not math.isfinite(lr):
            raise ValueError(f"lr must be a positive number, got {lr}.")
        if not (weight_decay >= 0 and math.isfinite(weight_decay)):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay}.")
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.params: list[torch.nn.Parameter] = []

    def fresh(self) -> LocalOptimiser:
        """Return an optimiser of the same settings that has taken no step."""
        twin = copy.copy(self)
        twin.params = []
        return twin

    def start(self, params: list[torch.nn.Parameter], amp_device: str | None = None) -> None:
        """Take the round's trainable parameters (``amp_device``: scale gradients there)."""
        self.params = params

    def zero_grad(self) -> None:
        """Drop the gradients of the last step."""
        for p in self.params:
            p.grad = None

    def backward(self, loss: torch.Tensor) -> float:
        """Back-propagate ``loss``; return the scale the gradients carry (1 unscaled)."""
        loss.backward()
        return 1.0

    def step(self) -> None:
        """Update the parameters from their gradients."""
        raise NotImplementedError


class PlainSGD(LocalOptimiser):
    """SGD without momentum, written out (no ``torch.optim`` import at site start).

    Raises
    ------
    ValueError
        If ``lr * weight_decay >= 2``: each step multiplies the weights by
        ``1 - lr * weight_decay`` before the gradient, so they would grow without bound.
    """

    def __init__(self, lr: float, weight_decay: float = 0.0) -> None:
        super().__init__(lr, weight_decay)
        if self.lr * self.weight_decay >= 2:
            raise ValueError(
                f"SGD with lr {lr:g} and weight_decay {weight_decay:g} diverges: lr x "
                f"weight_decay = {lr * weight_decay:g} must be below 2 (each step scales "
                "the weights by 1 - lr x weight_decay). Lower one of them.")

    @torch.no_grad()
    def step(self) -> None:
        """Take one step of ``-lr * (grad + weight_decay * w)``."""
        for p in self.params:
            if p.grad is not None:
                if self.weight_decay:
                    p.grad.add_(p, alpha=self.weight_decay)
                p.add_(p.grad, alpha=-self.lr)


class Adam(LocalOptimiser):
    """``torch.optim.Adam``; its moments live at the site (not in the state a restart restores).

    Parameters
    ----------
    lr, weight_decay : float
        As :class:`LocalOptimiser`.
    per_round : bool
        Create the optimiser afresh at every round's start (moments start at zero each
        round) instead of once, at the first step, for the site's whole run.
    """

    def __init__(self, lr: float, weight_decay: float = 0.0, *, per_round: bool = False
                 ) -> None:
        super().__init__(lr, weight_decay)
        self.per_round = per_round
        self.torch_optimiser: torch.optim.Adam | None = None
        self._scaler: torch.amp.GradScaler | None = None

    def fresh(self) -> Adam:
        """Return an Adam of the same settings with no moments."""
        return Adam(self.lr, self.weight_decay, per_round=self.per_round)

    def start(self, params: list[torch.nn.Parameter], amp_device: str | None = None) -> None:
        """Take the round's parameters; a per-round Adam (and its scaler) starts here."""
        super().start(params, amp_device)
        if self.per_round:
            self.torch_optimiser = self._new()
            self._scaler = (torch.amp.GradScaler(amp_device) if amp_device is not None
                            else None)

    def _new(self) -> torch.optim.Adam:
        return torch.optim.Adam(self.params, lr=self.lr, weight_decay=self.weight_decay)

    def backward(self, loss: torch.Tensor) -> float:
        """Back-propagate, through the gradient scaler under mixed precision."""
        if self._scaler is None:
            loss.backward()
            return 1.0
        self._scaler.scale(loss).backward()
        return float(self._scaler.get_scale())

    def step(self) -> None:
        """Take one Adam step (through the scaler under mixed precision)."""
        if self.torch_optimiser is None:
            self.torch_optimiser = self._new()
        if self._scaler is None:
            self.torch_optimiser.step()
            return
        self._scaler.step(self.torch_optimiser)
        self._scaler.update()


def make_optimiser(name: str, lr: float, weight_decay: float = 0.0) -> LocalOptimiser:
    """Return the optimiser named ``name`` (one of :data:`OPTIMISERS`)."""
    if name not in OPTIMISERS:
        raise ValueError(f"optimiser must be one of {', '.join(OPTIMISERS)}, got {name!r}.")
    if name == "adam":
        return Adam(lr, weight_decay)
    return PlainSGD(lr, weight_decay)
