"""What a site checks of a model the server sends before it computes anything on it.

A site's private layers leak through whatever it computes on weights the server chose,
so a site refuses, before training or scoring, a global model that no honest server
sends (:func:`hostile_model_reason`):

- a non-finite value (NaN or Inf), which training would carry into the site's private
  state;
- a value beyond the site's bound (``max_weight_abs`` in its site file);
- a weight matrix or kernel (two or more dimensions) that is all zero or constant: such
  a layer passes its input's mean alone, so that an update or a score computed on it
  reads the next normalisation layer's shift (the single-reply leak of issue 44).
  Vectors (biases) may be constant: MONAI's DenseNet121 starts its biases at zero.

Once a site has trained in a federation (without DP), it also refuses a model that is
not plausibly an aggregate its own update went into (:func:`shift_reason`): each weight
matrix or kernel must lie within ``max_model_shift`` of what the site itself sent last,
relative to the larger of the two norms. An honest aggregate moves from any one site's
update by a round's drift; a crafted probe (a layer zeroed, or set to pass one channel)
moves it by about its whole norm.

And a site never writes, nor sends, non-finite state (:func:`nonfinite_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the site file's reader takes the defaults here without torch
    import torch

__all__ = ["DEFAULT_MAX_MODEL_SHIFT", "DEFAULT_MAX_WEIGHT_ABS", "hostile_model_reason",
           "nonfinite_keys", "shift_reason"]

#: The largest absolute value a site accepts in a global model unless its file says
#: otherwise (trained networks of the shipped tasks hold values below 10).
DEFAULT_MAX_WEIGHT_ABS = 1e3
#: How far a weight matrix may lie from what the site itself sent last, relative to the
#: larger norm of the two, for the site to train from it or score it (a zeroed layer lies
#: at 1.0; its site file: ``max_model_shift``).
DEFAULT_MAX_MODEL_SHIFT = 0.9


def hostile_model_reason(weights: Mapping[str, torch.Tensor],
                         max_abs: float = DEFAULT_MAX_WEIGHT_ABS) -> str | None:
    """Return why a global model is refused before any computation on it, or None.

    Parameters
    ----------
    weights : mapping of str to tensor
        The shared tensors the server sent.
    max_abs : float
        The largest absolute value accepted.

    Examples
    --------
    >>> import torch
    >>> hostile_model_reason({"w": torch.zeros(2, 3)})
    "'w' (shape (2, 3)) is all zero: a layer that passes only its input's mean"
    >>> hostile_model_reason({"b": torch.zeros(3), "w": torch.eye(3)}) is None
    True
    """
    import torch

    for key, tensor in weights.items():
        if not tensor.dtype.is_floating_point:
            continue
        if not bool(torch.isfinite(tensor).all()):
            return f"'{key}' holds NaN or Inf"
        if tensor.numel() == 0:
            continue
        peak = float(tensor.detach().abs().max())
        if peak > max_abs:
            return (f"'{key}' holds a value of magnitude {peak:.3g}, above this site's bound "
                    f"max_weight_abs = {max_abs:g}")
        if tensor.dim() >= 2 and tensor.numel() > 1:
            flat = tensor.detach().reshape(-1)
            if bool((flat == 0).all()):
                return (f"'{key}' (shape {tuple(tensor.shape)}) is all zero: a layer that "
                        "passes only its input's mean")
            if bool((flat == flat[0]).all()):
                return (f"'{key}' (shape {tuple(tensor.shape)}) is constant "
                        f"({float(flat[0]):.3g} everywhere): a layer that passes only its "
                        "input's mean")
    return None


def shift_reason(weights: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor],
                 max_shift: float = DEFAULT_MAX_MODEL_SHIFT) -> str | None:
    """Return why ``weights`` are not plausibly an aggregate of ``own``, or None.

    Parameters
    ----------
    weights : mapping of str to tensor
        The model the server sent.
    own : mapping of str to tensor
        What this site itself sent last in this federation.
    max_shift : float
        The largest ``||weights[k] - own[k]|| / max(||weights[k]||, ||own[k]||)`` accepted
        for a weight matrix or kernel ``k`` (vectors are not compared: their norms are
        small, and an honest round may move them by as much).

    Examples
    --------
    >>> import torch
    >>> own = {"w": torch.ones(2, 2)}
    >>> shift_reason({"w": torch.full((2, 2), 1.1)}, own) is None
    True
    >>> shift_reason({"w": torch.zeros(2, 2)}, own)[:40]
    "'w' lies 1 times its norm from what this"
    """
    for key, mine in own.items():
        theirs = weights.get(key)
        if theirs is None or tuple(theirs.shape) != tuple(mine.shape):
            return f"'{key}' is missing or has another shape than this site's own update"
        if not mine.dtype.is_floating_point or mine.dim() < 2:
            continue
        a, b = mine.detach().double(), theirs.detach().double()
        scale = max(float(a.norm()), float(b.norm()))
        shift = float((b - a).norm())
        if scale > 0 and shift > max_shift * scale:
            return (f"'{key}' lies {shift / scale:.3g} times its norm from what this site "
                    f"sent last (at most {max_shift:g}, max_model_shift): not an aggregate "
                    "of its update")
    return None


def nonfinite_keys(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Return the keys of floating-point tensors that hold NaN or Inf."""
    import torch

    return sorted(k for k, t in tensors.items()
                  if t.dtype.is_floating_point and not bool(torch.isfinite(t).all()))
