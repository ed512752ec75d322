"""Feature harmonisation fitted on training rows only: per-site z-scores, motion, ComBat.

Each class is fitted on a site's (or, for ComBat, every site's) training rows and then
transforms any rows of that site, training, validation or test alike, with the fitted
statistics: nothing a transform uses comes from validation or test rows.

- :class:`SiteStandardizer`: each feature's mean and standard deviation at one site
  (computed at the site: fully federated).
- :class:`MotionRegressor`: each feature's linear dependence on mean framewise
  displacement (FD) at one site, removed (fully federated).
- :class:`ComBat`: ComBat (Johnson et al. 2007; Fortin et al. 2018) through the
  ``neuroCombat`` package. Not federated: ComBat estimates a grand mean and a pooled
  variance over every site's rows before its per-site location and scale, so it is fitted
  on the pooled training rows of all sites (see :meth:`ComBat.fit`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Mapping

import numpy as np

__all__ = ["ComBat", "MotionRegressor", "SiteStandardizer"]

logger = logging.getLogger(__name__)


def _rows(x: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 2:
        raise ValueError(f"{what} expects a 2-D array of at least 2 training rows, got shape "
                         f"{arr.shape}.")
    return arr


class SiteStandardizer:
    """Z-score each feature with one site's training mean and standard deviation.

    A feature that is constant on the training rows keeps a scale of 1 (it is only
    centred), so no value becomes infinite.
    """

    def __init__(self) -> None:
        self.mean_: np.ndarray | None = None
        self.scale_: np.ndarray | None = None

    def fit(self, x: np.ndarray) -> SiteStandardizer:
        """Estimate the mean and (unbiased) standard deviation of every column of ``x``."""
        arr = _rows(x, "SiteStandardizer.fit")
        self.mean_ = arr.mean(axis=0)
        std = arr.std(axis=0, ddof=1)
        self.scale_ = np.where(std > 0, std, 1.0)
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        """Return ``(x - mean) / std`` as ``float32``."""
        if self.mean_ is None or self.scale_ is None:
            raise RuntimeError("SiteStandardizer.transform called before fit.")
        return ((np.asarray(x, np.float64) - self.mean_) / self.scale_).astype(np.float32)


class MotionRegressor:
    """Remove each feature's linear dependence on mean FD, fitted on training rows.

    The fitted model is ``x = a + b * fd`` per feature; :meth:`transform` returns
    ``x - b * (fd - mean_fd)``, which keeps each feature's training mean. Rows whose FD
    is not recorded (NaN) take the training median FD, i.e. are left almost unchanged.
    """

    def __init__(self) -> None:
        self.fd_center_: float | None = None
        self.fd_fill_: float | None = None
        self.slope_: np.ndarray | None = None

    def _fd(self, fd: np.ndarray, n: int) -> np.ndarray:
        values = np.asarray(fd, dtype=np.float64).reshape(-1)
        if values.shape[0] != n:
            raise ValueError(f"MotionRegressor expects one mean FD per row ({n}), got "
                             f"{values.shape[0]}.")
        assert self.fd_fill_ is not None
        return np.where(np.isfinite(values), values, self.fd_fill_)

    def fit(self, x: np.ndarray, fd: np.ndarray) -> MotionRegressor:
        """Fit the per-feature slope on mean FD over the training rows."""
        arr = _rows(x, "MotionRegressor.fit")
        values = np.asarray(fd, dtype=np.float64).reshape(-1)
        known = np.isfinite(values)
        if known.sum() < 2:
            raise ValueError(f"MotionRegressor needs the mean FD of at least 2 training rows; "
                             f"{int(known.sum())} of {len(values)} have one (func_mean_fd).")
        self.fd_fill_ = float(np.median(values[known]))
        filled = self._fd(values, arr.shape[0])
        self.fd_center_ = float(filled.mean())
        centred = filled - self.fd_center_
        denom = float(centred @ centred)
        self.slope_ = ((centred @ (arr - arr.mean(axis=0))) / denom if denom > 0
                       else np.zeros(arr.shape[1]))
        return self

    def transform(self, x: np.ndarray, fd: np.ndarray) -> np.ndarray:
        """Return the features with the fitted FD effect removed, as ``float32``."""
        if self.slope_ is None or self.fd_center_ is None:
            raise RuntimeError("MotionRegressor.transform called before fit.")
        arr = np.asarray(x, dtype=np.float64)
        filled = self._fd(fd, arr.shape[0])
        return (arr - np.outer(filled - self.fd_center_, self.slope_)).astype(np.float32)


def _neurocombat():  # noqa: ANN202
    try:
        from neuroCombat import neuroCombat
    except ImportError as err:  # it is a dependency: only a broken install lacks it
        raise ImportError(
            "ComBat harmonisation needs the package neuroCombat, which is not installed "
            "(expected neuroCombat==0.2.12: pip install neuroCombat==0.2.12).") from err
    return neuroCombat


class ComBat:
    """ComBat harmonisation (empirical Bayes, parametric), fitted on training rows only.

    Fitting needs every site's training rows at once: ComBat standardises each feature by
    a grand mean and a variance pooled over all sites before it estimates each site's
    location and scale, and its empirical-Bayes priors pool over features. This is the
    centralised fit of the method; in a real federation those pooled statistics would
    have to be aggregated from the sites, which ``neuroCombat`` does not offer.

    Features that are constant at any site's training rows are left unchanged (ComBat's
    scale estimate would be zero there).
    """

    def __init__(self) -> None:
        self.estimates_: dict[str, np.ndarray] | None = None
        self.columns_: np.ndarray | None = None
        self.sites_: tuple[str, ...] = ()

    def fit(self, train: Mapping[str, np.ndarray]) -> ComBat:
        """Fit ComBat on each site's training rows (``{site: (n_rows, n_features)}``)."""
        if len(train) < 2:
            raise ValueError(f"ComBat needs the training rows of at least 2 sites, got "
                             f"{len(train)} ({', '.join(train) or 'none'}).")
        blocks = {site: _rows(x, f"ComBat.fit (site {site})") for site, x in train.items()}
        widths = {x.shape[1] for x in blocks.values()}
        if len(widths) != 1:
            raise ValueError(f"ComBat expects the same features at every site, got widths "
                             f"{sorted(widths)}.")
        varying = np.logical_and.reduce([x.std(axis=0) > 0 for x in blocks.values()])
        self.columns_ = np.flatnonzero(varying)
        self.sites_ = tuple(blocks)
        data = np.concatenate([x[:, self.columns_] for x in blocks.values()]).T
        batch = np.concatenate([[site] * len(x) for site, x in blocks.items()])
        import pandas as pd

        combat = _neurocombat()
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = combat(data, pd.DataFrame({"site": batch}), "site")
        self.estimates_ = out["estimates"]
        return self

    def transform(self, site: str, x: np.ndarray) -> np.ndarray:
        """Return ``site``'s rows harmonised with the fitted estimates, as ``float32``."""
        if self.estimates_ is None or self.columns_ is None:
            raise RuntimeError("ComBat.transform called before fit.")
        if site not in self.sites_:
            raise ValueError(f"ComBat was fitted on sites {', '.join(self.sites_)}; it cannot "
                             f"harmonise site '{site}'.")
        arr = np.array(x, dtype=np.float64)
        if arr.shape[0] == 0:
            return arr.astype(np.float32)
        # The fitted model applied to new rows: standardise by the grand mean and pooled
        # variance, remove the site's EB location and scale, then undo the standardisation.
        # (neuroCombat's own neuroCombatFromTraining fails on numpy 2 and expects the
        # integer batch codes it assigned, the sorted order of the site names.)
        est = self.estimates_
        level = sorted(self.sites_).index(site)
        mean = np.asarray(est["stand.mean"])[:, 0] + np.asarray(est["mod.mean"]).mean(axis=1)
        sd = np.sqrt(np.asarray(est["var.pooled"]).reshape(-1))
        gamma = np.asarray(est["gamma.star"])[level]
        delta = np.asarray(est["delta.star"])[level]
        z = (arr[:, self.columns_] - mean) / sd
        arr[:, self.columns_] = (z - gamma) / np.sqrt(delta) * sd + mean
        return arr.astype(np.float32)
