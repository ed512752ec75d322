"""The label image the built-in scan site and ``fmri_to_rois`` use: real HO, or a stand-in.

A hospital extracting real scans passes the Harvard-Oxford image of PCP ``rois_ho``
(``ho_mask_pad.nii.gz`` from the ABIDE Preprocessed release, 3 mm, 111 labels) with
``--atlas``; the ROI columns are then exactly those of the release's ``rois_ho`` files.

The project does not ship that image (the ABIDE release's licence is not ours to
relicense). Without ``--atlas`` it builds a stand-in from facts in
``data/ho_atlas.csv``: each of the 111 labels, in ``.1D`` column order, becomes the 6 mm
voxels nearer to its MNI centroid than to any other centroid and within the radius of a
sphere of its volume. That is what the built-in scan site is generated on and extracted
with, and what the tests paint into; for real scans it is only a coarse approximation of
the atlas, so pass the real one. :func:`derive_atlas` makes a 6 mm copy of a real atlas
file for a hospital's own use.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import cast

import nibabel as nib
import numpy as np

from fedbn_med.tasks.abide.data.atlas import HO_CENTROIDS_MM, HO_LABELS, HO_N_VOXELS

__all__ = ["STAND_IN", "derive_atlas", "load_atlas"]

#: What the extraction manifest records when no atlas file was given.
STAND_IN = "built-in 6 mm stand-in from the HO centroids (pass --atlas for the real one)"

# The 6 mm MNI grid of the stand-in (x runs right to left, as in the PCP image).
_SHAPE = (33, 39, 32)
_AFFINE = np.array([[-6.0, 0.0, 0.0, 94.5], [0.0, 6.0, 0.0, -130.5],
                    [0.0, 0.0, 6.0, -69.5], [0.0, 0.0, 0.0, 1.0]])


def load_atlas(path: str | Path | None = None) -> nib.Nifti1Image:
    """Return the Harvard-Oxford label image at ``path``, else the built-in stand-in.

    Raises
    ------
    ValueError
        If the image is not 3D or its labels are not the 111 labels of ``rois_ho``.
    """
    if path is None:
        return _stand_in()
    return _checked(cast(nib.Nifti1Image, nib.load(str(path))), str(path))


@lru_cache(maxsize=1)
def _stand_in() -> nib.Nifti1Image:
    ijk = np.indices(_SHAPE).reshape(3, -1).T
    xyz = ijk @ _AFFINE[:3, :3].T + _AFFINE[:3, 3]
    dist = np.linalg.norm(xyz[:, None, :] - HO_CENTROIDS_MM[None, :, :], axis=2)
    radius = np.cbrt(3.0 * HO_N_VOXELS * 27.0 / (4.0 * np.pi))  # a 3 mm voxel is 27 mm^3
    nearest = dist.argmin(axis=1)
    inside = dist[np.arange(len(xyz)), nearest] <= radius[nearest]
    labels = np.asarray(HO_LABELS, dtype=np.int16)
    data = np.where(inside, labels[nearest], 0).astype(np.int16)
    # A small ROI that every voxel nearer to a neighbour took still gets the voxel at its
    # centroid, so all 111 columns exist (smallest ROIs placed last win a shared voxel).
    inverse = np.linalg.inv(_AFFINE)
    for index in np.argsort(-HO_N_VOXELS):
        if not (data == labels[index]).any():
            i, j, k = np.rint(inverse[:3, :3] @ HO_CENTROIDS_MM[index] + inverse[:3, 3])
            data.reshape(_SHAPE)[int(i), int(j), int(k)] = labels[index]
    return _checked(nib.Nifti1Image(data.reshape(_SHAPE), _AFFINE), STAND_IN)


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
    image = cast(nib.Nifti1Image, nib.load(str(source)))
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
