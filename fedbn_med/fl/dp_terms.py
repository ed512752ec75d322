"""What a DP epsilon means, stated honestly: the replace-one figure, a warning, seeded noise.

- :func:`replace_one_epsilon`: the accountant of :mod:`fedbn_med.fl.accountant` bounds
  add/remove adjacency (whether one site's contribution, or one patient's, is in an
  update). Replacing one patient by another moves a clipped update by up to ``2 C``
  rather than ``C``, so each release is a Gaussian mechanism of half the noise
  multiplier; its epsilon is computed by the same accountant, not scaled by a factor.
- :func:`warn_if_large`: an epsilon above :data:`EPSILON_WARNING` (10) protects little;
  a run whose add/remove or replace-one epsilon exceeds it says so.
- :func:`noise_generator`: a seeded noise mode for experiments (the same run gives the
  same noisy updates), labelled not private: whoever knows the run's seed can
  regenerate the noise and subtract it.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedbn_med.fl.accountant import epsilon
from fedbn_med.numerics.seeds import derive_seed

if TYPE_CHECKING:
    import torch

    from fedbn_med.fl.privacy import UpdatePrivacy

__all__ = ["EPSILON_WARNING", "NOT_PRIVATE", "LargeEpsilonWarning", "noise_generator",
           "replace_one_epsilon", "replace_one_history", "warn_if_large"]

logger = logging.getLogger(__name__)

#: Above this epsilon a run is warned about: the guarantee is then weak.
EPSILON_WARNING = 10.0
#: How a run with seeded noise is labelled wherever its epsilon is shown.
NOT_PRIVATE = "NOT PRIVATE: seeded noise, for experiments"


_WARNED: set[str] = set()


class LargeEpsilonWarning(UserWarning):
    """A run's epsilon exceeds :data:`EPSILON_WARNING`, or its noise is seeded."""


def replace_one_history(history: Sequence[tuple[float, float, int]]
                        ) -> list[tuple[float, float, int]]:
    """Return the accountant history under replace-one adjacency (half the noise multiplier)."""
    return [(float(s) / 2.0, float(q), int(n)) for s, q, n in history]


def replace_one_epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """Return the epsilon of ``history`` when one patient may be replaced by another.

    Parameters
    ----------
    history : sequence of (noise multiplier, sample rate, releases)
        The site's releases, as :func:`fedbn_med.fl.accountant.epsilon` takes them.
    delta : float
        Target delta.

    Returns
    -------
    float
        The RDP accountant's epsilon with every noise multiplier halved (sensitivity
        ``2 C``): larger than the add/remove epsilon, by a factor that depends on the
        noise and the rounds (about 2 to 3 in the settings we run).
    """
    return epsilon(0.0, 0, delta, replace_one_history(history))


def warn_if_large(eps: float, who: str, *, replace_one: float | None = None,
                  seeded: bool = False) -> bool:
    """Warn (``LargeEpsilonWarning`` and the log) when an epsilon exceeds 10 or noise is seeded.

    ``eps`` is the add/remove epsilon; ``replace_one`` the replace-one-patient one, larger
    (about 2 to 3 times): either above 10 warns, and the warning states both.

    Returns whether a warning was given.
    """
    messages = []
    if seeded:
        messages.append(f"{who} adds seeded noise: {NOT_PRIVATE}; its epsilon is not a "
                        "guarantee (the noise can be regenerated from the run's seed).")
    large = [v for v in (eps, replace_one)
             if v is not None and math.isfinite(v) and v > EPSILON_WARNING]
    if large:
        extra = (f", replace-one-patient epsilon {replace_one:.3g}"
                 if replace_one is not None else "")
        messages.append(f"{who} spends add/remove epsilon = {eps:.3g}{extra}: above "
                        f"{EPSILON_WARNING:g}, a weak guarantee. Raise --dp-noise or lower "
                        "--rounds for a meaningful one.")
    for message in messages:
        if message in _WARNED:  # a spec is checked at every copy: say it once
            continue
        _WARNED.add(message)
        logger.warning("%s", message)
        warnings.warn(message, LargeEpsilonWarning, stacklevel=2)
    return bool(messages)


def noise_generator(privacy: UpdatePrivacy, seed: int, site: str, rnd: int
                    ) -> torch.Generator | None:
    """Return the seeded generator of a round's noise, or None for private (OS) noise."""
    if not getattr(privacy, "seeded", False):
        return None
    import torch

    return torch.Generator().manual_seed(derive_seed(seed, site, rnd, "dp-noise"))
