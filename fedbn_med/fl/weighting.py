"""How much each accepted reply weighs in a round's average (no torch: the spec reads it).

A site's weight is its number of training examples (``"samples"``, FedAvg's rule) or one
(``"equal"``, the FedBN paper's code); with ``max_share``, a count, which is the site's
own claim, is cut so that no site weighs more than that share of the average
(:func:`capped_weights`). With counts registered with the sites' keys (the consortium's
``counts.json``), a site weighs at most its registered count, and the cap is measured
against the other sites' registered counts, never their claims: colluders who all claim
10^9 weigh together at most their registered share.
:func:`fedbn_med.fl.rounds.close_round` applies it.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["WEIGHTINGS", "capped_weights", "check_weighting", "site_weights"]

#: How close_round may weigh the accepted updates (``RunSpec.weighting``).
WEIGHTINGS = ("samples", "equal")


def _check_share(max_share: float) -> None:
    if not 0 < max_share < 1:
        raise ValueError(f"max_share must be a share between 0 and 1 (exclusive), got "
                         f"{max_share!r}.")


def check_weighting(weighting: str, max_share: float | None = None) -> None:
    """Raise ``ValueError`` for an unknown ``weighting`` or a ``max_share`` outside (0, 1)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got "
                         f"{weighting!r}.")
    if max_share is not None:
        _check_share(max_share)


def capped_weights(counts: Mapping[str, int], max_share: float,
                   registered: Mapping[str, int] | None = None) -> dict[str, int]:
    """Return each site's weight: its count, but never over ``max_share`` of the average.

    A count is a site's own claim, which the server cannot check. Each site's weight is
    cut to ``max_share / (1 - max_share)`` times the sum of the other sites' counts, so
    that one site, whatever it claims, weighs at most ``max_share`` of the average
    (``0.5``: never more than all the others together). A single site is not capped.

    With ``registered`` counts, a registered site's count is first cut to its registered
    one, and the others' sum is of those cut counts: what a colluder claims raises no one.

    Raises
    ------
    ValueError
        When ``max_share`` is not in (0, 1).
    """
    _check_share(max_share)
    if registered:
        counts = {s: min(n, registered[s]) if s in registered else n
                  for s, n in counts.items()}
    total = sum(counts.values())
    if len(counts) < 2:
        return dict(counts)
    ratio = max_share / (1 - max_share)
    return {site: max(1, min(n, int(ratio * (total - n)))) for site, n in counts.items()}


def site_weights(counts: Mapping[str, int], weighting: str = "samples",
                 max_share: float | None = None,
                 registered: Mapping[str, int] | None = None) -> dict[str, int]:
    """Return the weight of each accepted site, from its training-example count.

    Parameters
    ----------
    counts : mapping of str to int
        Each accepted site's (checked) number of training examples.
    weighting : str
        ``"samples"``: the counts, capped by ``max_share`` when given; ``"equal"``: 1 each.
    max_share : float, optional
        With ``"samples"``, the largest share one site may have (:func:`capped_weights`).
    registered : mapping of str to int, optional
        Counts registered with the sites' keys: no site weighs more than its own.
    """
    check_weighting(weighting, max_share)
    if weighting == "equal":
        return dict.fromkeys(counts, 1)
    weights = dict(counts)
    if registered:
        weights = {s: min(n, registered[s]) if s in registered else n
                   for s, n in weights.items()}
    return weights if max_share is None else capped_weights(weights, max_share, registered)
