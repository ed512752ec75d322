"""Task ``"mri"``: brain tissue segmentation across scanners with MONAI ``UNet(norm="batch")``.

Each site segments 2D axial slices into background, CSF, grey and white matter; Dice per
class is measured on each validation/test subject's slab of slices. Under FedBN the
UNet's batch-norm layers (``*.adn.N``) stay at their scanner's site.
"""

from __future__ import annotations

from pathlib import Path

import torch
from monai.data import Dataset
from monai.networks.nets import UNet
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
from torch import nn

from fedbn_med.experiment import ExperimentConfig
from fedbn_med.imaging import synth
from fedbn_med.imaging.federate import ImagingSettings, site_data
from fedbn_med.imaging.readers import ReadImaged, load_datalist
from fedbn_med.imaging.sites import ImagingSite, load_imaging_site
from fedbn_med.imaging.trainer import ImageSiteData, SegmentationTrainer, make_dataset
from fedbn_med.tasks import Task, register_task

__all__ = [
    "MRI_DEFAULTS",
    "MRI_SITES",
    "MRI_TASK",
    "build_mri_data",
    "build_mri_model",
    "build_mri_site",
    "mri_transforms",
]

MRI_SITES = ("SiteA", "SiteB", "SiteC")
MRI_DEFAULTS = ImagingSettings(image_size=64, subjects=24, slices=8)
_KEYS = ("image", "label")


def mri_transforms(settings: ImagingSettings, *, train: bool) -> Compose:
    """Return the MONAI chain: decode, resize, normalise, keep the central slab; then
    (training) draw random axial slices and flip them."""
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


def build_mri_model(config: ExperimentConfig, input_shape: tuple[int, ...] = (1, 64, 64)
                    ) -> nn.Module:
    """Build the 2D segmentation UNet with the run's seed, identical at every site."""
    torch.manual_seed(config.seed)
    return UNet(spatial_dims=2, in_channels=int(input_shape[0]),
                out_channels=len(synth.TISSUE_CLASSES), channels=(16, 32, 64, 128),
                strides=(2, 2, 2), num_res_units=1, norm="batch")


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


def build_mri_site(name: str, config: ExperimentConfig, data_dir: Path | None,
                   device: str) -> SegmentationTrainer:
    """Return the trainer of an MRI site (the task's ``build_site``)."""
    site = load_imaging_site("mri", name)
    settings = ImagingSettings.from_extra(config.extra, MRI_DEFAULTS)
    data = site_data("mri", site, settings, config.seed, data_dir,
                     lambda: build_mri_data(site, settings, config.seed, data_dir))
    device = device if device != "auto" else site.device
    return SegmentationTrainer(
        name, build_mri_model(config, data.input_shape), data, config.strategy_obj(),
        lr=config.lr, batch_size=config.batch_size, local_epochs=config.local_epochs,
        seed=config.seed, device=device, class_names=synth.TISSUE_CLASSES)


MRI_TASK = register_task(Task(
    name="mri", experiment="mri-fedbn", build_site=build_mri_site,
    build_server_model=build_mri_model,
    default_input_shape=(1, MRI_DEFAULTS.image_size, MRI_DEFAULTS.image_size),
))
