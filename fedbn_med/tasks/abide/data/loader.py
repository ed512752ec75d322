"""Load ABIDE Preprocessed (PCP) ROI time series as connectivity features, offline.

:func:`load_site_features` selects a site's subjects (:mod:`.layout`), checks and reads
their ROI files through nilearn (:mod:`.roi_files`), computes the features
(:mod:`.features`) and keeps them in the on-disk cache (:mod:`.cache`).
:func:`load_abide` does it for several institutions at once.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from fedbn_med.paths import resolve_data_dir
from fedbn_med.tasks.abide.data.cache import _cache_path, _load_cache, _save_cache
from fedbn_med.tasks.abide.data.features import (
    _ZERO_ROI_POLICIES,
    SiteFeatures,
    ZeroRoiPolicy,
    _apply_zero_roi_policy,
    connectivity_features,
)
from fedbn_med.tasks.abide.data.layout import (
    FEDBN_INSTITUTIONS,
    MISSING_VALUE,
    _as_site_ids,
    _check_choice,
    check_abide_files,
)
from fedbn_med.tasks.abide.data.roi_files import _read_site_series

__all__ = ["load_abide", "load_site_features"]

logger = logging.getLogger(__name__)


def _check_bad_share(
    site: str, skipped: Sequence[tuple[str, str]], n_total: int, max_bad_fraction: float
) -> None:
    if skipped and len(skipped) / n_total > max_bad_fraction:
        listed = "\n  ".join(f"{p}: {r}" for p, r in skipped[:5])
        raise ValueError(
            f"{len(skipped)} of {n_total} ROI files of site {site} are unusable "
            f"({len(skipped) / n_total:.0%}), more than max_bad_fraction={max_bad_fraction:g}:"
            f"\n  {listed}"
        )


def _compute_site_features(
    root: Path,
    selected: pd.DataFrame,
    site: str,
    site_ids: tuple[str, ...],
    options: Mapping[str, object],
) -> tuple[SiteFeatures, list[tuple[str, str]]]:
    """Validate files, read them through nilearn and compute features (no cache)."""
    good, series, roi_labels, skipped = _read_site_series(root, selected, site_ids, options)
    _check_bad_share(site, skipped, len(selected), float(cast(float, options["max_bad_fraction"])))
    if not good:
        raise ValueError(f"Site {site} has no usable subjects: all {len(selected)} ROI files "
                         "are unusable (see the warnings above).")
    chosen = selected.iloc[good]
    features, constant = connectivity_features(series)
    policy: ZeroRoiPolicy = options["zero_roi"]  # type: ignore[assignment]
    features, keep = _apply_zero_roi_policy(features, constant, policy, site, roi_labels)
    if not keep.any():
        raise ValueError(f"Site {site} has no usable subjects: every subject has a constant "
                         "ROI and zero_roi='drop_subject'.")
    n_bad = int((~np.isfinite(features)).sum())
    if n_bad:
        raise ValueError(f"Features of site {site} contain {n_bad} NaN/Inf value(s) after the "
                         f"zero_roi policy {policy!r}; refusing to hand them to training.")
    kept = chosen.loc[keep]
    mean_fd = (
        pd.to_numeric(kept["func_mean_fd"], errors="coerce").to_numpy(dtype=np.float64)
        if "func_mean_fd" in kept.columns
        else np.full(len(kept), np.nan)
    )
    mean_fd = np.where(mean_fd == MISSING_VALUE, np.nan, mean_fd)
    result = SiteFeatures(
        site=site,
        features=features.astype(np.float32),
        labels=(kept["DX_GROUP"].to_numpy() == 1).astype(np.int64),
        subject_ids=tuple(int(s) for s in kept["SUB_ID"]),
        file_ids=tuple(str(f) for f in kept["FILE_ID"]),
        abide_site_ids=tuple(str(s) for s in kept["SITE_ID"]),
        mean_fd=mean_fd,
        roi_labels=roi_labels,
    )
    return result, skipped


def load_site_features(
    data_dir: str | Path | None,
    site_ids: str | Sequence[str],
    *,
    name: str | None = None,
    pipeline: str = "cpac",
    band_pass_filtering: bool = True,
    global_signal_regression: bool = False,
    derivative: str = "rois_ho",
    quality_checked: bool = True,
    zero_roi: ZeroRoiPolicy = "zero",
    max_bad_fraction: float = 0.2,
    use_cache: bool = True,
) -> SiteFeatures:
    """Load the connectivity features of one site, from the cache when its inputs match.

    Parameters
    ----------
    data_dir : str or pathlib.Path or None
        Directory that contains ``ABIDE_pcp/``; features are cached in ``<data_dir>/cache``.
    site_ids : str or sequence of str
        ABIDE ``SITE_ID`` values pooled into this site, e.g. ``("UM_1",)``.
    name : str or None, default=None
        Site (institution) name; defaults to the SITE_IDs joined by ``+``.
    pipeline, band_pass_filtering, global_signal_regression, derivative, quality_checked
        As in :func:`check_abide_files`.
    zero_roi : {"zero", "impute", "drop_subject"}, default="zero"
        What to do with correlations of a constant (all-zero) ROI: set them to 0 (keeps
        the feature dimension identical across sites), impute the site mean, or drop the
        subject. The decision is logged.
    max_bad_fraction : float, default=0.2
        Largest share of unusable ROI files that is skipped (one warning each) before
        the site is refused.
    use_cache : bool, default=True
        Read and write the on-disk feature cache.

    Returns
    -------
    SiteFeatures
        Features, labels and subject metadata of the site.

    Raises
    ------
    FileNotFoundError
        If the phenotypic table or a selected ROI file is missing.
    ValueError
        For unknown sites or options, too many unusable files, or no usable subject.
    """
    _check_choice("zero_roi", zero_roi, _ZERO_ROI_POLICIES)
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise ValueError(f"max_bad_fraction must lie in [0, 1], got {max_bad_fraction!r}.")
    ids = _as_site_ids(site_ids)
    site = name or "+".join(ids)
    root = resolve_data_dir(data_dir)
    selected = check_abide_files(
        root,
        ids,
        pipeline=pipeline,
        band_pass_filtering=band_pass_filtering,
        global_signal_regression=global_signal_regression,
        derivative=derivative,
        quality_checked=quality_checked,
    )
    if selected.empty:
        raise ValueError(
            f"Site {site} has no usable subjects: no row of SITE_ID {', '.join(ids)} has a "
            f"file{' and passes quality control' if quality_checked else ''}."
        )
    options: dict[str, object] = {
        "site": site,
        "site_ids": list(ids),
        "pipeline": pipeline,
        "band_pass_filtering": band_pass_filtering,
        "global_signal_regression": global_signal_regression,
        "derivative": derivative,
        "quality_checked": quality_checked,
        "zero_roi": zero_roi,
    }
    cache_path = _cache_path(root, site, selected, options)
    if use_cache and cache_path.is_file():
        try:
            result, skipped = _load_cache(cache_path)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            logger.warning("Ignoring unreadable feature cache %s (%s); recomputing.",
                           cache_path, exc)
        else:
            for path, reason in skipped:
                logger.warning("Skipping %s: %s", path, reason)
            _check_bad_share(site, skipped, len(selected), max_bad_fraction)
            logger.debug("%s: features read from cache %s", site, cache_path)
            return result
    result, skipped = _compute_site_features(
        root, selected, site, ids, {**options, "max_bad_fraction": max_bad_fraction}
    )
    if use_cache:
        _save_cache(cache_path, result, skipped)
    logger.info("%s: %d subjects x %d features (%d ASD).", site, result.n_subjects,
                result.n_features, int(result.labels.sum()))
    return result


def load_abide(
    data_dir: str | Path | None = None,
    institutions: Mapping[str, str | Sequence[str]] | None = None,
    **options: object,
) -> dict[str, SiteFeatures]:
    """Load the features of several institutions, each pooling one or more ABIDE sites.

    Parameters
    ----------
    data_dir : str or pathlib.Path or None, default=None
        Directory that contains ``ABIDE_pcp/``.
    institutions : mapping of str to str or sequence of str, optional
        Institution name to its ABIDE ``SITE_ID`` values, e.g. ``{"UM": ("UM_1",)}``.
        Defaults to :data:`FEDBN_INSTITUTIONS` (NYU, UM_1, USM, UCLA_1).
    **options
        Keyword arguments of :func:`load_site_features` (``zero_roi``, ``derivative``...).

    Returns
    -------
    dict of str to SiteFeatures
        In the order of ``institutions``.

    Raises
    ------
    ValueError
        If no institution is given, or a SITE_ID is claimed by two institutions.
    """
    mapping = dict(FEDBN_INSTITUTIONS if institutions is None else institutions)
    if not mapping:
        raise ValueError("Expected at least one institution, e.g. {'UM': ('UM_1',)}; got none.")
    owner: dict[str, str] = {}
    for inst, ids in mapping.items():
        for sid in _as_site_ids(ids):
            if sid in owner:
                raise ValueError(
                    f"SITE_ID {sid!r} is assigned to both {owner[sid]!r} and {inst!r}; each "
                    "ABIDE site may belong to one institution only."
                )
            owner[sid] = inst
    return {
        inst: load_site_features(data_dir, ids, name=inst, **options)  # type: ignore[arg-type]
        for inst, ids in mapping.items()
    }
