"""The privacy accountant: the epsilon of a site's Gaussian releases, and its inverse.

Opacus's RDP accountant (:class:`opacus.accountants.RDPAccountant`) composes one Gaussian
mechanism of noise multiplier ``sigma`` per round, with sampling rate 1 (every site
releases an update in every round it takes part in). The mechanism itself (clip, noise,
the site's settings and ledger) is :mod:`fedbn_med.fl.privacy`; what an epsilon means
under replace-one adjacency is :mod:`fedbn_med.fl.dp_terms`. Both build on this module,
which imports neither.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["MAX_NOISE", "SAMPLE_RATE", "check_delta", "epsilon", "noise_for_epsilon"]

#: Every site releases one update per round it takes part in: no subsampling.
SAMPLE_RATE = 1.0
#: The largest noise multiplier accepted; beyond it the RDP accountant overflows, and
#: epsilon stops falling long before (1e3 already gives the floor set by delta).
MAX_NOISE = 1e6


def check_delta(delta: float) -> None:
    """Raise ``ValueError`` unless ``delta`` is in (0, 1), where an epsilon is defined."""
    if not 0.0 < delta < 1.0:
        raise ValueError(
            f"epsilon is undefined for dp_delta = {delta!r}: delta must be in (0, 1), "
            "typically below 1 / (number of patients), such as 1e-5.")


def epsilon(noise: float, releases: int, delta: float,
            history: Sequence[tuple[float, float, int]] = ()) -> float:
    """Return the epsilon of ``releases`` Gaussian releases of noise multiplier ``noise``.

    Parameters
    ----------
    noise : float
        Noise multiplier sigma (noise std / clip norm).
    releases : int
        Rounds in which the site released an update with this ``noise``.
    delta : float
        Target delta, in (0, 1).
    history : sequence of (noise, sample_rate, releases)
        Earlier releases with other settings (Opacus's accountant history).

    Returns
    -------
    float
        Epsilon from Opacus's RDP accountant; ``inf`` when ``noise`` is 0 and
        ``releases`` > 0; 0 when nothing was released.
    """
    from opacus.accountants import RDPAccountant

    check_delta(delta)
    steps = [*history, *([(float(noise), SAMPLE_RATE, int(releases))] if releases else [])]
    if not steps:
        return 0.0
    if any(s == 0 for s, _, n in steps if n):
        return math.inf
    accountant = RDPAccountant()
    accountant.history = [(float(s), float(q), int(n)) for s, q, n in steps if n]
    return float(accountant.get_epsilon(delta=delta))


def noise_for_epsilon(target: float, delta: float, releases: int) -> float:
    """Return the noise multiplier that spends ``target`` epsilon over ``releases`` rounds."""
    from opacus.accountants.utils import get_noise_multiplier

    check_delta(delta)
    if not (target > 0 and math.isfinite(target)):
        raise ValueError(f"A target epsilon must be a positive finite number, got {target!r}.")
    return float(get_noise_multiplier(target_epsilon=target, target_delta=delta,
                                      sample_rate=SAMPLE_RATE, steps=int(releases),
                                      epsilon_tolerance=0.005))
