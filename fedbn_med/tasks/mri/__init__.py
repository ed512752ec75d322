"""Task ``"mri"``: brain tissue segmentation across scanners with MONAI ``UNet(norm="batch")``.

Each site segments its subjects' volumes into background, CSF, grey and white matter:
by default a 3D UNet trained on patches and scored on whole volumes by a sliding window
(``mode="3d"``), or a 2D UNet on axial slices (``mode="2d"``). Dice per class is
measured on each validation/test subject's volume. Under FedBN the UNet's batch-norm
layers (``BatchNorm3d``/``BatchNorm2d``, named ``*.adn.N``) stay at their scanner's site.

The task's files: ``data`` (sites' datasets and transforms), ``model`` (the UNet),
``objective`` (loss and Dice), ``build`` (a site's trainer from the three), ``settings`` (the
task's defaults and settings class). Importing this
package registers the task (see :mod:`fedbn_med.tasks`) without importing MONAI: the
builders are imported when a site or the server model is first built.
"""

from __future__ import annotations

from fedbn_med.tasks import Selection, Task, lazy, register_task
from fedbn_med.tasks.mri.settings import Settings

__all__ = ["MRI_TASK"]

MRI_TASK = register_task(Task(
    name="mri", experiment="mri-fedbn",
    build_site=lazy("fedbn_med.tasks.mri.build:build_mri_site"),
    build_server_model=lazy("fedbn_med.tasks.mri.model:build_mri_model"),
    default_input_shape=Settings().input_shape(),
    check_sites=lazy("fedbn_med.tasks.imaging.site_files:check_imaging_sites", "mri"),
    build_pooled=lazy("fedbn_med.tasks.imaging.trainer:pooled_trainer"),
    preload=("fedbn_med.tasks.mri.build",),
    # Segmentation.score_dataset's, for synth.TISSUE_CLASSES
    score_metrics=("dice", "dice_csf", "dice_gm", "dice_wm", "loss"),
    selection=Selection("loss", lower=True),  # Segmentation.selection
    headline="dice",
))
