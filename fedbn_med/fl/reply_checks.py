"""The checks a site's reply must pass before its update is averaged.

:func:`fedbn_med.fl.rounds.close_round` leaves out a reply whose example count is not a
whole number in range (:func:`num_examples_reason`), whose weights are unsound
(:func:`check_reply`: a private key, keys, dtypes or shapes that differ from the model's,
NaN or Inf), or whose update norm (:func:`update_norm`) is far above the other sites'
and the run's history (:func:`outlier_reason`). Each check returns the reason a server
logs and reports, or None.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch

__all__ = [
    "HISTORY_SHARE",
    "MAX_EXAMPLES",
    "OUTLIER_FACTOR",
    "check_reply",
    "lower_median",
    "num_examples_reason",
    "outlier_reason",
    "update_norm",
]

#: An update whose norm is over this many times the other sites' median is left out.
OUTLIER_FACTOR = 50.0

#: The outlier rule's reference never falls below this share of the largest median
#: accepted norm of any earlier round: as training converges and the other sites'
#: updates shrink, an honest site whose update shrinks more slowly is not left out.
HISTORY_SHARE = 0.2

#: More training examples than any site holds; a larger count is refused.
MAX_EXAMPLES = 10**9


def check_reply(
    weights: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
    private_keys: Iterable[str] = (),
) -> str | None:
    """Return why an update must be left out of the average, or None when it is sound.

    Every key is checked, whatever its dtype: the dtype and shape must be the global
    tensor's, and a floating-point tensor must hold no NaN or Inf (an integer one cannot).

    Parameters
    ----------
    weights : mapping of str to tensor
        What the site sent.
    expected : mapping of str to tensor
        The exchanged keys with the model's dtypes and shapes (the global weights).
    private_keys : iterable of str
        Keys that must never leave a site under this strategy.
    """
    leaked = sorted(set(weights) & set(private_keys))
    if leaked:
        return f"it carries site-private keys {leaked[:3]} (refused, never stored)"
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        return f"its keys differ from the model's (missing {missing[:3]}, unexpected {extra[:3]})"
    for key, tensor in weights.items():
        if not isinstance(tensor, torch.Tensor):
            return f"'{key}' is a {type(tensor).__name__}, expected a tensor"
        want = expected[key]
        if tensor.dtype != want.dtype:
            return f"'{key}' is {tensor.dtype}, expected {want.dtype} (the global's dtype)"
        if tuple(tensor.shape) != tuple(want.shape):
            return (f"'{key}' has shape {tuple(tensor.shape)}, expected "
                    f"{tuple(want.shape)}")
        if tensor.dtype.is_floating_point and not torch.isfinite(tensor).all():
            return f"'{key}' holds NaN or Inf"
    return None


def num_examples_reason(value: object) -> str | None:
    """Return why a reported number of training examples is refused, or None.

    It weights the site's update in the average, so it must be a whole number from 1 to
    :data:`MAX_EXAMPLES` (a server that cannot check the claim also caps the weight it
    gives: ``max_share`` of :func:`fedbn_med.fl.rounds.close_round`).
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"it reports num-examples {value!r} (expected a number of training examples)"
    if not math.isfinite(value) or value != int(value) or not 1 <= value <= MAX_EXAMPLES:
        return (f"it reports num-examples {value!r} ({value!r} training examples; expected a "
                f"whole number from 1 to {MAX_EXAMPLES})")
    return None


def update_norm(weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
                ) -> float:
    """Return the L2 norm of ``weights - reference`` over every key, in float64.

    Integer tensors count too (a counter such as ``num_batches_tracked`` under FedAvg),
    so that no tensor escapes the outlier rule by its dtype.
    """
    total = 0.0
    for key, tensor in weights.items():
        diff = tensor.detach().double() - reference[key].detach().double()
        total += float(torch.sum(diff * diff))
    return math.sqrt(total)


def lower_median(values: Sequence[float]) -> float:
    """Return the lower median: with two values the smaller, so one site never raises it."""
    return sorted(values)[(len(values) - 1) // 2]


def outlier_reason(norm: float, others: Sequence[float], factor: float = OUTLIER_FACTOR,
                   floor: float = 0.0) -> str | None:
    """Return why an update norm is an outlier, or None.

    The reference is the other sites' (lower) median norm, but never below ``floor``
    (:data:`HISTORY_SHARE` of the run's largest median accepted norm, from
    :attr:`fedbn_med.fl.rounds.RoundOutcome.norm_reference`); an update over ``factor``
    times it is an outlier. Without the floor, late in training, when the other sites'
    updates have shrunk to almost nothing, an honest site whose update shrinks more
    slowly would be left out round after round.
    """
    if not others:
        return None
    median = lower_median(others)
    ref = max(median, floor)
    if ref > 0 and norm > factor * ref:
        if ref > median:
            return (f"its update norm {norm:.3g} is over {factor:g}x {ref:.3g} (the floor "
                    f"from earlier rounds; the others' median is {median:.3g})")
        return f"its update norm {norm:.3g} is over {factor:g}x the others' median {ref:.3g}"
    return None

