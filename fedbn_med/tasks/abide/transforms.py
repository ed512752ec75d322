"""MONAI-style transforms of the ABIDE feature chain: sliding-window connectivity.

The published federated ABIDE pipeline (Li et al., Medical Image Analysis 2020, which the
FedBN paper's ABIDE set-up follows) augments the data by cutting each subject's ROI
time series into overlapping windows of 32 volumes and computing one correlation matrix
per window. :class:`SlidingWindowConnectivity` is that step as a MONAI
:class:`~monai.transforms.Transform`: one subject's ``(n_volumes, n_rois)`` series in,
``(n_windows, n_rois * (n_rois - 1) / 2)`` Fisher-z features out, through the same
:func:`~fedbn_med.tasks.abide.data.connectivity_features` as the whole-series features.

:func:`window_rows` applies it to the subjects of a site's
:class:`~fedbn_med.tasks.abide.data.SiteFeatures`, reading their series with the
package's own reader, and returns one row per window with the subject each row
belongs to; at test time a subject is scored by the mean of its windows' probabilities
(:class:`fedbn_med.training.trainer.SiteData` ``*_groups``).
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

import numpy as np
from monai.transforms import Transform

from fedbn_med.tasks.abide.data import (
    SiteFeatures,
    check_abide_files,
    connectivity_features,
    read_roi_time_series,
)

__all__ = ["SlidingWindowConnectivity", "window_rows"]

logger = logging.getLogger(__name__)


class SlidingWindowConnectivity(Transform):
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


@lru_cache(maxsize=4)
def _window_rows(data_dir: str, site: str, site_ids: tuple[str, ...],
                 file_ids: tuple[str, ...], n_features: int, window: int, step: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    transform = SlidingWindowConnectivity(window, step)
    selected = check_abide_files(data_dir, list(site_ids))
    paths = dict(zip((str(f) for f in selected["FILE_ID"]), selected["path"]))
    missing = [f for f in file_ids if f not in paths]
    if missing:
        raise ValueError(f"Site {site}: no ROI file for {len(missing)} subject(s) whose "
                         f"features were loaded (e.g. {missing[0]}) under {data_dir}.")
    blocks: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    for index, file_id in enumerate(file_ids):
        series, _ = read_roi_time_series(paths[file_id])
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
    for array in (rows, subject):
        array.setflags(write=False)
    return rows, subject
