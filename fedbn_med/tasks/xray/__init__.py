"""Task ``"xray"``: finding / no finding on radiographs across hospitals, MONAI ``DenseNet121``.

Hospitals differ in exposure, detector response, noise and storage (DICOM, PNG, NIfTI);
the finding (a bright nodule) means the same everywhere. Scores per site: ROC AUC,
accuracy, balanced accuracy, F1. Under FedBN the DenseNet's batch-norm layers
(``features.norm0``, ``...norm1``, ...) stay at their hospital.

The task's files: ``data`` (sites' datasets and transforms), ``model`` (the DenseNet),
``objective`` (loss and scores), ``build`` (a site's trainer from the three), ``settings`` (the
task's defaults and settings class). Importing
this package registers the task (see :mod:`fedbn_med.tasks`) without importing MONAI:
the builders are imported when a site or the server model is first built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.tasks import Task, register_task
from fedbn_med.tasks.xray.settings import Settings

if TYPE_CHECKING:
    from torch import nn

    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.xray.objective import ClassificationTrainer
    from fedbn_med.trainer import SiteTrainer

__all__ = ["XRAY_TASK"]


def _build_site(name: str, config: RunSpec, data_dir: Path | None,
                device: str) -> ClassificationTrainer:
    from fedbn_med.tasks.xray.build import build_xray_site

    return build_xray_site(name, config, data_dir, device)


def _build_server_model(config: RunSpec, input_shape: tuple[int, ...]) -> nn.Module:
    from fedbn_med.tasks.xray.model import build_xray_model

    return build_xray_model(config, input_shape)


def _build_pooled(trainers: Mapping[str, SiteTrainer], config: RunSpec) -> SiteTrainer:
    from fedbn_med.tasks.imaging.trainer import pooled_trainer

    return pooled_trainer(list(trainers.values()))


def _check_sites(names: Sequence[str]) -> None:
    from fedbn_med.tasks.imaging.site_files import check_imaging_sites

    check_imaging_sites("xray", names)


XRAY_TASK = register_task(Task(
    name="xray", experiment="xray-fedbn", build_site=_build_site,
    build_server_model=_build_server_model, default_input_shape=Settings().input_shape(),
    check_sites=_check_sites, build_pooled=_build_pooled,
    preload=("fedbn_med.tasks.xray.build",),
))
