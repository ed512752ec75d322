"""What the built-in cohort's features show: per-site gain and offset, the true pattern.

Used by ``benchmarks/research/cohort_check.py`` to print the cohort's figures and by the tests
that hold the cohort to them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedbn_med.tasks.abide.cohort.signal import _build_template
from fedbn_med.tasks.abide.cohort.signal_v3 import build_template_v3
from fedbn_med.tasks.abide.data.atlas import HO_LABELS
from fedbn_med.tasks.abide.settings import COHORT_VERSION

__all__ = ["dx_pattern", "site_lines"]


def dx_pattern(seed: int, roi_labels: Sequence[object], version: str = COHORT_VERSION
               ) -> np.ndarray:
    """Return the generator's true diagnosis shift on the loader's edges.

    Parameters
    ----------
    seed : int
        The cohort's seed.
    roi_labels : sequence
        The ROI labels the features were computed on (``SiteFeatures.roi_labels``, with
        or without the ``#`` of the ``.1D`` header), in feature order.
    version : str, default=COHORT_VERSION
        The cohort's generator version.

    Returns
    -------
    numpy.ndarray
        One value per feature (upper triangle, row by row, as the loader vectorises).
    """
    shift = (build_template_v3(seed) if version == "3" else _build_template(seed)).dx_shift
    keep = [HO_LABELS.index(int(str(label).lstrip("#"))) for label in roi_labels]
    sub = shift[np.ix_(keep, keep)]
    return sub[np.triu_indices(len(keep), k=1)]


def site_lines(features: Mapping[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Return each site's (gain, offset): its mean features regressed on the pooled mean.

    A site that looks like the pool has gain 1 and offset 0; a gain that differs between
    sites is a multiplicative shift of the kind per-site BN can undo.
    """
    pooled = np.concatenate(list(features.values())).mean(axis=0)
    design = np.column_stack([pooled, np.ones_like(pooled)])
    out = {}
    for name, x in features.items():
        gain, offset = np.linalg.lstsq(design, np.asarray(x).mean(axis=0), rcond=None)[0]
        out[name] = (float(gain), float(offset))
    return out
