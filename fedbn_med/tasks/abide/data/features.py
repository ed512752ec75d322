"""Turn ROI time series into connectivity features, and hold one site's features.

The time series are turned into Pearson correlations (the arithmetic of nilearn's
``ConnectivityMeasure(kind="correlation")`` with an empirical covariance), Fisher-z
transformed, and vectorised
(upper triangle without the diagonal: 6105 features for the 111 Harvard-Oxford ROIs).

Real-data quirk: some subjects have a constant (all-zero) ROI column, usually the
2-voxel Harvard-Oxford label 3455, whose correlations are undefined. The ``zero_roi``
policy decides what happens; NaN never leaves this package.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Literal, get_args

import numpy as np
from threadpoolctl import ThreadpoolController

__all__ = ["SiteFeatures", "ZeroRoiPolicy", "connectivity_features", "edge_index"]

logger = logging.getLogger(__name__)

_R_CLIP = 1.0 - 1e-7


@cache
def _thread_pools() -> ThreadpoolController:
    """Return this process's thread pools (BLAS, OpenMP), found once.

    Finding them walks every loaded library: 3.5 ms a call with numpy and scipy loaded,
    which ``threadpool_limits`` paid at every call.
    """
    return ThreadpoolController()


ZeroRoiPolicy = Literal["zero", "impute", "drop_subject"]
_ZERO_ROI_POLICIES: tuple[str, ...] = get_args(ZeroRoiPolicy)


@dataclass(frozen=True, eq=False)
class SiteFeatures:
    """Connectivity features and labels of one site (one institution of the federation).

    Parameters
    ----------
    site : str
        Institution name, e.g. ``"UM"``.
    features : numpy.ndarray
        ``float32`` array ``(n_subjects, n_features)``, Fisher-z correlations of the upper
        triangle (row-major ``numpy.triu_indices(n_rois, k=1)`` order), never NaN.
    labels : numpy.ndarray
        ``int64`` array ``(n_subjects,)``: 1 = ASD, 0 = typical control.
    subject_ids : tuple of int
        ABIDE ``SUB_ID`` per subject.
    file_ids : tuple of str
        ABIDE ``FILE_ID`` per subject.
    abide_site_ids : tuple of str
        ABIDE ``SITE_ID`` per subject (an institution may pool several).
    mean_fd : numpy.ndarray
        ``float64`` mean framewise displacement (mm) per subject; NaN where not recorded.
    roi_labels : tuple of str
        Atlas labels of the ROI columns, from the file header.
    """

    site: str
    features: np.ndarray
    labels: np.ndarray
    subject_ids: tuple[int, ...]
    file_ids: tuple[str, ...]
    abide_site_ids: tuple[str, ...]
    mean_fd: np.ndarray
    roi_labels: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        """Check that every per-subject field has one entry per row and freeze arrays."""
        n = self.features.shape[0]
        lengths = {
            "labels": len(self.labels),
            "subject_ids": len(self.subject_ids),
            "file_ids": len(self.file_ids),
            "abide_site_ids": len(self.abide_site_ids),
            "mean_fd": len(self.mean_fd),
        }
        wrong = {k: v for k, v in lengths.items() if v != n}
        if self.features.ndim != 2 or wrong:
            raise ValueError(
                f"SiteFeatures expects a 2-D features array and one entry per subject "
                f"({n}); got features of shape {self.features.shape} and lengths {wrong}."
            )
        for array in (self.features, self.labels, self.mean_fd):
            array.setflags(write=False)

    @property
    def n_subjects(self) -> int:
        """Return the number of subjects."""
        return int(self.features.shape[0])

    @property
    def n_features(self) -> int:
        """Return the feature dimension."""
        return int(self.features.shape[1])


def edge_index(n_rois: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the ROI index pairs of the feature vector (upper triangle, no diagonal).

    Parameters
    ----------
    n_rois : int
        Number of ROIs.

    Returns
    -------
    tuple of numpy.ndarray
        Row and column indices, as :func:`numpy.triu_indices` with ``k=1``.
    """
    rows, cols = np.triu_indices(n_rois, k=1)
    return rows, cols


def _correlation(series: np.ndarray) -> np.ndarray:
    """Return the Pearson correlation matrix of one ``(n_volumes, n_rois)`` series.

    The empirical (biased) covariance, then each entry divided by the two standard
    deviations, the diagonal set to exactly 1: the very operations, in the same order, of
    nilearn's ``ConnectivityMeasure(kind="correlation")`` with scikit-learn's
    ``EmpiricalCovariance`` (its ``standardize`` option changes nothing for a correlation),
    which computed these features before; ``tests/test_abide.py`` checks they agree to the
    bit. Called directly, a 32-volume window costs a tenth of the time (no estimator is
    fitted and validated per window).
    """
    covariance = np.cov(series.T, bias=True)
    scale = np.atleast_2d(1.0 / np.sqrt(np.diag(covariance)))
    correlation = covariance * scale * scale.T
    np.fill_diagonal(correlation, 1.0)
    return correlation


def connectivity_features(time_series: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Compute Fisher-z correlation features and flag constant ROIs per subject.

    Parameters
    ----------
    time_series : sequence of numpy.ndarray
        One ``(n_volumes, n_rois)`` array per subject; ``n_rois`` must agree.

    Returns
    -------
    features : numpy.ndarray
        ``float64`` ``(n_subjects, n_rois * (n_rois - 1) / 2)``: arctanh of the Pearson
        correlations of :func:`edge_index` pairs. Entries involving a constant ROI are NaN.
    constant : numpy.ndarray
        ``bool`` ``(n_subjects, n_rois)``: True where a subject's ROI series is constant.
    """
    n_rois = {np.shape(ts)[1] if np.ndim(ts) == 2 else -1 for ts in time_series}
    if -1 in n_rois:
        raise ValueError("Expected one (n_volumes, n_rois) array per subject, got shapes "
                         f"{sorted({np.shape(ts) for ts in time_series})}.")
    if len(n_rois) != 1:
        raise ValueError(
            f"Expected every subject to have the same ROI count, got {sorted(n_rois)}."
        )
    series = [np.asarray(ts, dtype=np.float64) for ts in time_series]
    for i, ts in enumerate(series):
        if not np.isfinite(ts).all():
            raise ValueError(f"Subject {i}'s series holds NaN or Inf; expected finite numbers.")
    constant = np.stack([np.ptp(ts, axis=0) == 0 for ts in series])
    # Threaded BLAS only slows these small products down (and fights other processes).
    with np.errstate(divide="ignore", invalid="ignore"), _thread_pools().limit(
            limits=1, user_api="blas"):
        matrices = np.stack([_correlation(ts) for ts in series])
    rows, cols = edge_index(n_rois.pop())
    r = matrices[:, rows, cols]
    z = np.arctanh(np.clip(r, -_R_CLIP, _R_CLIP))
    z[constant[:, rows] | constant[:, cols]] = np.nan
    return z, constant


def _apply_zero_roi_policy(
    features: np.ndarray,
    constant: np.ndarray,
    policy: ZeroRoiPolicy,
    site: str,
    roi_labels: Sequence[str],
) -> tuple[np.ndarray, np.ndarray]:
    """Remove NaN left by constant ROIs; return features and the kept-subject mask."""
    affected = np.asarray(constant.any(axis=1))
    keep = np.ones(len(features), dtype=bool)
    if not affected.any():
        return features, keep
    roi_idx = np.flatnonzero(constant.any(axis=0))
    names = ", ".join(roi_labels[int(i)] if i < len(roi_labels) else f"column {i}" for i in roi_idx)
    nan = np.isnan(features)
    if policy == "zero":
        features = np.where(nan, 0.0, features)
        action = "their correlations with that ROI set to 0"
    elif policy == "impute":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN edge is filled by 0
            fill = np.nanmean(features, axis=0)
        fill = np.nan_to_num(fill, nan=0.0)
        features = np.where(nan, fill[np.newaxis, :], features)
        action = "their correlations with that ROI imputed by the site mean"
    else:
        keep = ~affected
        features = features[keep]
        action = "those subjects dropped"
    logger.info(
        "%s: %d of %d subjects have a constant (all-zero) ROI (labels: %s); zero_roi=%r, %s.",
        site, int(affected.sum()), len(affected), names, policy, action,
    )
    return features, keep
