"""Small fMRIPrep-style derivatives for the scan tests, painted into the shipped atlas."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd

from fedbn_med.tasks.abide.data.atlas import HO_LABELS
from fedbn_med.tasks.abide.scans.atlas import load_atlas
from fedbn_med.tasks.abide.scans.inputs import MOTION_COLUMNS

SPACE = "MNI152NLin2009cAsym"


def roi_series(rng: np.random.Generator, n_volumes: int) -> np.ndarray:
    """Return correlated ROI series (volumes x 111): a few shared factors plus noise."""
    factors = rng.standard_normal((n_volumes, 5))
    return 100.0 + 10.0 * (factors @ rng.normal(0, 1, (5, len(HO_LABELS)))
                           + rng.standard_normal((n_volumes, len(HO_LABELS))))


def paint(series: np.ndarray, noise: float = 0.0, rng: np.random.Generator | None = None
          ) -> nib.Nifti1Image:
    """Return a 4D image on the atlas grid whose voxels carry their ROI's series."""
    atlas = load_atlas()
    labels = np.asarray(atlas.dataobj)
    voxels = np.flatnonzero(labels > 0)
    roi_of = np.searchsorted(HO_LABELS, labels.ravel()[voxels])
    volume = np.zeros((labels.size, series.shape[0]), dtype=np.float32)
    values = series[:, roi_of].T
    if noise:
        values = values + noise * (rng or np.random.default_rng(0)).standard_normal(
            values.shape)
    volume[voxels] = values
    image = nib.Nifti1Image(volume.reshape(*labels.shape, -1), atlas.affine)
    image.header.set_xyzt_units("mm", "sec")
    return image


def bold_path(root: Path, label: str) -> Path:
    """Return the path of a subject's preprocessed BOLD image."""
    name = f"sub-{label}_task-rest_space-{SPACE}_desc-preproc_bold.nii.gz"
    return root / f"sub-{label}" / "func" / name


def make_derivatives(root: Path, series: list[np.ndarray], *, tr: float = 2.0,
                     noise: float = 0.0) -> Path:
    """Write fMRIPrep-style derivatives: one subject per series, alternating ASD/TD."""
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_description.json").write_text(json.dumps(
        {"Name": "test", "BIDSVersion": "1.8.0", "DatasetType": "derivative"}))
    rows = []
    for i, ts in enumerate(series):
        label = f"{i + 1:02d}"
        path = bold_path(root, label)
        path.parent.mkdir(parents=True)
        nib.save(paint(ts, noise, rng), str(path))
        path.with_name(path.name.replace(".nii.gz", ".json")).write_text(
            json.dumps({"RepetitionTime": tr}))
        confounds = pd.DataFrame(rng.normal(0, 0.1, (len(ts), 6)), columns=list(MOTION_COLUMNS))
        confounds["white_matter"] = rng.normal(400, 1, len(ts))
        confounds["csf"] = rng.normal(900, 1, len(ts))
        confounds["framewise_displacement"] = np.r_[np.nan, rng.uniform(0.05, 0.2, len(ts) - 1)]
        confounds.to_csv(path.parent / f"sub-{label}_task-rest_desc-confounds_timeseries.tsv",
                         sep="\t", index=False, na_rep="n/a")
        rows.append({"participant_id": f"sub-{label}", "diagnosis": "ASD" if i % 2 else "TD",
                     "age": 10 + i, "sex": "M"})
    pd.DataFrame(rows).to_csv(root / "participants.tsv", sep="\t", index=False)
    return root
