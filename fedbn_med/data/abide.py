"""Load ABIDE Preprocessed (PCP) ROI time series as connectivity features, offline.

The release layout is the one :func:`nilearn.datasets.fetch_abide_pcp` reads::

    <data_dir>/ABIDE_pcp/Phenotypic_V1_0b_preprocessed1.csv
    <data_dir>/ABIDE_pcp/<pipeline>/<strategy>/<FILE_ID>_<derivative>.1D

Subjects are selected as nilearn selects them (rows with ``FILE_ID == "no_filename"``
dropped, then the quality-control filter over the five ``qc_*`` columns, then the
``SITE_ID`` filter). Before nilearn is called, every selected file is checked here: a
missing file raises :class:`FileNotFoundError` naming it (nilearn would try to download
it), and each file is parsed and validated so that a malformed one is reported with its
path and the reason. The time series are then read through nilearn's own loader, turned
into Pearson correlations with :class:`nilearn.connectome.ConnectivityMeasure`,
Fisher-z transformed, and vectorised (upper triangle without the diagonal: 6105 features
for the 111 Harvard-Oxford ROIs). Features are cached on disk, keyed by their inputs.

Real-data quirk: some subjects have a constant (all-zero) ROI column, usually the
2-voxel Harvard-Oxford label 3455, whose correlations are undefined. The ``zero_roi``
policy decides what happens; NaN never leaves this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from fedbn_med.paths import resolve_data_dir

__all__ = [
    "DATASET_DIRNAME",
    "FEDBN_INSTITUTIONS",
    "PHENOTYPIC_FILENAME",
    "QC_COLUMNS",
    "REQUIRED_COLUMNS",
    "DataFileError",
    "SiteFeatures",
    "ZeroRoiPolicy",
    "check_abide_files",
    "connectivity_features",
    "edge_index",
    "load_abide",
    "load_site_features",
    "read_phenotypic",
    "read_roi_time_series",
    "roi_file_path",
    "select_subjects",
    "strategy_name",
]

logger = logging.getLogger(__name__)

DATASET_DIRNAME = "ABIDE_pcp"
PHENOTYPIC_FILENAME = "Phenotypic_V1_0b_preprocessed1.csv"
NO_FILENAME = "no_filename"
MISSING_VALUE = -9999
REQUIRED_COLUMNS: tuple[str, ...] = ("SUB_ID", "SITE_ID", "FILE_ID", "DX_GROUP")
QC_COLUMNS: tuple[str, ...] = (
    "qc_rater_1",
    "qc_anat_rater_2",
    "qc_func_rater_2",
    "qc_anat_rater_3",
    "qc_func_rater_3",
)
# Accepted values per QC column, exactly as nilearn's fetch_abide_pcp filters them.
_QC_ACCEPTED: dict[str, tuple[str, ...]] = {
    "qc_rater_1": ("OK",),
    "qc_anat_rater_2": ("OK", "maybe"),
    "qc_func_rater_2": ("OK", "maybe"),
    "qc_anat_rater_3": ("OK",),
    "qc_func_rater_3": ("OK",),
}
PIPELINES: tuple[str, ...] = ("ccs", "cpac", "dparsf", "niak")
ROI_DERIVATIVES: tuple[str, ...] = (
    "rois_aal",
    "rois_cc200",
    "rois_cc400",
    "rois_dosenbach160",
    "rois_ez",
    "rois_ho",
    "rois_tt",
)
# Column counts known for certain; other atlases are checked against the file header.
ROI_COUNTS: dict[str, int] = {"rois_ho": 111, "rois_cc200": 200}
MIN_VOLUMES = 10
# The sites of the published federated ABIDE experiments (Li et al. 2020; FedBN 2021).
FEDBN_INSTITUTIONS: dict[str, tuple[str, ...]] = {
    "NYU": ("NYU",),
    "UM": ("UM_1",),
    "USM": ("USM",),
    "UCLA": ("UCLA_1",),
}
# Bump when the feature computation changes, so stale caches are not reused.
FEATURES_VERSION = "1"
_CACHE_DIRNAME = "cache"
_R_CLIP = 1.0 - 1e-7

ZeroRoiPolicy = Literal["zero", "impute", "drop_subject"]
_ZERO_ROI_POLICIES: tuple[str, ...] = get_args(ZeroRoiPolicy)


class DataFileError(ValueError):
    """A data file exists but cannot be used; the message names the file and the reason.

    Parameters
    ----------
    path : str or pathlib.Path
        The offending file.
    reason : str
        What is wrong with it, and what was expected.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


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


# --------------------------------------------------------------------------- layout


def strategy_name(*, band_pass_filtering: bool, global_signal_regression: bool) -> str:
    """Return the PCP strategy folder name, e.g. ``"filt_noglobal"``.

    Parameters
    ----------
    band_pass_filtering : bool
        Whether the band-pass filtered outputs are used.
    global_signal_regression : bool
        Whether the outputs with global signal regression are used.

    Returns
    -------
    str
        The folder name nilearn uses.
    """
    return (
        ("" if band_pass_filtering else "no")
        + "filt_"
        + ("" if global_signal_regression else "no")
        + "global"
    )


def roi_file_path(
    data_dir: str | Path,
    file_id: str,
    *,
    pipeline: str = "cpac",
    strategy: str = "filt_noglobal",
    derivative: str = "rois_ho",
) -> Path:
    """Return the path of one subject's ROI time-series file.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Directory that contains ``ABIDE_pcp/``.
    file_id : str
        The subject's ``FILE_ID``, e.g. ``"NYU_0050952"``.
    pipeline : str, default="cpac"
        Preprocessing pipeline folder.
    strategy : str, default="filt_noglobal"
        Strategy folder, see :func:`strategy_name`.
    derivative : str, default="rois_ho"
        ROI derivative.

    Returns
    -------
    pathlib.Path
        ``<data_dir>/ABIDE_pcp/<pipeline>/<strategy>/<file_id>_<derivative>.1D``.
    """
    return Path(data_dir) / DATASET_DIRNAME / pipeline / strategy / f"{file_id}_{derivative}.1D"


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


# ----------------------------------------------------------------------- phenotypes


def _phenotypic_path(data_dir: Path) -> Path:
    return data_dir / DATASET_DIRNAME / PHENOTYPIC_FILENAME


def read_phenotypic(
    data_dir: str | Path | None = None, *, quality_checked: bool = True
) -> pd.DataFrame:
    """Read the ABIDE phenotypic table and check it has the columns the loader needs.

    Parameters
    ----------
    data_dir : str or pathlib.Path or None, default=None
        Directory that contains ``ABIDE_pcp/``; resolved by
        :func:`fedbn_med.paths.resolve_data_dir` when None.
    quality_checked : bool, default=True
        When True the five ``qc_*`` columns are required too.

    Returns
    -------
    pandas.DataFrame
        The table as written, indexed by its unnamed first column when it has one.

    Raises
    ------
    FileNotFoundError
        If the table does not exist.
    ValueError
        If required columns are missing.
    """
    path = _phenotypic_path(resolve_data_dir(data_dir))
    if not path.is_file():
        raise FileNotFoundError(
            f"ABIDE phenotypic table not found: {path}. Expected the PCP release layout "
            f"<data_dir>/{DATASET_DIRNAME}/{PHENOTYPIC_FILENAME}; generate a built-in "
            "cohort with fedbn_med.data.ensure_cohort() or point data_dir at a PCP download."
        )
    with path.open(encoding="utf-8") as handle:
        first_field = handle.readline().split(",", 1)[0].strip().strip('"')
    # The release starts with an unnamed index column; accept a table without it too.
    table = pd.read_csv(path, index_col=0 if first_field == "" else None, low_memory=False)
    _check_columns(table, quality_checked=quality_checked, source=str(path))
    return table


def _check_columns(table: pd.DataFrame, *, quality_checked: bool, source: str) -> None:
    required = REQUIRED_COLUMNS + (QC_COLUMNS if quality_checked else ())
    missing = [c for c in required if c not in table.columns]
    if missing:
        hint = " (or pass quality_checked=False)" if set(missing) <= set(QC_COLUMNS) else ""
        raise ValueError(
            f"The phenotypic table {source} lacks required column(s): {', '.join(missing)}. "
            f"Expected at least: {', '.join(required)}{hint}."
        )


def select_subjects(
    phenotypic: pd.DataFrame,
    site_ids: str | Sequence[str],
    *,
    quality_checked: bool = True,
) -> pd.DataFrame:
    """Select the rows nilearn's ``fetch_abide_pcp`` would return for these sites.

    Parameters
    ----------
    phenotypic : pandas.DataFrame
        Table from :func:`read_phenotypic`.
    site_ids : str or sequence of str
        ABIDE ``SITE_ID`` values, e.g. ``("UM_1", "UM_2")``.
    quality_checked : bool, default=True
        Apply nilearn's QC filter: ``qc_rater_1 == "OK"``, ``qc_*_rater_2`` in
        ``{"OK", "maybe"}``, ``qc_*_rater_3 == "OK"``.

    Returns
    -------
    pandas.DataFrame
        Selected rows in table order.

    Raises
    ------
    ValueError
        If no site is given, a required column is missing, a site is not in the table, or
        a selected ``DX_GROUP`` is neither 1 nor 2.
    """
    ids = _as_site_ids(site_ids)
    _check_columns(phenotypic, quality_checked=quality_checked, source="given")
    known = sorted(str(s) for s in phenotypic["SITE_ID"].dropna().unique())
    unknown = [s for s in ids if s not in known]
    if unknown:
        raise ValueError(
            f"Unknown SITE_ID {', '.join(repr(s) for s in unknown)}. "
            f"Valid SITE_IDs in the phenotypic table: {', '.join(known)}."
        )
    keep = phenotypic["FILE_ID"].astype(str) != NO_FILENAME
    if quality_checked:
        for column, accepted in _QC_ACCEPTED.items():
            keep &= phenotypic[column].isin(accepted)
    keep &= phenotypic["SITE_ID"].isin(ids)
    selected = phenotypic.loc[keep.to_numpy()]
    bad_dx = selected.loc[~selected["DX_GROUP"].isin((1, 2)), "FILE_ID"]
    if len(bad_dx):
        raise ValueError(
            f"DX_GROUP must be 1 (ASD) or 2 (control); {len(bad_dx)} selected subject(s) "
            f"have another value: {', '.join(map(str, bad_dx.iloc[:10]))}."
        )
    return selected


def _as_site_ids(site_ids: str | Sequence[str]) -> tuple[str, ...]:
    ids = (site_ids,) if isinstance(site_ids, str) else tuple(site_ids)
    if not ids or not all(isinstance(s, str) and s for s in ids):
        raise ValueError(
            f"Expected one or more ABIDE SITE_ID strings (e.g. 'NYU', 'UM_1'), got {site_ids!r}."
        )
    return ids


def _check_choice(name: str, value: str, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ValueError(f"Unknown {name} {value!r}. Valid values: {', '.join(valid)}.")


def check_abide_files(
    data_dir: str | Path | None,
    site_ids: str | Sequence[str],
    *,
    pipeline: str = "cpac",
    band_pass_filtering: bool = True,
    global_signal_regression: bool = False,
    derivative: str = "rois_ho",
    quality_checked: bool = True,
) -> pd.DataFrame:
    """Select subjects as nilearn does and check that every selected file exists.

    Parameters
    ----------
    data_dir : str or pathlib.Path or None
        Directory that contains ``ABIDE_pcp/``; None resolves it as
        :func:`fedbn_med.paths.resolve_data_dir` does.
    site_ids : str or sequence of str
        ABIDE ``SITE_ID`` values.
    pipeline : str, default="cpac"
        One of ``"ccs"``, ``"cpac"``, ``"dparsf"``, ``"niak"``.
    band_pass_filtering : bool, default=True
        Use the band-pass filtered outputs (``filt_*``).
    global_signal_regression : bool, default=False
        Use the outputs with global signal regression (``*_global``).
    derivative : str, default="rois_ho"
        An ROI time-series derivative, e.g. ``"rois_ho"`` or ``"rois_cc200"``.
    quality_checked : bool, default=True
        Apply nilearn's quality-control filter.

    Returns
    -------
    pandas.DataFrame
        The selected phenotypic rows in table order, with a ``path`` column holding each
        subject's ROI file.

    Raises
    ------
    FileNotFoundError
        If the phenotypic table or any selected ROI file is missing (the first ten are
        named, with the count).
    ValueError
        For unknown sites, pipelines or derivatives and missing table columns.
    """
    _check_choice("pipeline", pipeline, PIPELINES)
    _check_choice("derivative", derivative, ROI_DERIVATIVES)
    root = resolve_data_dir(data_dir)
    selected = select_subjects(
        read_phenotypic(root, quality_checked=quality_checked),
        site_ids,
        quality_checked=quality_checked,
    )
    strategy = strategy_name(
        band_pass_filtering=band_pass_filtering, global_signal_regression=global_signal_regression
    )
    paths = [
        roi_file_path(root, str(fid), pipeline=pipeline, strategy=strategy, derivative=derivative)
        for fid in selected["FILE_ID"]
    ]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        shown = "\n  ".join(str(p) for p in missing[:10])
        more = f"\n  ... and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise FileNotFoundError(
            f"{len(missing)} of {len(paths)} ROI time-series file(s) selected for "
            f"SITE_ID {', '.join(_as_site_ids(site_ids))} are missing "
            f"({pipeline}/{strategy}/*_{derivative}.1D):\n  {shown}{more}\n"
            "nilearn would try to download them; fedbn_med reads ABIDE offline only."
        )
    return selected.assign(path=[str(p) for p in paths])


# ----------------------------------------------------------------------- ROI files


def read_roi_time_series(
    path: str | Path, *, n_rois: int | None = None
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Read and validate one PCP ``.1D`` ROI time-series file.

    Parameters
    ----------
    path : str or pathlib.Path
        The ``.1D`` file: an optional ``#<label>`` header line, then one row of
        whitespace-separated numbers per volume.
    n_rois : int or None, default=None
        Expected number of columns; None accepts what the header announces.

    Returns
    -------
    data : numpy.ndarray
        ``float64`` array ``(n_volumes, n_rois)``.
    labels : tuple of str
        ROI labels from the header (without ``#``), empty when there is no header.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    DataFileError
        If it is empty, has no or too few data rows, rows of unequal or unexpected
        length, text where numbers belong, or NaN/Inf values.
    """
    path = Path(path)
    labels = _read_header(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # numpy's "input contained no data"
            data = np.loadtxt(path, comments="#", dtype=np.float64, ndmin=2)
    except ValueError as exc:
        text = str(exc)
        if "number of columns changed" in text:
            reason = f"rows have unequal numbers of values ({text.split(';')[0]})."
        else:
            reason = f"text where numbers belong ({text})."
        raise DataFileError(path, reason) from exc
    return _check_series(path, data, labels, n_rois), labels


def _read_header(path: Path) -> tuple[str, ...]:
    """Return the header labels of a ``.1D`` file; raise if it is missing or empty."""
    if not path.is_file():
        raise FileNotFoundError(f"ROI time-series file not found: {path}")
    if path.stat().st_size == 0:
        raise DataFileError(path, "the file is empty (0 bytes); expected a '#<label>' header "
                            "line and one row of numbers per volume.")
    with path.open(encoding="utf-8", errors="replace") as handle:
        first = handle.readline()
    return tuple(tok.lstrip("#") for tok in first.split()) if first.startswith("#") else ()


def _check_series(
    path: Path, data: np.ndarray, labels: tuple[str, ...], n_rois: int | None
) -> np.ndarray:
    """Validate a parsed ``.1D`` array (shape, header agreement, finiteness)."""
    if data.size == 0:
        raise DataFileError(path, "no data rows after the header; expected one row per volume.")
    if data.ndim == 1:  # numpy's loadtxt squeezes a single row
        data = data[np.newaxis, :]
    n_volumes, n_columns = data.shape
    expected = n_rois if n_rois is not None else (len(labels) or None)
    if expected is not None and n_columns != expected:
        raise DataFileError(
            path, f"rows have {n_columns} values; expected {expected} (one per ROI)."
        )
    if labels and len(labels) != n_columns:
        raise DataFileError(
            path, f"the header names {len(labels)} ROIs but rows have {n_columns} values."
        )
    if n_volumes < MIN_VOLUMES:
        raise DataFileError(
            path, f"only {n_volumes} volume(s); at least {MIN_VOLUMES} are needed to estimate "
            "correlations."
        )
    finite = np.isfinite(data)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise DataFileError(
            path, f"{int((~finite).sum())} NaN/Inf value(s) (first at volume {row + 1}, "
            f"ROI column {col}); expected finite numbers."
        )
    return data


# ------------------------------------------------------------------------ features


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
    from nilearn.connectome import ConnectivityMeasure
    from sklearn.covariance import EmpiricalCovariance

    n_rois = {ts.shape[1] for ts in time_series}
    if len(n_rois) != 1:
        raise ValueError(
            f"Expected every subject to have the same ROI count, got {sorted(n_rois)}."
        )
    constant = np.stack([np.ptp(ts, axis=0) == 0 for ts in time_series])
    # Empirical covariance: plain Pearson correlation, as the federated ABIDE work used.
    measure = ConnectivityMeasure(
        kind="correlation",
        cov_estimator=EmpiricalCovariance(store_precision=False),
        standardize="zscore_sample",
    )
    # Threaded BLAS only slows these small products down (and fights other processes).
    with np.errstate(divide="ignore", invalid="ignore"), threadpool_limits(1, "blas"):
        matrices = measure.fit_transform(list(time_series))
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
    affected = constant.any(axis=1)
    keep = np.ones(len(features), dtype=bool)
    if not affected.any():
        return features, keep
    roi_idx = np.flatnonzero(constant.any(axis=0))
    names = ", ".join(roi_labels[i] if i < len(roi_labels) else f"column {i}" for i in roi_idx)
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


def _stat(path: Path) -> list[object]:
    info = path.stat()
    return [str(path), info.st_size, info.st_mtime_ns]


def _cache_key(root: Path, selected: pd.DataFrame, options: Mapping[str, object]) -> str:
    payload = {
        "version": FEATURES_VERSION,
        "options": dict(options),
        "phenotypic": _stat(_phenotypic_path(root)),
        "files": [_stat(Path(p)) for p in selected["path"]],
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _save_cache(path: Path, result: SiteFeatures, skipped: Sequence[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        "site": np.array(result.site),
        "features": result.features,
        "labels": result.labels,
        "subject_ids": np.asarray(result.subject_ids, dtype=np.int64),
        "file_ids": np.asarray(result.file_ids, dtype=str),
        "abide_site_ids": np.asarray(result.abide_site_ids, dtype=str),
        "mean_fd": result.mean_fd,
        "roi_labels": np.asarray(result.roi_labels, dtype=str),
        "skipped": np.asarray(skipped, dtype=str).reshape(-1, 2),
    }
    # Write beside the target, then rename: a reader never sees a half-written cache.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_cache(path: Path) -> tuple[SiteFeatures, list[tuple[str, str]]]:
    with np.load(path, allow_pickle=False) as data:
        result = SiteFeatures(
            site=str(data["site"]),
            features=data["features"],
            labels=data["labels"],
            subject_ids=tuple(int(s) for s in data["subject_ids"]),
            file_ids=tuple(str(s) for s in data["file_ids"]),
            abide_site_ids=tuple(str(s) for s in data["abide_site_ids"]),
            mean_fd=data["mean_fd"],
            roi_labels=tuple(str(s) for s in data["roi_labels"]),
        )
        skipped = [(str(a), str(b)) for a, b in data["skipped"]]
    return result, skipped


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


def _fetch_with_nilearn(
    root: Path, site_ids: tuple[str, ...], file_ids: list[str], options: Mapping[str, object]
) -> list[np.ndarray]:
    """Read the given subjects' ROI files through nilearn's ``fetch_abide_pcp``."""
    from nilearn.datasets import fetch_abide_pcp

    derivative = str(options["derivative"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # numpy's "input contained no data"
        bunch = fetch_abide_pcp(
            data_dir=str(root),
            pipeline=str(options["pipeline"]),
            band_pass_filtering=bool(options["band_pass_filtering"]),
            global_signal_regression=bool(options["global_signal_regression"]),
            derivatives=[derivative],
            quality_checked=bool(options["quality_checked"]),
            verbose=0,
            SITE_ID=list(site_ids),
            FILE_ID=list(file_ids),
        )
    fetched = [str(f) for f in bunch["phenotypic"]["FILE_ID"]]
    if fetched != file_ids:
        raise RuntimeError(
            f"nilearn's fetch_abide_pcp selected other subjects than the checked files for "
            f"SITE_ID {', '.join(site_ids)}: expected {len(file_ids)}, got {len(fetched)}."
        )
    return [np.asarray(ts, dtype=np.float64) for ts in bunch[derivative]]


def _read_site_series(
    root: Path,
    selected: pd.DataFrame,
    site_ids: tuple[str, ...],
    options: Mapping[str, object],
) -> tuple[list[int], list[np.ndarray], tuple[str, ...], list[tuple[str, str]]]:
    """Return the usable rows, their series, the ROI labels and the skipped files."""
    n_rois = ROI_COUNTS.get(str(options["derivative"]))
    paths = [Path(p) for p in selected["path"]]
    file_ids = [str(f) for f in selected["FILE_ID"]]
    bad: dict[int, str] = {}
    headers: dict[int, tuple[str, ...]] = {}
    for i, path in enumerate(paths):
        try:
            headers[i] = _read_header(path)
        except DataFileError as exc:
            bad[i] = exc.reason
    candidates = [i for i in range(len(paths)) if i not in bad]
    series: list[np.ndarray] = []
    if candidates:
        try:
            # Fast path: nilearn parses every file once and the arrays are checked after.
            series = _fetch_with_nilearn(root, site_ids, [file_ids[i] for i in candidates],
                                         options)
        except ValueError:
            # A file nilearn cannot parse: find it (and any other) file by file.
            for i in candidates:
                try:
                    read_roi_time_series(paths[i], n_rois=n_rois)
                except DataFileError as exc:
                    bad[i] = exc.reason
            candidates = [i for i in candidates if i not in bad]
            series = (_fetch_with_nilearn(root, site_ids, [file_ids[i] for i in candidates],
                                          options) if candidates else [])
    reference = next((i for i in candidates if headers[i]), None)
    labels = headers[reference] if reference is not None else ()
    reference_name = paths[reference].name if reference is not None else ""
    good: list[int] = []
    checked: list[np.ndarray] = []
    for i, data in zip(candidates, series, strict=True):
        try:
            checked_data = _check_series(paths[i], data, headers[i], n_rois)
            if headers[i] and headers[i] != labels:
                raise DataFileError(paths[i], "its header names other ROIs (or another order) "
                                    f"than {reference_name}.")
        except DataFileError as exc:
            bad[i] = exc.reason
            continue
        checked.append(checked_data)
        good.append(i)
    skipped = [(str(paths[i]), bad[i]) for i in sorted(bad)]
    for path, reason in skipped:
        logger.warning("Skipping %s: %s", path, reason)
    return good, checked, labels, skipped


def _compute_site_features(
    root: Path,
    selected: pd.DataFrame,
    site: str,
    site_ids: tuple[str, ...],
    options: Mapping[str, object],
) -> tuple[SiteFeatures, list[tuple[str, str]]]:
    """Validate files, read them through nilearn and compute features (no cache)."""
    good, series, roi_labels, skipped = _read_site_series(root, selected, site_ids, options)
    _check_bad_share(site, skipped, len(selected), float(options["max_bad_fraction"]))
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
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", site)
    cache_path = root / _CACHE_DIRNAME / f"abide_{safe}_{_cache_key(root, selected, options)}.npz"
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
