"""The built-in scan site: fMRIPrep-style 4D BOLD images drawn from the cohort model.

A new hospital (``sites/CITY.toml``, SITE_ID ``CITY``) with a scanner of its own: its
subjects' ROI signals come from the cohort's signal model (:mod:`..cohort.signal`, same
template as the training sites, a scanner drawn for this site) and are painted into the
6 mm Harvard-Oxford grid, each voxel carrying its ROI's signal, voxel noise, a linear
drift, head-motion artefacts (six motion parameters, written to the confounds file with
framewise displacement) and white-matter and CSF fluctuations (also in the confounds).
Images are stored as ``int16`` NIfTI with a scale factor, as scanners store them. At the
defaults (48 subjects, 150 volumes, TR 2.5 s) the folder is about 70 MB and takes a few
seconds to write; :func:`ensure_scan_site` then extracts it once (about 20 s on 2 cores)
and returns the folder holding ``ABIDE_pcp/``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import uuid
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from fedbn_med.paths import resolve_data_dir
from fedbn_med.tasks.abide.cohort.figures import SiteFigures
from fedbn_med.tasks.abide.cohort.signal import (
    _ar1,
    _build_scanner,
    _build_template,
    _site_seed,
    _subject_series,
)
from fedbn_med.tasks.abide.data.atlas import HO_LABELS
from fedbn_med.tasks.abide.scans.atlas import load_atlas
from fedbn_med.tasks.abide.scans.inputs import MOTION_COLUMNS
from fedbn_med.tasks.abide.scans.writer import SCANS_MANIFEST

__all__ = ["BUILTIN_SCAN_FIGURES", "ensure_scan_site", "generate_scan_site"]

logger = logging.getLogger(__name__)

BUILTIN_VERSION = "3"  # 2: drawn on the stand-in atlas; 3: cohort signal version 2
_MANIFEST = "fedbn_med_bids.json"
_SPACE = "MNI152NLin2009cAsym"

#: The built-in scan site's own figures (a hospital ABIDE never saw).
BUILTIN_SCAN_FIGURES = SiteFigures(
    site_id="CITY", file_prefix="CITY", first_sub_id=1, n_no_filename=0, n_asd=24,
    n_control=24, n_asd_qc=24, n_control_qc=24, age_mean=14.5, age_sd=3.5, age_min=8.0,
    age_max=25.0, female_fraction=0.2, fd_median_asd=0.11, fd_median_control=0.07,
    fd_log_sd=0.6, n_volumes=150, tr_s=2.5)


def generate_scan_site(out: str | Path, *, site_id: str = "CITY", seed: int = 0,
                       site_effect: float = 1.0, n_subjects: int | None = None,
                       n_volumes: int | None = None) -> Path:
    """Write the built-in scan site's fMRIPrep-style derivatives into ``out``, if needed.

    Parameters
    ----------
    out : str or pathlib.Path
        The derivatives folder to write (``dataset_description.json``, ``sub-*``).
    site_id : str
        Name of the site (seeds its scanner).
    seed, site_effect : int, float
        As for the built-in cohort; the same seed gives the same template.
    n_subjects, n_volumes : int, optional
        Fewer subjects or volumes (tests, benchmarks); default 48 and 150.

    Returns
    -------
    pathlib.Path
        ``out``.
    """
    figures = BUILTIN_SCAN_FIGURES
    n_subjects = n_subjects or figures.n_subjects
    n_volumes = n_volumes or figures.n_volumes
    if n_subjects < 4 or n_volumes < 10:
        raise ValueError(f"Expected n_subjects >= 4 and n_volumes >= 10, got {n_subjects} "
                         f"and {n_volumes}.")
    params = {"generator": "fedbn_med.tasks.abide.scans.builtin", "version": BUILTIN_VERSION,
              "site_id": site_id, "seed": seed, "site_effect": float(site_effect),
              "n_subjects": n_subjects, "n_volumes": n_volumes}
    root = Path(out).expanduser().absolute()
    manifest = root / _MANIFEST
    if manifest.is_file() and json.loads(manifest.read_text(encoding="utf-8")) == params:
        return root
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} exists and holds something else than these built-in scans "
                         f"({params}); use an empty folder.")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = root.parent / f".{root.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        with threadpool_limits(1, "blas"):
            _write_site(staging, site_id, seed, site_effect, n_subjects, n_volumes)
        (staging / _MANIFEST).write_text(json.dumps(params), encoding="utf-8")
        if root.exists():
            root.rmdir()
        staging.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def _write_site(root: Path, site_id: str, seed: int, site_effect: float, n_subjects: int,
                n_volumes: int) -> None:
    figures = BUILTIN_SCAN_FIGURES
    template = _build_template(seed)
    scanner = _build_scanner(template, figures, seed, site_effect)
    tr = scanner.tr_s
    atlas = load_atlas()
    labels = np.asarray(atlas.dataobj)
    voxels = np.flatnonzero(labels > 0)
    roi_of = np.searchsorted(HO_LABELS, labels.ravel()[voxels])
    rng = np.random.default_rng([seed, _site_seed(site_id), 7])
    gain = rng.lognormal(0.0, 0.2, voxels.size)
    base = 500.0 + 150.0 * rng.random(voxels.size)
    (root / "dataset_description.json").write_text(json.dumps({
        "Name": f"fedbn_med built-in scan site {site_id}", "BIDSVersion": "1.8.0",
        "DatasetType": "derivative",
        "GeneratedBy": [{"Name": "fedbn_med.tasks.abide.scans.builtin"}]}, indent=2))
    participants = []
    for i in range(n_subjects):
        label = f"{i + 1:04d}"
        asd = i % 2 == 0
        srng = np.random.default_rng([seed, _site_seed(site_id), 8, i])
        fd = math.exp(math.log(scanner.fd_median[int(asd)]) + scanner.fd_log_sd *
                      srng.standard_normal())
        roi = _subject_series(template, scanner, srng, asd=asd, mean_fd=fd,
                              n_volumes=n_volumes)
        motion = np.cumsum(srng.normal(0.0, fd / 4.8, (n_volumes, 6)) *
                           np.array([1, 1, 1, 0.02, 0.02, 0.02]), axis=0)
        phi = math.exp(-tr / 4.0)
        tissue = _ar1(srng, n_volumes, 2, phi) * 4.0
        scale = float(np.std(roi))
        series = (roi[:, roi_of] * gain + base
                  + scale * srng.standard_normal((n_volumes, voxels.size))
                  + (motion * [1, 1, 1, 50, 50, 50]) @ srng.normal(0.0, 3.0, (6, voxels.size))
                  + tissue @ srng.normal(1.0, 0.5, (2, voxels.size))
                  + np.linspace(-1.0, 1.0, n_volumes)[:, None] * srng.normal(0, 5, voxels.size))
        volume = np.zeros((labels.size, n_volumes), dtype=np.float32)
        volume[voxels] = series.T
        image = nib.Nifti1Image(volume.reshape(*labels.shape, n_volumes), atlas.affine)
        image.header.set_data_dtype(np.int16)
        image.header.set_xyzt_units("mm", "sec")
        image.header.set_zooms((*atlas.header.get_zooms()[:3], tr))
        image.set_sform(atlas.affine, code=4)
        image.set_qform(atlas.affine, code=4)
        func = root / f"sub-{label}" / "func"
        func.mkdir(parents=True)
        stem = f"sub-{label}_task-rest"
        nib.save(image, str(func / f"{stem}_space-{_SPACE}_desc-preproc_bold.nii.gz"))
        (func / f"{stem}_space-{_SPACE}_desc-preproc_bold.json").write_text(
            json.dumps({"RepetitionTime": tr, "TaskName": "rest", "SkullStripped": True}))
        deltas = np.abs(np.diff(motion, axis=0))
        frame_fd = deltas[:, :3].sum(1) + 50.0 * deltas[:, 3:].sum(1)
        confounds = pd.DataFrame(motion, columns=list(MOTION_COLUMNS))
        confounds["white_matter"] = tissue[:, 0] + 400.0
        confounds["csf"] = tissue[:, 1] + 900.0
        confounds["framewise_displacement"] = np.r_[np.nan, frame_fd]
        confounds.to_csv(func / f"{stem}_desc-confounds_timeseries.tsv", sep="\t",
                         index=False, na_rep="n/a", float_format="%.6f")
        participants.append({"participant_id": f"sub-{label}",
                             "diagnosis": "ASD" if asd else "TD",
                             "age": round(float(np.clip(srng.normal(figures.age_mean,
                                                                    figures.age_sd),
                                                        figures.age_min, figures.age_max)), 2),
                             "sex": "F" if srng.random() < figures.female_fraction else "M"})
    pd.DataFrame(participants).to_csv(root / "participants.tsv", sep="\t", index=False)


def ensure_scan_site(site_id: str = "CITY", data_dir: str | Path | None = None, *,
                     seed: int = 0, site_effect: float = 1.0) -> Path:
    """Return the folder holding the built-in scan site's ``ABIDE_pcp/``, made if needed.

    The derivatives are generated under ``<data_dir>/scans/<site>-.../bids`` and their ROI
    series extracted, with the default cleaning, to ``.../rois`` on first use.
    """
    from fedbn_med.tasks.abide.scans.extract import extract_site

    base = (resolve_data_dir(data_dir) / "scans" /
            f"{site_id}-seed{seed}-effect{site_effect:g}-v{BUILTIN_VERSION}")
    rois = base / "rois"
    if not (rois / "ABIDE_pcp" / SCANS_MANIFEST).is_file():
        bids = generate_scan_site(base / "bids", site_id=site_id, seed=seed,
                                  site_effect=site_effect)
        extract_site(bids, rois, site=site_id,
                     institution="City Hospital (fedbn_med built-in scan site)")
    return rois
