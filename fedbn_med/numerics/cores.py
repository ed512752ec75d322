"""How many cores fedbn-med's own parallel work may use: sites at once, cells at once.

An in-process run trains and scores its sites on threads, one per core, where that gives
the same numbers as one site after the other; a comparison runs its (fold, seed) cells in
one process per core; a Flower run on this host gives each site its share of the cores
for its libraries' threads. All take the cores this process may run on, capped by
``FEDBN_MED_CORES`` when it is set: for a machine shared with other work, or test
processes side by side, whose sites and cells then take turns instead of contending for
the same cores. Torch's own threads per site are a run setting (``RunSpec.threads``).
"""

from __future__ import annotations

import os

__all__ = ["CORES_ENV_VAR", "usable_cores"]

#: Caps the cores of the three above: an in-process run's sites, a comparison's cells, a
#: local Flower run's sites (default: every core this process may run on).
CORES_ENV_VAR = "FEDBN_MED_CORES"


def usable_cores() -> int:
    """Return the cores this process may run on, capped by ``FEDBN_MED_CORES`` if set.

    Raises
    ------
    ValueError
        If ``FEDBN_MED_CORES`` is set to anything but a positive integer.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    text = os.environ.get(CORES_ENV_VAR, "").strip()
    if not text:
        return cores
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{CORES_ENV_VAR}={text!r}: expected a positive whole number of "
                         "cores (or leave it unset to use every core).")
    return min(cores, int(text))
