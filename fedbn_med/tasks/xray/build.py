"""Build an X-ray site's trainer: its site file, its data, the DenseNet and the objective."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.tasks.imaging.build import build_image_site
from fedbn_med.tasks.xray.data import build_xray_data
from fedbn_med.tasks.xray.model import build_xray_model
from fedbn_med.tasks.xray.objective import Classification

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.training.trainer import SiteTrainer

__all__ = ["build_xray_site"]


def build_xray_site(name: str, config: RunSpec, data_dir: Path | None,
                   device: str) -> SiteTrainer:
    """Return the trainer of an X-ray site (the task's ``build_site``)."""
    return build_image_site(
        "xray", name, config, data_dir, device, build_data=build_xray_data,
        build_model=build_xray_model, objective=Classification())
