"""Build an MRI site's trainer: its site file, its data, the UNet and the objective."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.tasks.imaging import synth
from fedbn_med.tasks.imaging.build import build_image_site
from fedbn_med.tasks.mri.data import build_mri_data
from fedbn_med.tasks.mri.model import build_mri_model
from fedbn_med.tasks.mri.objective import Segmentation, volume_inferer

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.training.trainer import SiteTrainer

__all__ = ["build_mri_site"]


def build_mri_site(name: str, config: RunSpec, data_dir: Path | None,
                   device: str) -> SiteTrainer:
    """Return the trainer of an MRI site (the task's ``build_site``)."""
    settings = config.settings
    roi = settings.patch if settings.spatial_dims == 3 else settings.image_size
    return build_image_site(
        "mri", name, config, data_dir, device, build_data=build_mri_data,
        build_model=build_mri_model, objective=Segmentation(
            synth.TISSUE_CLASSES,
            volume_inferer(settings.spatial_dims, roi, batch=config.batch_size)))
