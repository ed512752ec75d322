"""The X-ray task's data: built-in hospitals or a site's datalist (DICOM, PNG, JPEG or NIfTI).

The built-in hospitals are synthetic *head* radiographs (line integrals through the
MNI152 head, with or without a bright nodule), not chest X-rays: they test the
federation on feature shift, not a clinical finding. Hospitals differ in exposure,
detector response, noise and storage; the label (nodule / no nodule) means the same
everywhere. Real chest sets (CheXpert, ChestX-ray14, MIMIC-CXR-JPG) come in through
``pipelines/image_datalists.py`` and a site file's ``datalist``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from monai.data import Dataset
from monai.transforms import (
    Compose,
    EnsureTyped,
    RandAffined,
    RandFlipd,
    Resized,
    ScaleIntensityRangePercentilesd,
)

from fedbn_med.tasks.imaging import synth
from fedbn_med.tasks.imaging.datalist import ReadImaged
from fedbn_med.tasks.imaging.datasets import ImageSiteData, make_dataset, site_split
from fedbn_med.tasks.imaging.settings import ImagingSettings
from fedbn_med.tasks.imaging.site_files import ImagingSite

__all__ = ["build_xray_data", "xray_transforms"]


def xray_transforms(settings: ImagingSettings, *, train: bool) -> Compose:
    """Return the MONAI chain: decode, resize, window to [0, 1]; then (training) augment."""
    size = settings.image_size
    steps: list = [
        ReadImaged("image"),
        Resized("image", spatial_size=(size, size), mode="bilinear"),
        ScaleIntensityRangePercentilesd("image", lower=0.5, upper=99.5, b_min=0.0,
                                        b_max=1.0, clip=True),
        EnsureTyped("image", dtype=torch.float32, track_meta=False),
    ]
    if train:
        steps += [
            RandAffined("image", prob=0.5, rotate_range=0.1, scale_range=0.08,
                        padding_mode="zeros"),
            RandFlipd("image", prob=0.5, spatial_axis=1),
        ]
    return Compose(steps)


def build_xray_data(site: ImagingSite, settings: ImagingSettings, seed: int = 0,
                    data_dir: Path | None = None, *, fold: int = 0,
                    n_folds: int = 5) -> ImageSiteData:
    """Return a hospital's datasets from its datalist (the built-in site when it names none).

    The split is the run's (seed, test fold), stratified by label (``site_split``).
    """
    datalist = site.datalist or synth.ensure_xray_site(
        site.name, size=settings.image_size, subjects=settings.subjects,
        seed=settings.data_seed, data_dir=data_dir)
    splits = site_split(datalist, site, builtin=site.datalist is None, seed=seed, fold=fold,
                        n_folds=n_folds, stratify="label")

    def dataset(split: str, train: bool) -> Dataset:
        return make_dataset(splits[split], ("image",), xray_transforms(settings, train=train),
                            cache=settings.cache, site=site.name)

    return ImageSiteData(dataset("training", True), dataset("validation", False),
                         dataset("test", False), (1, settings.image_size, settings.image_size))
