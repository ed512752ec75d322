"""The Harvard-Oxford atlas of PCP ``rois_ho``: labels, sizes, centroids and systems.

The table itself is package data (``ho_atlas.csv``): one row per ROI in ``.1D`` column
order, with its label, voxel count (3 mm) and MNI centroid x, y, z (mm), facts derived
from the PCP atlas image.
"""

from __future__ import annotations

import csv
import io
from importlib import resources

import numpy as np

__all__ = [
    "HO_CENTROIDS_MM",
    "HO_LABELS",
    "HO_N_VOXELS",
    "HO_SYSTEMS",
    "N_ROIS",
    "ZERO_ROI_INDEX",
    "ZERO_ROI_LABEL",
]

ATLAS_FILENAME = "ho_atlas.csv"
_COLUMNS = ("label", "n_voxels", "x_mm", "y_mm", "z_mm")


def _read_atlas() -> np.ndarray:
    text = resources.files(__package__).joinpath(ATLAS_FILENAME).read_text(encoding="utf-8")
    reader = csv.reader(io.StringIO(text))
    header = tuple(next(reader))
    if header != _COLUMNS:
        raise ValueError(f"{ATLAS_FILENAME} has columns {header}; expected {_COLUMNS}.")
    # float() of the stored decimal text: the same doubles the table always gave.
    return np.array([[float(v) for v in row] for row in reader], dtype=np.float64)


_ho = _read_atlas()
HO_LABELS: tuple[int, ...] = tuple(int(v) for v in _ho[:, 0])
HO_N_VOXELS: np.ndarray = _ho[:, 1].astype(np.int64)
HO_CENTROIDS_MM: np.ndarray = _ho[:, 2:].copy()
for _array in (HO_N_VOXELS, HO_CENTROIDS_MM):
    _array.setflags(write=False)
N_ROIS = len(HO_LABELS)
ZERO_ROI_LABEL = 3455
ZERO_ROI_INDEX = HO_LABELS.index(ZERO_ROI_LABEL)

# Coarse, hand-made assignment of regions to canonical systems (after Yeo et al. 2011);
# good enough to give the simulated connectome a block structure.
_SUBCORTICAL_SYSTEM = {10: "subcortical", 11: "subcortical", 12: "subcortical",
                       13: "subcortical", 26: "subcortical", 17: "limbic", 18: "limbic"}
_CORTICAL_SYSTEM = {
    "default": (1, 11, 12, 21, 25, 28, 30, 31),
    "salience": (2, 19, 29, 41),
    "control": (3, 4, 5, 6, 13, 20),
    "dorsal_attention": (16, 18, 22),
    "somatomotor": (7, 17, 26, 42, 43),
    "auditory": (9, 10, 44, 45, 46),
    "visual": (23, 24, 32, 36, 39, 40, 47, 48),
    "ventral_temporal": (14, 15, 37, 38),
    "limbic": (8, 27, 33, 34, 35),
}
_RIGHT_SUBCORTICAL = {49: 10, 50: 11, 51: 12, 52: 13, 53: 17, 54: 18, 58: 26}


def _system_of(label: int) -> str:
    if label == ZERO_ROI_LABEL:
        return "limbic"
    if label < 100:
        return _SUBCORTICAL_SYSTEM[_RIGHT_SUBCORTICAL.get(label, label)]
    index = label // 100
    return next(name for name, members in _CORTICAL_SYSTEM.items() if index in members)


def _homologue(label: int) -> int:
    if label < 100:
        left = _RIGHT_SUBCORTICAL.get(label)
        if left is not None:
            return left
        return next((right for right, left in _RIGHT_SUBCORTICAL.items() if left == label), -1)
    if label == ZERO_ROI_LABEL:
        return -1
    return label + 1 if label % 100 == 1 else label - 1


HO_SYSTEMS: tuple[str, ...] = tuple(_system_of(label) for label in HO_LABELS)
