"""Build an X-ray site's trainer: its site file, its data, the DenseNet and the objective."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.tasks.imaging.datasets import site_data
from fedbn_med.tasks.imaging.site_files import load_imaging_site, site_dp
from fedbn_med.tasks.xray.data import build_xray_data
from fedbn_med.tasks.xray.model import build_xray_model
from fedbn_med.tasks.xray.objective import ClassificationTrainer

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

__all__ = ["build_xray_site"]


def build_xray_site(name: str, config: RunSpec, data_dir: Path | None,
                    device: str) -> ClassificationTrainer:
    """Return the trainer of an X-ray site (the task's ``build_site``).

    ``data_dir`` (else the spec's) is the data root of the built-in sites.
    """
    site = load_imaging_site("xray", name)
    settings = config.settings
    root = data_dir if data_dir is not None else config.data_dir
    data = site_data("xray", site, settings, config.seed, root,
                     lambda: build_xray_data(site, settings, config.seed, root))
    device = device if device != "auto" else site.device
    return ClassificationTrainer(
        name, build_xray_model(config, data.input_shape), data, config.strategy_obj(),
        lr=config.lr, batch_size=config.batch_size, local_epochs=config.local_epochs,
        seed=config.seed, device=device, privacy=site_dp(site, config))
