"""Task ``"xray"``: finding / no finding on radiographs across hospitals, MONAI ``DenseNet121``.

Hospitals differ in exposure, detector response, noise and storage (DICOM, PNG, NIfTI);
the finding (a bright nodule) means the same everywhere. Scores per site: ROC AUC,
accuracy, balanced accuracy, F1. Under FedBN the DenseNet's batch-norm layers
(``features.norm0``, ``...norm1``, ...) stay at their hospital.
"""

from __future__ import annotations

from pathlib import Path

import torch
from monai.data import Dataset
from monai.networks.nets import DenseNet121
from monai.transforms import (
    Compose,
    EnsureTyped,
    RandAffined,
    RandFlipd,
    Resized,
    ScaleIntensityRangePercentilesd,
)
from torch import nn

from fedbn_med.experiment import ExperimentConfig
from fedbn_med.imaging import synth
from fedbn_med.imaging.federate import ImagingSettings, site_data
from fedbn_med.imaging.readers import ReadImaged, load_datalist
from fedbn_med.imaging.sites import ImagingSite, load_imaging_site
from fedbn_med.imaging.trainer import ClassificationTrainer, ImageSiteData, make_dataset
from fedbn_med.tasks import Task, register_task

__all__ = [
    "XRAY_DEFAULTS",
    "XRAY_SITES",
    "XRAY_TASK",
    "build_xray_data",
    "build_xray_model",
    "build_xray_site",
    "xray_transforms",
]

XRAY_SITES = ("HospitalA", "HospitalB", "HospitalC")
XRAY_DEFAULTS = ImagingSettings(image_size=64, subjects=48)


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


def build_xray_model(config: ExperimentConfig, input_shape: tuple[int, ...] = (1, 64, 64)
                     ) -> nn.Module:
    """Build the 2D DenseNet121 (batch norm) with the run's seed, identical at every site."""
    torch.manual_seed(config.seed)
    return DenseNet121(spatial_dims=2, in_channels=int(input_shape[0]), out_channels=2)


def build_xray_data(site: ImagingSite, settings: ImagingSettings, seed: int = 0,
                    data_dir: Path | None = None) -> ImageSiteData:
    """Return a hospital's datasets from its datalist (the built-in site when it names none)."""
    datalist = site.datalist or synth.ensure_xray_site(
        site.name, size=settings.image_size, subjects=settings.subjects, seed=seed,
        data_dir=data_dir)
    splits = load_datalist(datalist, split_seed=site.split_seed)

    def dataset(split: str, train: bool) -> Dataset:
        return make_dataset(splits[split], ("image",), xray_transforms(settings, train=train),
                            cache=settings.cache, site=site.name)

    return ImageSiteData(dataset("training", True), dataset("validation", False),
                         dataset("test", False), (1, settings.image_size, settings.image_size))


def build_xray_site(name: str, config: ExperimentConfig, data_dir: Path | None,
                    device: str) -> ClassificationTrainer:
    """Return the trainer of an X-ray site (the task's ``build_site``)."""
    site = load_imaging_site("xray", name)
    settings = ImagingSettings.from_extra(config.extra, XRAY_DEFAULTS)
    data = site_data("xray", site, settings, config.seed, data_dir,
                     lambda: build_xray_data(site, settings, config.seed, data_dir))
    device = device if device != "auto" else site.device
    return ClassificationTrainer(
        name, build_xray_model(config, data.input_shape), data, config.strategy_obj(),
        lr=config.lr, batch_size=config.batch_size, local_epochs=config.local_epochs,
        seed=config.seed, device=device)


XRAY_TASK = register_task(Task(
    name="xray", experiment="xray-fedbn", build_site=build_xray_site,
    build_server_model=build_xray_model,
    default_input_shape=(1, XRAY_DEFAULTS.image_size, XRAY_DEFAULTS.image_size),
))
