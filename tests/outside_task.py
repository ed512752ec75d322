"""A task from outside fedbn_med, written as another package would: public names only.

Two sites segment bright squares on a background whose brightness is the site's own.
:func:`install` writes it as an installed distribution with an entry point in the
``fedbn_med.tasks`` group, so that any process with the folder on its path finds it.
"""

from __future__ import annotations

from pathlib import Path

SOURCE = '''"""Task "squares": two sites segment bright squares; public names of fedbn_med only."""
from __future__ import annotations

import numpy as np

import fedbn_med as fb

SITES = ("north", "south")


def _items(site, n, seed):
    rng = np.random.default_rng(seed)
    shift = 0.0 if site == "north" else 1.5
    items = []
    for _ in range(n):
        label = np.zeros((1, 16, 16), np.int64)
        r, c = rng.integers(4, 12, 2)
        label[0, r - 3:r + 3, c - 3:c + 3] = 1
        image = (label + shift + rng.normal(0, 0.3, label.shape)).astype(np.float32)
        items.append({"image": image, "label": label})
    return items


def build_model(spec, input_shape=(1, 16, 16)):
    import torch
    from monai.networks.nets import UNet

    torch.manual_seed(spec.seed)
    return UNet(2, input_shape[0], 2, channels=(4, 8), strides=(2,), norm="batch")


def build_site(site, spec, data_dir, device, *, data=None):
    from monai.data import Dataset
    from monai.inferers import SimpleInferer

    seed = 10 * SITES.index(site)
    data = data or fb.image_site(*(Dataset(_items(site, n, seed + k))
                                   for k, n in enumerate((6, 3, 3))))
    objective = fb.Segmentation(("background", "square"), SimpleInferer())
    return fb.site_trainer(site, build_model(spec), data, objective, spec=spec,
                           device=device)


TASK = fb.Task(name="squares", experiment="squares-fedbn", build_site=build_site,
               build_server_model=build_model, default_input_shape=(1, 16, 16),
               score_metrics=("dice", "dice_square", "loss"), headline="dice",
               selection=fb.Selection("loss", lower=True), sites=SITES,
               build_pooled=fb.pooled_trainer)
'''


def install(folder: Path) -> Path:
    """Write the package ``squares_task`` and its dist-info (entry point) under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "squares_task.py").write_text(SOURCE, encoding="utf-8")
    info = folder / "squares_task-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: squares-task\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedbn_med.tasks]\nsquares = squares_task:TASK\n")
    return folder
