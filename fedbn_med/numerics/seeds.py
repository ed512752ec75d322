"""Seeds derived from a run's base seed and labels: one number per (site, round, purpose).

Every random draw of a run (a site's shuffling and dropout, its split, seeded DP noise,
a synthetic cohort) takes its seed from :func:`derive_seed`, so the same run gives the
same numbers in any process and in any order of the sites. Pure Python: the federated
core (:mod:`fedbn_med.fl`) and the trainer both import it.
"""

from __future__ import annotations

import zlib

__all__ = ["derive_seed"]


def derive_seed(seed: int, *parts: object) -> int:
    """Derive a reproducible 31-bit seed from a base seed and labels (site, round)."""
    text = ":".join([str(int(seed)), *map(str, parts)])
    return zlib.crc32(text.encode()) & 0x7FFFFFFF
