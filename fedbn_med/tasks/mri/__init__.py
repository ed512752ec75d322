"""Task ``"mri"``: brain tissue segmentation across scanners with MONAI ``UNet(norm="batch")``.

Each site segments 2D axial slices into background, CSF, grey and white matter; Dice per
class is measured on each validation/test subject's slab of slices. Under FedBN the
UNet's batch-norm layers (``*.adn.N``) stay at their scanner's site.

The task's files: ``data`` (sites' datasets and transforms), ``model`` (the UNet),
``objective`` (loss and Dice), ``build`` (a site's trainer from the three), ``settings`` (the
task's defaults and settings class). Importing this
package registers the task (see :mod:`fedbn_med.tasks`) without importing MONAI: the
builders are imported when a site or the server model is first built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.tasks import Task, register_task
from fedbn_med.tasks.mri.settings import Settings

if TYPE_CHECKING:
    from torch import nn

    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.mri.objective import SegmentationTrainer
    from fedbn_med.trainer import SiteTrainer

__all__ = ["MRI_TASK"]


def _build_site(name: str, config: RunSpec, data_dir: Path | None,
                device: str) -> SegmentationTrainer:
    from fedbn_med.tasks.mri.build import build_mri_site

    return build_mri_site(name, config, data_dir, device)


def _build_server_model(config: RunSpec, input_shape: tuple[int, ...]) -> nn.Module:
    from fedbn_med.tasks.mri.model import build_mri_model

    return build_mri_model(config, input_shape)


def _build_pooled(trainers: Mapping[str, SiteTrainer], config: RunSpec) -> SiteTrainer:
    from fedbn_med.tasks.imaging.trainer import pooled_trainer

    return pooled_trainer(list(trainers.values()))


def _check_sites(names: Sequence[str]) -> None:
    from fedbn_med.tasks.imaging.site_files import check_imaging_sites

    check_imaging_sites("mri", names)


MRI_TASK = register_task(Task(
    name="mri", experiment="mri-fedbn", build_site=_build_site,
    build_server_model=_build_server_model, default_input_shape=Settings().input_shape(),
    check_sites=_check_sites, build_pooled=_build_pooled,
    preload=("fedbn_med.tasks.mri.build",),
))
