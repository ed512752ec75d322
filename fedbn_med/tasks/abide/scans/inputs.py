"""Find a site's 4D BOLD images, their confounds, TR and diagnosis.

Two layouts are read:

- fMRIPrep-style derivatives (``dataset_description.json`` or ``sub-*`` folders)::

      participants.tsv
      sub-<label>/[ses-<label>/]func/sub-<label>_..._space-MNI152..._desc-preproc_bold.nii.gz
      sub-<label>/[ses-<label>/]func/sub-<label>_..._desc-confounds_timeseries.tsv
      sub-<label>/[ses-<label>/]func/sub-<label>_..._desc-preproc_bold.json

  ``participants.tsv`` has ``participant_id`` and a diagnosis column (``diagnosis``,
  ``dx``, ``dx_group`` or ``group``) whose values are :data:`ASD_VALUES` or
  :data:`CONTROL_VALUES` (any case); ``age`` and ``sex`` are used when present. One
  image per subject: the first in name order (other runs are logged and left out).
- ABIDE Preprocessed ``<FILE_ID>_func_preproc.nii.gz`` files, with a phenotypic CSV
  holding ``FILE_ID``, ``SUB_ID`` and ``DX_GROUP`` (already in MNI space; no confounds).

A problem with one subject (no diagnosis, an image not in MNI space) is kept on its
:class:`ScanInput` and reported when the site is extracted, like a broken file.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from fedbn_med.tasks.abide.data.layout import MISSING_VALUE
from fedbn_med.tasks.abide.data.roi_files import DataFileError

__all__ = [
    "ASD_VALUES",
    "CONTROL_VALUES",
    "DIAGNOSIS_COLUMNS",
    "MOTION_COLUMNS",
    "TISSUE_COLUMNS",
    "ScanInput",
    "find_scans",
    "image_tr",
    "read_confounds",
    "read_sidecar_tr",
]

logger = logging.getLogger(__name__)

ASD_VALUES = ("asd", "autism", "1")
CONTROL_VALUES = ("control", "td", "tc", "hc", "con", "2")
DIAGNOSIS_COLUMNS = ("diagnosis", "dx", "dx_group", "group")
MOTION_COLUMNS = ("trans_x", "trans_y", "trans_z", "rot_x", "rot_y", "rot_z")
TISSUE_COLUMNS = ("white_matter", "csf")
_BOLD = re.compile(r"^(?P<prefix>sub-[^_]+(?:_[a-z]+-[^_]+)*?)_desc-preproc_bold\.nii(\.gz)?$")


@dataclass(frozen=True)
class ScanInput:
    """One subject's image and what the PCP phenotypic table needs about it.

    Attributes
    ----------
    image : pathlib.Path
        The 4D BOLD image.
    file_id : str
        The PCP ``FILE_ID`` its ROI file will carry.
    sub_id : int
        The PCP ``SUB_ID``.
    dx_group : int
        1 (ASD) or 2 (control); 0 when unknown (then ``problem`` says why).
    confounds : pathlib.Path or None
        The confounds TSV, when there is one.
    sidecar : pathlib.Path or None
        The JSON sidecar, when there is one.
    phenotype : dict
        ``AGE_AT_SCAN``, ``SEX`` (1 male, 2 female) and ``participant_id`` when known.
    problem : tuple of (pathlib.Path, str) or None
        A file and what is wrong with this subject, found before reading the image.
    """

    image: Path
    file_id: str
    sub_id: int
    dx_group: int = 0
    confounds: Path | None = None
    sidecar: Path | None = None
    phenotype: dict[str, object] = field(default_factory=dict)
    problem: tuple[Path, str] | None = None


def find_scans(root: str | Path, site: str, *, phenotypic: str | Path | None = None
               ) -> tuple[Literal["fmriprep", "abide"], list[ScanInput]]:
    """Return the layout of ``root`` and one :class:`ScanInput` per subject.

    Raises
    ------
    FileNotFoundError
        If ``root`` is not a folder, or holds neither layout.
    ValueError
        If ``participants.tsv`` or the phenotypic CSV lacks the columns needed.
    """
    root = Path(root).expanduser().absolute()
    if not root.is_dir():
        raise FileNotFoundError(f"Scan folder not found: {root}.")
    if (root / "dataset_description.json").is_file() or any(root.glob("sub-*")):
        return "fmriprep", _find_fmriprep(root, site)
    if next(root.rglob("*_func_preproc.nii*"), None) is not None:
        return "abide", _find_abide(root, phenotypic)
    raise FileNotFoundError(
        f"{root} holds no scans: expected fMRIPrep derivatives (sub-<label>/func/"
        "*_space-MNI152*_desc-preproc_bold.nii.gz with participants.tsv) or ABIDE "
        "<FILE_ID>_func_preproc.nii.gz files with their phenotypic CSV.")


def _diagnosis(value: object) -> int:
    text = str(value).strip().lower()
    return 1 if text in ASD_VALUES else 2 if text in CONTROL_VALUES else 0


def _participants(root: Path) -> tuple[Path, pd.DataFrame, str]:
    path = root / "participants.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; expected participant_id and a diagnosis "
                                f"column ({', '.join(DIAGNOSIS_COLUMNS)}).")
    table = pd.read_csv(path, sep="\t", dtype=str, na_values=["n/a"])
    lower = {c.lower(): c for c in table.columns}
    dx = next((lower[c] for c in DIAGNOSIS_COLUMNS if c in lower), None)
    if "participant_id" not in table.columns or dx is None:
        raise ValueError(f"{path} has columns {list(table.columns)}; expected participant_id "
                         f"and a diagnosis column, one of {', '.join(DIAGNOSIS_COLUMNS)}.")
    return path, table.set_index("participant_id"), dx


def _sub_ids(labels: list[str]) -> dict[str, int]:
    if all(label.isdigit() for label in labels):
        return {label: int(label) for label in labels}
    return {label: i for i, label in enumerate(sorted(labels), start=1)}


def _find_fmriprep(root: Path, site: str) -> list[ScanInput]:
    ppath, participants, dx_column = _participants(root)
    per_subject: dict[str, list[Path]] = {}
    for path in sorted(root.glob("sub-*/**/func/*_desc-preproc_bold.nii*")):
        per_subject.setdefault(path.name.split("_", 1)[0], []).append(path)
    if not per_subject:
        raise FileNotFoundError(f"{root} has no sub-*/func/*_desc-preproc_bold.nii[.gz] image.")
    ids = _sub_ids([s.removeprefix("sub-") for s in per_subject])
    scans = []
    for subject, paths in per_subject.items():
        mni = [p for p in paths if re.search(r"_space-MNI", p.name)]
        image = (mni or paths)[0]
        if len(mni) > 1:
            logger.info("%s: using %s; %d other MNI run(s) left out.", subject, image.name,
                        len(mni) - 1)
        label = subject.removeprefix("sub-")
        problem = None
        if not mni:
            problem = (image, "not in MNI space (no space-MNI152* entity in the name); "
                              "expected fMRIPrep's MNI152 output, e.g. "
                              "--output-spaces MNI152NLin2009cAsym.")
        phenotype: dict[str, object] = {"participant_id": subject}
        dx = 0
        if subject not in participants.index:
            problem = problem or (image, f"{subject} is not in {ppath}; expected a row with "
                                         "its participant_id and diagnosis.")
        else:
            row = participants.loc[subject]
            dx = _diagnosis(row[dx_column])
            if not dx:
                problem = problem or (ppath, f"{subject} has {dx_column}={row[dx_column]!r}; "
                                      f"valid values: {', '.join(ASD_VALUES)} (ASD), "
                                      f"{', '.join(CONTROL_VALUES)} (control), any case.")
            phenotype |= _fmriprep_phenotype(row)
        match = _BOLD.match(image.name)
        prefix = match["prefix"] if match else image.name.split("_desc-")[0]
        kept = "_".join(e for e in prefix.split("_") if not e.startswith(("space-", "res-",
                                                                           "den-")))
        confounds = next((image.parent / f"{kept}_desc-confounds_{kind}.tsv" for kind in
                          ("timeseries", "regressors")
                          if (image.parent / f"{kept}_desc-confounds_{kind}.tsv").is_file()),
                         None)
        sidecar = image.parent / re.sub(r"\.nii(\.gz)?$", ".json", image.name)
        scans.append(ScanInput(image=image, file_id=f"{site}_{label}", sub_id=ids[label],
                               dx_group=dx, confounds=confounds,
                               sidecar=sidecar if sidecar.is_file() else None,
                               phenotype=phenotype, problem=problem))
    return scans


def _fmriprep_phenotype(row: pd.Series) -> dict[str, object]:
    lower = {str(k).lower(): v for k, v in row.items()}
    out: dict[str, object] = {}
    try:
        out["AGE_AT_SCAN"] = float(lower["age"])
    except (KeyError, TypeError, ValueError):
        pass
    sex = str(lower.get("sex", "")).strip().lower()
    if sex in ("m", "male", "1", "f", "female", "2"):
        out["SEX"] = 1 if sex in ("m", "male", "1") else 2
    return out


def _find_abide(root: Path, phenotypic: str | Path | None) -> list[ScanInput]:
    table_path = Path(phenotypic) if phenotypic else next(
        (p for p in sorted(root.rglob("*.csv"))
         if "FILE_ID" in p.read_text(encoding="utf-8", errors="replace")[:20000]), None)
    if table_path is None or not table_path.is_file():
        raise FileNotFoundError(f"No phenotypic CSV with a FILE_ID column in {root}; pass "
                                "--phenotypic Phenotypic_V1_0b_preprocessed1.csv.")
    table = pd.read_csv(table_path, low_memory=False)
    missing = [c for c in ("FILE_ID", "SUB_ID", "DX_GROUP") if c not in table.columns]
    if missing:
        raise ValueError(f"{table_path} lacks column(s) {', '.join(missing)}; expected the "
                         "PCP phenotypic table (FILE_ID, SUB_ID, DX_GROUP).")
    rows = table.set_index(table["FILE_ID"].astype(str))
    scans = []
    for image in sorted(root.rglob("*_func_preproc.nii*")):
        file_id = image.name.split("_func_preproc")[0]
        if file_id not in rows.index:
            scans.append(ScanInput(image=image, file_id=file_id, sub_id=0, problem=(
                image, f"FILE_ID {file_id} is not in {table_path}.")))
            continue
        row = rows.loc[file_id]
        dx = int(row["DX_GROUP"]) if row["DX_GROUP"] in (1, 2) else 0
        phenotype = {k: row[k] for k in ("AGE_AT_SCAN", "SEX", "func_mean_fd")
                     if k in row.index and row[k] != MISSING_VALUE}
        scans.append(ScanInput(
            image=image, file_id=file_id, sub_id=int(row["SUB_ID"]), dx_group=dx,
            phenotype=phenotype, problem=None if dx else (
                table_path, f"{file_id} has DX_GROUP={row['DX_GROUP']!r}; expected 1 or 2.")))
    return scans


def read_confounds(path: Path, n_volumes: int) -> tuple[np.ndarray, list[str], float]:
    """Return the nuisance regressors, their names and the mean framewise displacement.

    Raises
    ------
    DataFileError
        If the file lacks the motion columns, has fewer rows than ``n_volumes``, or
        NaN in a regressor.
    """
    try:
        table = pd.read_csv(path, sep="\t", na_values=["n/a"])
    except (OSError, ValueError) as exc:
        raise DataFileError(path, f"not a readable TSV ({exc}).") from exc
    missing = [c for c in MOTION_COLUMNS if c not in table.columns]
    if missing:
        raise DataFileError(path, f"lacks the motion column(s) {', '.join(missing)}; expected "
                            f"fMRIPrep's {', '.join(MOTION_COLUMNS)}.")
    if len(table) < n_volumes:
        raise DataFileError(path, f"has {len(table)} rows; the image has {n_volumes} volumes "
                            "(one row per volume expected).")
    columns = [*MOTION_COLUMNS, *(c for c in TISSUE_COLUMNS if c in table.columns)]
    values = table[columns].to_numpy(dtype=np.float64)[:n_volumes]
    if not np.isfinite(values).all():
        raise DataFileError(path, "NaN in a regressor column "
                            f"({', '.join(columns)}); expected numbers in every row.")
    fd = (pd.to_numeric(table["framewise_displacement"], errors="coerce").iloc[:n_volumes]
          .mean() if "framewise_displacement" in table.columns else float("nan"))
    return values, columns, float(fd)


def read_sidecar_tr(path: Path | None) -> float | None:
    """Return ``RepetitionTime`` from a JSON sidecar, or None when absent."""
    if path is None:
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("RepetitionTime")
    except (OSError, ValueError) as exc:
        raise DataFileError(path, f"not readable JSON ({exc}).") from exc
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not value > 0:
        raise DataFileError(path, f"RepetitionTime is {value!r}; expected seconds > 0.")
    return float(value)


def image_tr(sidecar: Path | None, header: object) -> float | None:
    """Return the TR in seconds: the sidecar's ``RepetitionTime``, else ``pixdim[4]``."""
    tr = read_sidecar_tr(sidecar)
    if tr is not None:
        return tr
    zooms = header.get_zooms()  # type: ignore[attr-defined]
    if len(zooms) < 4 or not np.isfinite(zooms[3]) or zooms[3] <= 0:
        return None
    unit = header.get_xyzt_units()[1]  # type: ignore[attr-defined]
    return float(zooms[3]) * {"msec": 1e-3, "usec": 1e-6}.get(unit, 1.0)
