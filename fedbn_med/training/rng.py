"""Where a site's random draws come from in its local round: its own generator.

A site's round draws dropout masks from a seed derived from the run's seed, the site and
the round. torch's dropout draws from one generator for the whole process, so sites that
trained at once in one process would take each other's draws. When dropout is a model's
only randomness (:func:`dropout_only`), each of its dropout layers draws instead from a
generator of the site's own, seeded alike: the same masks, bit for bit, as the process's
generator gives after ``torch.manual_seed(seed)``, and sites can train at once
(:func:`fedbn_med.training.inprocess.run_in_process`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["dropout_only", "seed_round"]

#: Layers that draw nothing at random, or (dropout) only what :func:`seed_round` redirects.
_DRAWLESS = (nn.Linear, _BatchNorm, nn.ReLU, nn.Identity, nn.Flatten)


def dropout_only(model: nn.Module) -> bool:
    """Return whether plain dropout is all that ``model`` draws at random.

    True when every leaf layer is a linear, batch-norm, ReLU, identity or flatten layer, or
    an ``nn.Dropout`` (the ABIDE networks); a model with any other layer is not known to
    draw nothing else, and keeps the process's generator.
    """
    return all(type(m) is nn.Dropout or isinstance(m, _DRAWLESS)
               for m in model.modules() if next(m.children(), None) is None)


def seed_round(model: nn.Module, seed: int) -> None:
    """Seed the random draws of ``model``'s local round.

    Seeds the process's generator (``torch.manual_seed``), and when :func:`dropout_only`,
    gives each dropout layer a generator of its own seeded with ``seed``, which it draws
    its masks from until the next call.
    """
    torch.manual_seed(seed)
    if not dropout_only(model):
        return
    generator = torch.Generator().manual_seed(seed)
    for layer in model.modules():
        if type(layer) is nn.Dropout:
            layer.forward = _SeededDropout(layer, generator)  # type: ignore[method-assign,assignment]


class _SeededDropout:
    """``nn.Dropout.forward`` drawing from a given generator.

    torch computes CPU dropout as ``x * bernoulli(1 - p) / (1 - p)``, drawn from the
    process's generator; this is the same computation on another one (same masks, same
    gradients). The mask is drawn as ``rand(float64) < 1 - p``: torch's CPU ``bernoulli_``
    with a scalar draws exactly that, one double per element in order, and leaves the
    generator in the same state (``tests/test_rng.py``), but takes about twice as long
    (2.0-2.5 vs 1.1-1.4 ms for a batch of 32 ABIDE connectivity vectors, the linear
    model's input dropout: the larger part of its step).
    """

    def __init__(self, layer: nn.Dropout, generator: torch.Generator) -> None:
        self.layer = layer
        self.generator = generator

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        p, layer = self.layer.p, self.layer
        if not layer.training or p == 0 or x.numel() == 0 or x.device.type != "cpu":
            return nn.functional.dropout(x, p, layer.training, layer.inplace)
        if p == 1:
            return x.mul_(0.0) if layer.inplace else x * torch.zeros((), dtype=x.dtype)
        if x.is_contiguous():  # draws in x's element order, as bernoulli_ does
            noise = torch.rand(x.shape, generator=self.generator, dtype=torch.float64
                               ).lt_(1 - p).to(x.dtype)
        else:
            noise = torch.empty_like(x).bernoulli_(1 - p, generator=self.generator)
        noise.div_(1 - p)
        return x.mul_(noise) if layer.inplace else x * noise
