"""Write extracted ROI series as ABIDE Preprocessed files, plus a site TOML.

The output is what ``--data-dir`` reads::

    <out>/ABIDE_pcp/Phenotypic_V1_0b_preprocessed1.csv
    <out>/ABIDE_pcp/cpac/filt_noglobal/<FILE_ID>_rois_ho.1D
    <out>/ABIDE_pcp/fedbn_med_scans.json      what was done (source, cleaning, skipped)
    <out>/<SITE>.toml                          the site file (copy it into sites/)

The series always go to the ``filt_noglobal`` folder the loader reads; the manifest says
which cleaning actually ran (``--no-clean`` writes plain ROI means there). The five
``qc_*`` columns are ``OK`` for every written subject: they passed this module's checks,
not a human rater's.

Series computed on the stand-in atlas (no ``--atlas``) are marked in three places, so that
they are never taken for real ``rois_ho`` series: ``"atlas_stand_in": true`` in the
manifest, a ``rois_atlas`` column reading ``stand-in`` in the phenotypic table, and a
comment in the site file.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from fedbn_med.tasks.abide.cohort.writer import _write_1d, _write_phenotypic
from fedbn_med.tasks.abide.data.layout import (
    DATASET_DIRNAME,
    MISSING_VALUE,
    PHENOTYPIC_FILENAME,
    QC_COLUMNS,
)
from fedbn_med.tasks.abide.scans.atlas import STAND_IN
from fedbn_med.tasks.abide.scans.transforms import Cleaning

__all__ = ["SCANS_MANIFEST", "write_site"]

SCANS_MANIFEST = "fedbn_med_scans.json"
SCANS_VERSION = "1"


def write_site(out: str | Path, site: str, rows: Sequence[dict[str, object]],
               series: Sequence[np.ndarray], *, skipped: Sequence[tuple[str, str]],
               cleaning: Cleaning, source: Path, atlas: str, layout: str,
               institution: str = "") -> tuple[Path, Path]:
    """Write the PCP files of one site atomically; return the data folder and the TOML.

    Raises
    ------
    ValueError
        If ``out/ABIDE_pcp`` exists and was not written by this module.
    """
    root = Path(out).expanduser().absolute()
    target = root / DATASET_DIRNAME
    if target.exists() and not (target / SCANS_MANIFEST).is_file():
        raise ValueError(f"{target} exists and was not written by fmri_to_rois (no "
                         f"{SCANS_MANIFEST}); refusing to overwrite it. Use another --out.")
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{DATASET_DIRNAME}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        stand_in = atlas == STAND_IN
        series_dir = staging / "cpac" / "filt_noglobal"
        series_dir.mkdir(parents=True)
        table = []
        for row, roi in zip(rows, series, strict=True):
            _write_1d(series_dir / f"{row['FILE_ID']}_rois_ho.1D", roi)
            table.append({"SUB_ID": row["SUB_ID"], "SITE_ID": site, "FILE_ID": row["FILE_ID"],
                          "DX_GROUP": row["DX_GROUP"],
                          "AGE_AT_SCAN": row.get("AGE_AT_SCAN", MISSING_VALUE),
                          "SEX": row.get("SEX", MISSING_VALUE),
                          "func_mean_fd": row.get("func_mean_fd", MISSING_VALUE),
                          **dict.fromkeys(QC_COLUMNS, "OK"),
                          "participant_id": row.get("participant_id", row["FILE_ID"]),
                          "n_volumes": int(roi.shape[0]), "tr_s": row.get("_tr"),
                          "rois_atlas": "stand-in" if stand_in else Path(atlas).name})
        _write_phenotypic(staging / PHENOTYPIC_FILENAME, table)
        manifest = {"generator": "fedbn_med.tasks.abide.scans", "version": SCANS_VERSION,
                    "site": site, "source": str(source), "layout": layout,
                    "atlas": atlas, "atlas_stand_in": stand_in,
                    "cleaning": asdict(cleaning),
                    "cleaning_steps": cleaning.describe(), "global_signal_regression": False,
                    "written": [r["FILE_ID"] for r in rows],
                    "images": {str(r["FILE_ID"]): r.get("_image") for r in rows},
                    "skipped": [{"file": p, "reason": r} for p, r in skipped]}
        (staging / SCANS_MANIFEST).write_text(json.dumps(manifest, indent=2),
                                              encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    site_file = root / f"{site}.toml"
    site_file.write_text(_site_toml(site, root, source, institution, atlas == STAND_IN),
                         encoding="utf-8")
    return root, site_file


def _site_toml(site: str, data_dir: Path, source: Path, institution: str,
               stand_in: bool) -> str:
    warning = ("# STAND-IN ATLAS: these ROI series were computed on the built-in 6 mm stand-in,\n"
               "# not the Harvard-Oxford atlas of rois_ho; never federate them with real\n"
               "# rois_ho series (rerun fmri_to_rois.py with --atlas ho_mask_pad.nii.gz).\n"
               if stand_in else "")
    return (
        f"# Site configuration for {site}: written by pipelines/fmri_to_rois.py from\n"
        f"# {source}. Copy it into sites/ (or $FEDBN_MED_SITES) to use it.\n"
        f"{warning}"
        f"name = {json.dumps(site)}\n"
        f"institution = {json.dumps(institution)}\n"
        f"abide_site_ids = [{json.dumps(site)}]\n"
        "# The folder holding ABIDE_pcp/ with the extracted ROI series.\n"
        f"data_dir = {json.dumps(str(data_dir))}\n"
        "split_seed = 0\n"
        'device = "auto"\n'
    )
