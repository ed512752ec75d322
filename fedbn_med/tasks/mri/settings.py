"""The MRI task's settings and defaults (light: no MONAI import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fedbn_med.tasks.imaging.settings import ImagingSettings

__all__ = ["COMPARE", "DEFAULTS", "ENGINE", "SITES", "Settings"]

#: The built-in MRI sites, one scanner model each.
SITES = ("SiteA", "SiteB", "SiteC")

DEFAULTS: dict[str, Any] = {"sites": SITES, "rounds": 20, "batch_size": 4, "lr": 1e-3}


#: The strategies ``--compare`` runs when given no list, in table order.
COMPARE = ("singleset", "fedavg", "fedprox", "fedbn")

#: The engine a pipeline uses unless ``--engine`` says otherwise.
ENGINE = "inprocess"


@dataclass(frozen=True)
class Settings(ImagingSettings):
    """Brain MRI segmentation: 24 volumes per site, 8 axial slices per volume and epoch."""

    task: ClassVar[str] = "mri"
    subjects: int = 24
    slices: int = 8
