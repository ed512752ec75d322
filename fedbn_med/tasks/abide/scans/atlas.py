"""The Harvard-Oxford label image of PCP ``rois_ho``, at 6 mm, shipped as package data.

``ho_atlas_6mm.nii.gz`` (about 5 KB) is derived from the PCP release's
``ho_mask_pad.nii.gz`` (3 mm, 65 x 77 x 63, 111 labels) by :func:`derive_atlas`: each
6 mm voxel covers 2 x 2 x 2 of the 3 mm voxels and takes their most frequent label when
at least half of them are labelled; a label that no 6 mm voxel would keep (the 2-voxel
label 3455, for one) takes the voxel holding most of its 3 mm voxels. Every one of the
111 labels survives, in the ``.1D`` column order of :data:`HO_LABELS`. A hospital that has
the release's own file can pass it instead (``--atlas``); the ROI columns are the same.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import nibabel as nib
import numpy as np

from fedbn_med.tasks.abide.cohort.atlas import HO_LABELS

__all__ = ["ATLAS_FILENAME", "derive_atlas", "load_atlas"]

ATLAS_FILENAME = "ho_atlas_6mm.nii.gz"


def load_atlas(path: str | Path | None = None) -> nib.Nifti1Image:
    """Return the Harvard-Oxford label image: ``path``, else the shipped 6 mm one.

    Raises
    ------
    ValueError
        If the image is not 3D or its labels are not the 111 labels of ``rois_ho``.
    """
    if path is None:
        return _shipped()
    return _checked(nib.load(str(path)), str(path))


@lru_cache(maxsize=1)
def _shipped() -> nib.Nifti1Image:
    with resources.as_file(resources.files(__package__).joinpath(ATLAS_FILENAME)) as file:
        image = nib.load(str(file))
        return _checked(nib.Nifti1Image(np.asarray(image.dataobj), image.affine), ATLAS_FILENAME)


def _checked(image: nib.Nifti1Image, source: str) -> nib.Nifti1Image:
    data = np.asarray(image.dataobj)
    if data.ndim != 3:
        raise ValueError(f"Atlas {source}: expected a 3D label image, got shape {data.shape}.")
    labels = tuple(int(v) for v in np.unique(data) if v != 0)
    if labels != HO_LABELS:
        missing = sorted(set(HO_LABELS) - set(labels))
        extra = sorted(set(labels) - set(HO_LABELS))
        raise ValueError(
            f"Atlas {source}: expected the 111 Harvard-Oxford labels of rois_ho; "
            f"missing {missing[:10]}, unexpected {extra[:10]}."
        )
    return nib.Nifti1Image(data.astype(np.int16), image.affine)


def derive_atlas(source: str | Path, out: str | Path, factor: int = 2) -> Path:
    """Write a coarser copy of a label image in which every label keeps a voxel.

    Parameters
    ----------
    source : str or pathlib.Path
        The PCP ``ho_mask_pad.nii.gz``.
    out : str or pathlib.Path
        The file to write (``.nii.gz``).
    factor : int, default=2
        Voxels per block edge (2: 3 mm to 6 mm).

    Returns
    -------
    pathlib.Path
        ``out``.
    """
    image = nib.load(str(source))
    fine = np.asarray(image.dataobj).astype(np.int64)
    pad = [(0, (-n) % factor) for n in fine.shape]
    fine = np.pad(fine, pad)
    shape = tuple(n // factor for n in fine.shape)
    blocks = fine.reshape(shape[0], factor, shape[1], factor, shape[2], factor)
    blocks = blocks.transpose(0, 2, 4, 1, 3, 5).reshape(*shape, factor**3)
    coarse = np.zeros(shape, dtype=np.int16)
    labelled = (blocks > 0).sum(-1)
    counts = {label: (blocks == label).sum(-1) for label in HO_LABELS}
    stacked = np.stack([counts[label] for label in HO_LABELS], axis=-1)
    best = np.asarray(HO_LABELS)[stacked.argmax(-1)]
    keep = labelled * 2 >= factor**3
    coarse[keep] = best[keep]
    for label in HO_LABELS:  # smallest first would be fairer; collisions are rare
        if not (coarse == label).any():
            coarse[np.unravel_index(counts[label].argmax(), shape)] = label
    affine = image.affine.copy()
    # The block's centre: the mean of its first and last fine voxel centres.
    affine[:3, 3] = image.affine[:3, :3] @ np.full(3, (factor - 1) / 2) + image.affine[:3, 3]
    affine[:3, :3] = image.affine[:3, :3] * factor
    result = nib.Nifti1Image(coarse, affine)
    result.header.set_xyzt_units("mm")
    result.set_sform(affine, code=4)
    result.set_qform(affine, code=4)
    _checked(result, str(out))
    nib.save(result, str(out))
    return Path(out)
