"""Where ABIDE Preprocessed (PCP) keeps its files, and which subjects a site selects.

The release layout is the one :func:`nilearn.datasets.fetch_abide_pcp` reads::

    <data_dir>/ABIDE_pcp/Phenotypic_V1_0b_preprocessed1.csv
    <data_dir>/ABIDE_pcp/<pipeline>/<strategy>/<FILE_ID>_<derivative>.1D

Subjects are selected as nilearn selects them (rows with ``FILE_ID == "no_filename"``
dropped, then the quality-control filter over the five ``qc_*`` columns, then the
``SITE_ID`` filter). Before nilearn is called, every selected file is checked here: a
missing file raises :class:`FileNotFoundError` naming it (nilearn would try to download
it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from fedbn_med.paths import resolve_data_dir

__all__ = [
    "COHORT_MANIFEST_FILENAME",
    "DATASET_DIRNAME",
    "FEDBN_INSTITUTIONS",
    "MISSING_VALUE",
    "NO_FILENAME",
    "PHENOTYPIC_FILENAME",
    "PIPELINES",
    "QC_COLUMNS",
    "REQUIRED_COLUMNS",
    "ROI_DERIVATIVES",
    "check_abide_files",
    "read_phenotypic",
    "roi_file_path",
    "select_subjects",
    "strategy_name",
]

DATASET_DIRNAME = "ABIDE_pcp"
#: The manifest a generated built-in cohort keeps in ``ABIDE_pcp/`` (its parameters).
COHORT_MANIFEST_FILENAME = "fedbn_med_cohort.json"
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
# The sites of the published federated ABIDE experiments (Li et al. 2020; FedBN 2021).
FEDBN_INSTITUTIONS: dict[str, tuple[str, ...]] = {
    "NYU": ("NYU",),
    "UM": ("UM_1",),
    "USM": ("USM",),
    "UCLA": ("UCLA_1",),
}


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
        If the table is empty, is not a CSV file, or lacks required columns.
    """
    path = _phenotypic_path(resolve_data_dir(data_dir))
    if not path.is_file():
        raise FileNotFoundError(
            f"ABIDE phenotypic table not found: {path}. Expected the PCP release layout "
            f"<data_dir>/{DATASET_DIRNAME}/{PHENOTYPIC_FILENAME}; generate a built-in "
            "cohort with fedbn_med.tasks.abide.cohort.ensure_cohort() or point data_dir at "
            "a PCP download."
        )
    expected = ("Expected the PCP phenotypic CSV: a header line with at least "
                f"{', '.join(REQUIRED_COLUMNS)} (and an unnamed index column first), then one "
                "row per subject")
    try:
        with path.open(encoding="utf-8") as handle:
            first_field = handle.readline().split(",", 1)[0].strip().strip('"')
        # The release starts with an unnamed index column; accept a table without it too.
        table = pd.read_csv(path, index_col=0 if first_field == "" else None, low_memory=False)
    except pd.errors.EmptyDataError as err:
        raise ValueError(f"The phenotypic table {path} is empty. {expected}.") from err
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ValueError(f"The phenotypic table {path} is not a readable CSV file "
                         f"({_one_line(err)}). {expected}.") from err
    _check_columns(table, quality_checked=quality_checked, source=str(path))
    return table


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:200] if lines else type(err).__name__


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
