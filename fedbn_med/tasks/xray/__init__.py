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

from fedbn_med.tasks import Task, lazy, register_task
from fedbn_med.tasks.xray.settings import Settings

__all__ = ["XRAY_TASK"]

XRAY_TASK = register_task(Task(
    name="xray", experiment="xray-fedbn",
    build_site=lazy("fedbn_med.tasks.xray.build:build_xray_site"),
    build_server_model=lazy("fedbn_med.tasks.xray.model:build_xray_model"),
    default_input_shape=Settings().input_shape(),
    check_sites=lazy("fedbn_med.tasks.imaging.site_files:check_imaging_sites", "xray"),
    build_pooled=lazy("fedbn_med.tasks.imaging.trainer:pooled_trainer"),
    preload=("fedbn_med.tasks.xray.build",),
    headline="auc",
))
