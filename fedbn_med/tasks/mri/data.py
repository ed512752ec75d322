"""The MRI task's data: built-in scanners or a site's datalist, read into 2D training slices.

Training items are volumes from which random axial slices are drawn each epoch;
validation and test items are each subject's whole central slab, scored slice by slice.
"""

from __future__ import annotations

from pathlib import Path

import torch
from monai.data import Dataset
from monai.transforms import (
    Compose,
    EnsureTyped,
    RandFlipd,
    RandSpatialCropSamplesd,
    Resized,
    ScaleIntensityRangePercentilesd,
    SpatialCropd,
    SqueezeDimd,
)

from fedbn_med.tasks.imaging import synth
from fedbn_med.tasks.imaging.datasets import ImageSiteData, make_dataset
from fedbn_med.tasks.imaging.readers import ReadImaged, load_datalist
from fedbn_med.tasks.imaging.settings import ImagingSettings
from fedbn_med.tasks.imaging.site_files import ImagingSite

__all__ = ["build_mri_data", "mri_transforms"]

_KEYS = ("image", "label")


def mri_transforms(settings: ImagingSettings, *, train: bool) -> Compose:
    """Return the MONAI chain: decode, resize, normalise, keep the central slab.

    For training, random axial slices are then drawn from the slab and flipped.
    """
    size = settings.image_size
    lo, hi = int(0.2 * size), int(0.8 * size)  # the slab where every tissue is present
    steps: list = [
        ReadImaged(_KEYS),
        Resized(_KEYS, spatial_size=(size, size, size), mode=("trilinear", "nearest")),
        ScaleIntensityRangePercentilesd("image", lower=0.5, upper=99.5, b_min=0.0,
                                        b_max=1.0, clip=True),
        SpatialCropd(_KEYS, roi_start=(0, 0, lo), roi_end=(size, size, hi)),
        EnsureTyped(_KEYS, dtype=torch.float32, track_meta=False),
    ]
    if train:
        steps += [
            RandSpatialCropSamplesd(_KEYS, roi_size=(size, size, 1),
                                    num_samples=settings.slices, random_size=False),
            SqueezeDimd(_KEYS, dim=-1),
            RandFlipd(_KEYS, prob=0.5, spatial_axis=0),
        ]
    return Compose(steps)


def build_mri_data(site: ImagingSite, settings: ImagingSettings, seed: int = 0,
                   data_dir: Path | None = None) -> ImageSiteData:
    """Return a site's datasets from its datalist (the built-in site when it names none)."""
    datalist = site.datalist or synth.ensure_mri_site(
        site.name, size=settings.image_size, subjects=settings.subjects, seed=seed,
        data_dir=data_dir)
    splits = load_datalist(datalist, split_seed=site.split_seed)

    def dataset(split: str, train: bool) -> Dataset:
        return make_dataset(splits[split], _KEYS, mri_transforms(settings, train=train),
                            cache=settings.cache, site=site.name)

    return ImageSiteData(dataset("training", True), dataset("validation", False),
                         dataset("test", False), (1, settings.image_size, settings.image_size))
