"""Intervals for cross-validated scores: the naive and the corrected resampled t, Wilson.

- :func:`corrected_t_interval`: the corrected resampled t of Nadeau and Bengio (2003), as
  Bouckaert and Frank (2004) use it for repeated k-fold cross-validation. The cells of a
  cross-validation share training subjects, so their scores are correlated; the naive
  t-interval over cells (:func:`naive_t_interval`) treats them as independent and is too
  narrow. The correction inflates the variance of the mean from ``s^2 / J`` to
  ``(1 / J + n_test / n_train) s^2``.
- :func:`corrected_half_width` and :func:`corrected_half_width_floor`: that interval's
  half-width for a design of ``J`` cells whose scores spread by ``s``, and its limit as
  ``J`` grows (``z s sqrt(n_test / n_train)``), for planning a design.
- :func:`wilson_interval`: the Wilson score interval of one proportion (a site's test
  accuracy over its ``n`` subjects).

The paired tests of two methods on the same subjects are in
:mod:`fedbn_med.evaluation.paired_tests`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["check_level", "corrected_half_width", "corrected_half_width_floor",
           "corrected_t_interval", "naive_t_interval", "wilson_interval"]


def _finite(values: Sequence[float]) -> np.ndarray:
    return np.array([v for v in values if math.isfinite(v)], dtype=float)


def _t_interval(arr: np.ndarray, factor: float, level: float) -> tuple[float, float, float]:
    from scipy import stats

    if arr.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(arr.mean())
    if arr.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, arr.size - 1) * arr.std(ddof=1)
                 * math.sqrt(factor))
    return mean, mean - half, mean + half


def check_level(level: float) -> None:
    """Raise ``ValueError`` unless an interval's coverage ``level`` is in (0, 1)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), such as 0.95, got {level!r}.")


def corrected_half_width(sd: float, test_train_ratio: float, cells: int,
                         level: float = 0.95) -> float:
    """Return ``t_{J-1} sd sqrt(1 / J + n_test / n_train)``: the corrected half-width.

    The half-width :func:`corrected_t_interval` gives ``cells`` (J) scores of standard
    deviation ``sd``; NaN with fewer than two cells or a non-finite ``sd``.
    """
    from scipy import stats

    check_level(level)
    if cells < 2 or not math.isfinite(sd):
        return math.nan
    return float(stats.t.ppf(0.5 + level / 2, cells - 1) * sd
                 * math.sqrt(1 / cells + test_train_ratio))


def corrected_half_width_floor(sd: float, test_train_ratio: float,
                               level: float = 0.95) -> float:
    """Return ``z sd sqrt(n_test / n_train)``: the corrected half-width as J grows.

    No number of cells takes :func:`corrected_half_width` below it (NaN for a
    non-finite ``sd``).
    """
    from scipy import stats

    check_level(level)
    if not math.isfinite(sd):
        return math.nan
    return float(stats.norm.ppf(0.5 + level / 2) * sd * math.sqrt(test_train_ratio))


def naive_t_interval(values: Sequence[float], level: float = 0.95
                     ) -> tuple[float, float, float]:
    """Return (mean, low, high): the Student-t interval that treats values as independent."""
    check_level(level)
    arr = _finite(values)
    return _t_interval(arr, 1.0 / max(arr.size, 1), level)


def corrected_t_interval(values: Sequence[float], test_train_ratio: float,
                         level: float = 0.95) -> tuple[float, float, float]:
    """Return (mean, low, high): the corrected resampled t-interval of cell scores.

    Parameters
    ----------
    values : sequence of float
        One score (or paired difference) per cross-validation cell; NaN are left out.
    test_train_ratio : float
        ``n_test / n_train`` of one cell: ``1 / (k - 1)`` for k-fold cross-validation.
    level : float, default=0.95
        Coverage of the interval.

    Returns
    -------
    tuple of float
        The mean and the bounds ``mean -/+ t_{J-1} s sqrt(1 / J + n_test / n_train)``;
        NaN bounds with fewer than two values.

    Raises
    ------
    ValueError
        If ``test_train_ratio`` is not a positive finite number or ``level`` not in (0, 1).
    """
    check_level(level)
    if not (math.isfinite(test_train_ratio) and test_train_ratio > 0):
        raise ValueError(f"test_train_ratio must be a positive number (n_test / n_train, "
                         f"0.25 for 5 folds), got {test_train_ratio!r}.")
    arr = _finite(values)
    return _t_interval(arr, 1.0 / max(arr.size, 1) + test_train_ratio, level)


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Return the Wilson score interval (low, high) of the proportion ``successes / n``.

    Unlike the normal (Wald) interval it stays inside [0, 1] and keeps its coverage for
    the small test splits of a site (tens of subjects) and for proportions near 0 or 1.
    ``successes`` may be a rate times ``n`` that is a whole number only up to rounding.

    Raises
    ------
    ValueError
        If ``n`` is not a whole number of at least 1, ``successes`` not in [0, n], or
        ``level`` not in (0, 1).
    """
    # ndtri is the normal quantile that scipy.stats.norm.ppf computes, to the bit, without
    # importing scipy.stats (about 0.4 s in each process that prints a results table)
    from scipy.special import ndtri

    check_level(level)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a whole number of subjects >= 1, got {n!r}.")
    if not (math.isfinite(successes) and -1e-6 <= successes <= n + 1e-6):
        raise ValueError(f"successes must be a count from 0 to n = {n}, got {successes!r}.")
    p = min(max(successes / n, 0.0), 1.0)
    z = float(ndtri(0.5 + level / 2))
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
