"""Pairing runs by their cell: the same (axis value, fold, repetition) on both sides.

Two methods of a comparison are paired when they ran on the same subjects: the same test
fold of the same repetition's split (and, in a sweep, the same value of the swept
setting). Their scores are therefore kept keyed by that cell, never in lists whose
positions happen to line up: :func:`paired_differences` subtracts key by key, so scores
collected in different orders still pair correctly, and a cell one side lacks is an
error instead of a silent mis-pairing.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

__all__ = ["paired_differences"]

K = TypeVar("K", bound=Hashable)


def paired_differences(a: Mapping[K, float], b: Mapping[K, float], *,
                       require_same: bool = True) -> dict[K, float]:
    """Return ``a[k] - b[k]`` for every cell key ``k``, in the order of ``a``.

    Parameters
    ----------
    a, b : mapping of cell key to float
        One score per cell, keyed by what makes the cell (e.g. ``(fold, seed)``).
    require_same : bool, default=True
        Raise when the two sides do not hold the same cells; ``False`` pairs the cells
        both hold and leaves the others out.

    Raises
    ------
    ValueError
        If ``require_same`` and a cell is on one side only.
    """
    if require_same and a.keys() != b.keys():
        only_a = [k for k in a if k not in b]
        only_b = [k for k in b if k not in a]
        raise ValueError(
            f"Paired scores must cover the same cells; only in the first: "
            f"{only_a or 'none'}, only in the second: {only_b or 'none'}.")
    return {k: a[k] - b[k] for k in a if k in b}
