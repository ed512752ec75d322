"""Task ``"histo"``: nuclei segmentation of H&E tiles across hospitals, built from public names.

Every site segments the nuclei of its tiles with MONAI's ``UNet(norm="batch")``, trained
on random patches with H&E colour and geometric augmentation, and scored on whole tiles
by Dice and the aggregated Jaccard index (AJI). The tiles are read as distributed (TIFF
tiles, ImageScope XML annotations, PNG masks, or a datalist JSON), and made into sites by
a documented rule: by hospital or by organ (:mod:`fedbn_med.tasks.histo.sites`). Without
a data folder the task runs on generated tiles (:mod:`fedbn_med.tasks.histo.synth`).

This package uses only the public names of :mod:`fedbn_med` (``fb.Task``, ``fb.lazy``,
``fb.site_trainer``, ``fb.image_site``, ``fb.Segmentation``, ...), as an outside
package would.
"""

from __future__ import annotations

import fedbn_med as fb

__all__ = ["HISTO_TASK"]

HISTO_TASK = fb.register_task(fb.Task(
    name="histo", experiment="histo-fedbn",
    build_site=fb.lazy("fedbn_med.tasks.histo.build:build_site"),
    build_server_model=fb.lazy("fedbn_med.tasks.histo.build:build_model"),
    default_input_shape=(3, 64, 64),
    build_pooled=fb.lazy("fedbn_med:pooled_trainer"),
    prepare=fb.lazy("fedbn_med.tasks.histo.build:prepare"),
    preload=("fedbn_med.tasks.histo.build",),
    score_metrics=("dice", "aji", "loss"),
    selection=fb.Selection("loss", lower=True),
    headline="dice",
    settings="fedbn_med.tasks.histo.settings",
))
