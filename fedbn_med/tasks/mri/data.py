"""The MRI task's data: built-in scanners or a site's datalist, read as 3D volumes.

In 3D mode (the default) training items are patches drawn from each volume around
tissue and background (``RandCropByPosNegLabeld``); in 2D mode random axial slices of
a central slab. Validation and test items are whole volumes (3D) or slabs (2D), which
the objective scores with a sliding window or slice by slice.
"""

from __future__ import annotations

from pathlib import Path

import torch
from monai.data import Dataset
from monai.transforms import (
    Compose,
    DeleteItemsd,
    EnsureTyped,
    FgBgToIndicesd,
    RandCropByPosNegLabeld,
    RandFlipd,
    RandSpatialCropSamplesd,
    Resized,
    ScaleIntensityRangePercentilesd,
    SpatialCropd,
    SqueezeDimd,
)

from fedbn_med.tasks.imaging import synth
from fedbn_med.tasks.imaging.build import cache_folder
from fedbn_med.tasks.imaging.datalist import ReadImaged
from fedbn_med.tasks.imaging.datasets import ImageSiteData, make_dataset, site_split
from fedbn_med.tasks.imaging.site_files import ImagingSite
from fedbn_med.tasks.mri.settings import Settings

__all__ = ["build_mri_data", "mri_transforms"]

_KEYS = ("image", "label")
_FG, _BG = "label_fg_indices", "label_bg_indices"


def _head(settings: Settings) -> list:
    """Decode, resize to the task's cube, normalise intensities to [0, 1]."""
    size = settings.image_size
    return [
        ReadImaged(_KEYS),
        Resized(_KEYS, spatial_size=(size, size, size), mode=("trilinear", "nearest")),
        ScaleIntensityRangePercentilesd("image", lower=0.5, upper=99.5, b_min=0.0,
                                        b_max=1.0, clip=True),
        EnsureTyped(_KEYS, dtype=torch.float32, track_meta=False),
    ]


def mri_transforms(settings: Settings, *, train: bool) -> Compose:
    """Return the MONAI chain of the settings' mode (3D patches or 2D slices).

    Everything up to the first random transform is deterministic, so that a cached
    dataset keeps it: in 3D that includes the foreground/background voxel indices the
    patch sampler draws from.
    """
    steps = _head(settings)
    if settings.mode == "3d":
        if not train:
            return Compose(steps)
        patch = (settings.patch,) * 3
        return Compose([
            *steps,
            FgBgToIndicesd("label", image_key="image", image_threshold=0.0),
            RandCropByPosNegLabeld(_KEYS, label_key="label", spatial_size=patch, pos=1.0,
                                   neg=1.0, num_samples=settings.patches,
                                   fg_indices_key=_FG, bg_indices_key=_BG),
            DeleteItemsd((_FG, _BG)),
            RandFlipd(_KEYS, prob=0.5, spatial_axis=0),
        ])
    size = settings.image_size
    lo, hi = int(0.2 * size), int(0.8 * size)  # the slab where every tissue is present
    steps.append(SpatialCropd(_KEYS, roi_start=(0, 0, lo), roi_end=(size, size, hi)))
    if train:
        steps += [
            RandSpatialCropSamplesd(_KEYS, roi_size=(size, size, 1),
                                    num_samples=settings.slices, random_size=False),
            SqueezeDimd(_KEYS, dim=-1),
            RandFlipd(_KEYS, prob=0.5, spatial_axis=0),
        ]
    return Compose(steps)


def build_mri_data(site: ImagingSite, settings: Settings, seed: int = 0,
                   data_dir: Path | None = None, *, fold: int = 0,
                   n_folds: int = 5) -> ImageSiteData:
    """Return a site's datasets for a run's seed and test fold.

    The site's datalist (the built-in site, generated from ``settings.data_seed``, when
    it names none) is split by :func:`~fedbn_med.tasks.imaging.datasets.site_split`.
    """
    datalist = site.datalist or synth.ensure_mri_site(
        site.name, size=settings.image_size, subjects=settings.subjects,
        seed=settings.data_seed, data_dir=data_dir)
    splits = site_split(datalist, site, builtin=site.datalist is None, seed=seed, fold=fold,
                        n_folds=n_folds)
    folder = cache_folder(settings, data_dir, site)

    def dataset(split: str, train: bool) -> Dataset:
        return make_dataset(splits[split], _KEYS, mri_transforms(settings, train=train),
                            cache=settings.cache_mode,  # type: ignore[arg-type]  # checked there
                            cache_dir=folder, site=site.name)

    return ImageSiteData(dataset("training", True), dataset("validation", False),
                         dataset("test", False), settings.input_shape())
