"""Transforms of the ABIDE feature chain: sliding windows, tangent space.

The published federated ABIDE pipeline (Li et al., Medical Image Analysis 2020, which the
FedBN paper's ABIDE set-up follows) augments the data by cutting each subject's ROI
time series into overlapping windows of 32 volumes and computing one correlation matrix
per window. :class:`SlidingWindowConnectivity` is that step as a transform in MONAI's
sense (a callable; MONAI's ``Compose`` takes it as it is, without this module importing
MONAI, which would cost every ABIDE process seconds): one subject's
``(n_volumes, n_rois)`` series in,
``(n_windows, n_rois * (n_rois - 1) / 2)`` Fisher-z features out, through the same
:func:`~fedbn_med.tasks.abide.data.connectivity_features` as the whole-series features.

:func:`window_rows` applies it to the subjects of a site's
:class:`~fedbn_med.tasks.abide.data.SiteFeatures`, reading their series with the
package's own reader, and returns one row per window with the subject each row
belongs to; at test time a subject is scored by the mean of its windows' probabilities
(:class:`fedbn_med.training.trainer.SiteData` ``*_groups``).

:class:`TangentConnectivity` is the other way to describe a subject's connectivity: each
subject's covariance (Ledoit-Wolf shrinkage of the standardised series) is mapped into
the tangent space at the mean of the *site's own training subjects*, so the reference is
fitted where the data are, on training rows only, and never leaves the site (the tangent
embedding of Varoquaux et al., MICCAI 2010; Abraham et al., NeuroImage 2017, found
tangent-space connectivity the strongest measure for ABIDE across sites).
:func:`tangent_rows` applies it to a site.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedbn_med.tasks.abide.data import (
    SiteFeatures,
    check_abide_files,
    connectivity_features,
    edge_index,
    read_roi_time_series,
)

__all__ = ["SlidingWindowConnectivity", "TangentConnectivity", "tangent_rows", "window_rows"]

logger = logging.getLogger(__name__)


class SlidingWindowConnectivity:
    """Turn one subject's ROI series into one connectivity vector per sliding window.

    Parameters
    ----------
    window : int
        Volumes per window (the published code: 32).
    step : int
        Volumes between window starts (the published code: 1, every possible window).

    A series shorter than ``window`` gives one window, the whole series. Correlations
    with an ROI that is constant within a window are undefined and set to 0, as the
    loader's default ``zero_roi="zero"`` does for whole series.
    """

    def __init__(self, window: int = 32, step: int = 1) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 3:
            raise ValueError(f"window must be an integer of at least 3 volumes, got {window!r}.")
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be a positive integer, got {step!r}.")
        self.window = window
        self.step = step

    def starts(self, n_volumes: int) -> range:
        """Return the first volume of every window of a series of ``n_volumes``."""
        if n_volumes <= self.window:
            return range(1)
        return range(0, n_volumes - self.window + 1, self.step)

    def __call__(self, series: np.ndarray) -> np.ndarray:
        """Return ``float32`` ``(n_windows, n_features)`` Fisher-z window correlations."""
        data = np.asarray(series, dtype=np.float64)
        if data.ndim != 2 or data.shape[0] < 2:
            raise ValueError(f"Expected one subject's (n_volumes, n_rois) series, got shape "
                             f"{data.shape}.")
        windows = [data[s:s + self.window] for s in self.starts(data.shape[0])]
        features, _ = connectivity_features(windows)
        return np.nan_to_num(features, nan=0.0).astype(np.float32)


def window_rows(data_dir: str | Path, feats: SiteFeatures,
                transform: SlidingWindowConnectivity) -> tuple[np.ndarray, np.ndarray]:
    """Return the window features of a site's subjects and each row's subject index.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        The folder holding ``ABIDE_pcp/`` that ``feats`` was loaded from (the loader's
        default pipeline: C-PAC, ``filt_noglobal``, ``rois_ho``).
    feats : SiteFeatures
        The site's subjects, in their order.
    transform : SlidingWindowConnectivity
        The windowing.

    Returns
    -------
    rows : numpy.ndarray
        ``float32`` ``(n_windows_total, n_features)``, subject after subject (read-only:
        the last few sites' windows are kept in memory, since every fold and strategy of
        a sweep reads them again).
    subject : numpy.ndarray
        ``int64`` ``(n_windows_total,)``: the index in ``feats`` of each row's subject.
    """
    return _window_rows(str(data_dir), feats.site, tuple(sorted(set(feats.abide_site_ids))),
                        feats.file_ids, feats.n_features, transform.window, transform.step)


@lru_cache(maxsize=16)  # a 14-site federation's series (about 100 MB) stay in memory
def _site_series(data_dir: str, site: str, site_ids: tuple[str, ...],
                 file_ids: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """Return the ROI series of a site's subjects, in ``file_ids`` order (read-only)."""
    selected = check_abide_files(data_dir, list(site_ids))
    paths = dict(zip((str(f) for f in selected["FILE_ID"]), selected["path"]))
    missing = [f for f in file_ids if f not in paths]
    if missing:
        raise ValueError(f"Site {site}: no ROI file for {len(missing)} subject(s) whose "
                         f"features were loaded (e.g. {missing[0]}) under {data_dir}.")
    out = []
    for file_id in file_ids:
        series, _ = read_roi_time_series(paths[file_id])
        series.setflags(write=False)
        out.append(series)
    return tuple(out)


@lru_cache(maxsize=16)
def _site_covariances(data_dir: str, site: str, site_ids: tuple[str, ...],
                      file_ids: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """Return each subject's :meth:`TangentConnectivity.covariance` (read-only).

    A subject's covariance does not depend on the fold, so every fold, repetition and
    strategy of a sweep reuses it; only the reference is fitted again.
    """
    out = []
    for series in _site_series(data_dir, site, site_ids, file_ids):
        covariance = TangentConnectivity.covariance(series)
        covariance.setflags(write=False)
        out.append(covariance)
    return tuple(out)


#: Bump when the window features' computation changes: their disk cache is keyed by it.
WINDOWS_VERSION = "1"


@lru_cache(maxsize=4)
def _window_rows(data_dir: str, site: str, site_ids: tuple[str, ...],
                 file_ids: tuple[str, ...], n_features: int, window: int, step: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Return a site's window rows: from memory, else the disk cache, else computed.

    The disk cache (``<data_dir>/cache/abide_windows_<site>_<key>.npz``, written
    atomically) is keyed like the feature cache (:mod:`fedbn_med.tasks.abide.data.cache`):
    the size and modification time of every ROI file read, the subjects, the window and
    its step, and :data:`WINDOWS_VERSION`; it holds exactly the arrays computed here,
    so a run reading it trains on the same bits as one computing them.
    """
    from fedbn_med.tasks.abide.data.cache import load_arrays, save_arrays, window_cache_path

    path = window_cache_path(Path(data_dir), site, check_abide_files(data_dir, list(site_ids)),
                             {"windows_version": WINDOWS_VERSION, "file_ids": list(file_ids),
                              "window": window, "step": step})
    cached = load_arrays(path, ("rows", "subject"))
    if cached is not None and cached["rows"].shape[1:] == (n_features,) and (
            cached["subject"].shape == cached["rows"].shape[:1]):
        rows, subject = cached["rows"], cached["subject"]
        logger.debug("%s: window rows read from cache %s", site, path)
    else:
        rows, subject = _compute_window_rows(data_dir, site, site_ids, file_ids, n_features,
                                             window, step)
        save_arrays(path, {"rows": rows, "subject": subject})
    for array in (rows, subject):
        array.setflags(write=False)
    return rows, subject


def _compute_window_rows(data_dir: str, site: str, site_ids: tuple[str, ...],
                         file_ids: tuple[str, ...], n_features: int, window: int, step: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    transform = SlidingWindowConnectivity(window, step)
    blocks: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    for index, series in enumerate(_site_series(data_dir, site, site_ids, file_ids)):
        block = transform(series)
        blocks.append(block)
        owners.append(np.full(block.shape[0], index, dtype=np.int64))
    rows = np.concatenate(blocks) if blocks else np.zeros((0, n_features), np.float32)
    if rows.shape[1] != n_features:
        raise ValueError(f"Site {site}: window features have {rows.shape[1]} columns but "
                         f"the site's features have {n_features}.")
    logger.info("%s: %d subjects -> %d windows of %d volumes (step %d).", site,
                len(file_ids), rows.shape[0], window, step)
    subject = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    return rows, subject


class TangentConnectivity:
    """Map subjects' covariances into the tangent space at a reference fitted on others.

    Each subject's covariance is the Ledoit-Wolf shrinkage estimate of its z-scored
    series (a correlation-like, positive definite matrix even with a constant ROI).
    :meth:`fit` sets the reference from the training subjects' covariances: their
    log-Euclidean mean ``expm(mean_i logm(C_i))`` (Arsigny et al., 2007; closed form, so
    no iteration that may stop short). Calling the fitted transform on any subjects'
    series returns, per subject, ``logm(R^-1/2 C R^-1/2)``: the upper triangle without
    the diagonal, as ``float32``, in the same edge order as the correlation features
    (:func:`~fedbn_med.tasks.abide.data.edge_index`), so the network's input is unchanged
    (6105 values for 111 ROIs).
    """

    def __init__(self) -> None:
        self._whiten: np.ndarray | None = None

    @staticmethod
    def _check(series: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
        data = [np.asarray(s, dtype=np.float64) for s in series]
        if not data:
            raise ValueError(f"TangentConnectivity.{what} needs at least one subject's series.")
        rois = {d.shape[1] if d.ndim == 2 else -1 for d in data}
        if len(rois) != 1 or -1 in rois or min(d.shape[0] for d in data) < 2:
            raise ValueError(f"TangentConnectivity.{what} expects (n_volumes >= 2, n_rois) "
                             f"series with one ROI count, got shapes "
                             f"{sorted({d.shape for d in data})[:3]}.")
        return data

    @staticmethod
    def covariance(series: np.ndarray) -> np.ndarray:
        """Return the Ledoit-Wolf covariance of one subject's z-scored series."""
        from sklearn.covariance import ledoit_wolf

        data = np.asarray(series, dtype=np.float64)
        centred = data - data.mean(0)
        scale = centred.std(0, ddof=1)
        scale[scale < np.finfo(np.float64).eps] = 1.0  # a constant ROI stays all zero
        covariance, _ = ledoit_wolf(centred / scale, assume_centered=True)
        return covariance

    def fit(self, series: Sequence[np.ndarray]) -> TangentConnectivity:
        """Fit the reference on these (training) subjects' series and return self."""
        return self.fit_covariances([self.covariance(d) for d in self._check(series, "fit")])

    def fit_covariances(self, covariances: Sequence[np.ndarray]) -> TangentConnectivity:
        """Fit the reference on subjects' :meth:`covariance` matrices and return self."""
        if not covariances:
            raise ValueError("TangentConnectivity.fit needs at least one subject's series.")
        mean_log = np.mean([_spd_map(c, np.log) for c in covariances], axis=0)
        # R^-1/2 of R = expm(mean_log) is expm(-mean_log / 2)
        self._whiten = _spd_map(mean_log, lambda v: np.exp(-v / 2.0), spd=False)
        return self

    @property
    def reference(self) -> np.ndarray:
        """Return the fitted reference covariance ``R``."""
        return _spd_map(self._fitted(), lambda v: v ** -2.0)

    def _fitted(self) -> np.ndarray:
        if self._whiten is None:
            raise RuntimeError("TangentConnectivity must be fitted (fit) before it is used.")
        return self._whiten

    def __call__(self, series: Sequence[np.ndarray]) -> np.ndarray:
        """Return ``float32`` ``(n_subjects, n_rois * (n_rois - 1) / 2)`` tangent vectors."""
        self._fitted()
        data = self._check(series, "__call__")
        return self.map_covariances([self.covariance(d) for d in data], what="series")

    def map_covariances(self, covariances: Sequence[np.ndarray], *,
                        what: str = "covariances") -> np.ndarray:
        """Return the tangent vectors of subjects' :meth:`covariance` matrices."""
        w = self._fitted()
        rois = {c.shape[0] for c in covariances}
        if rois and rois != {w.shape[0]}:
            raise ValueError(f"TangentConnectivity was fitted on {w.shape[0]} ROIs, got "
                             f"{what} of {min(rois)}.")
        rows, cols = edge_index(w.shape[0])
        out = np.empty((len(covariances), rows.size), dtype=np.float32)
        for i, c in enumerate(covariances):
            out[i] = _spd_map(w @ c @ w, np.log)[rows, cols]
        return out


def _spd_map(matrix: np.ndarray, fn, *, spd: bool = True) -> np.ndarray:  # noqa: ANN001
    """Return ``V fn(L) V^T`` for the symmetric ``matrix = V L V^T``.

    With ``spd`` the eigenvalues must be positive (a covariance); a matrix that is not
    is refused rather than giving NaN.
    """
    sym = (matrix + matrix.T) / 2.0
    values, vectors = np.linalg.eigh(sym)
    if spd and not values.min() > 0:
        raise ValueError(f"Expected a positive definite matrix, got smallest eigenvalue "
                         f"{values.min():.3g}.")
    return (vectors * fn(values)) @ vectors.T


def tangent_rows(data_dir: str | Path, feats: SiteFeatures,
                 train: Sequence[int] | np.ndarray) -> np.ndarray:
    """Return a site's tangent-space features, the reference fitted on ``train`` only.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        The folder holding ``ABIDE_pcp/`` that ``feats`` was loaded from.
    feats : SiteFeatures
        The site's subjects, in their order.
    train : sequence of int
        Indices (into ``feats``) of the subjects the reference is fitted on: the run's
        training split, never its validation or test subjects.

    Returns
    -------
    numpy.ndarray
        ``float32`` ``(n_subjects, n_features)``, one row per subject of ``feats``.
    """
    index = np.asarray(train, dtype=np.int64)
    if index.size == 0:
        raise ValueError(f"Site {feats.site}: the tangent-space reference needs at least one "
                         "training subject, got none.")
    covariances = _site_covariances(str(data_dir), feats.site,
                                    tuple(sorted(set(feats.abide_site_ids))), feats.file_ids)
    transform = TangentConnectivity().fit_covariances([covariances[i] for i in index])
    rows = transform.map_covariances(covariances)
    if rows.shape[1] != feats.n_features:
        raise ValueError(f"Site {feats.site}: tangent features have {rows.shape[1]} columns "
                         f"but the site's features have {feats.n_features}.")
    logger.info("%s: tangent space at the log-Euclidean mean of %d training subjects.",
                feats.site, index.size)
    return rows
