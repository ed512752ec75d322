"""The X-ray task's settings and defaults (light: no MONAI import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fedbn_med.tasks.imaging.settings import ImagingSettings

__all__ = ["COMPARE", "DEFAULTS", "ENGINE", "SITES", "Settings"]

#: The built-in X-ray hospitals, one detector model each.
SITES = ("HospitalA", "HospitalB", "HospitalC")

DEFAULTS: dict[str, Any] = {"sites": SITES, "rounds": 5, "batch_size": 8, "lr": 1e-3}


#: The strategies ``--compare`` runs when given no list, in table order: FedBN against
#: FedAvg, FedAvg scored with each site's own BN statistics, and SiloBN (BN affine shared).
COMPARE = ("singleset", "fedavg", "fedavg_localbn", "silobn", "fedprox", "fedbn")

#: The engine a pipeline uses unless ``--engine`` says otherwise.
ENGINE = "inprocess"


@dataclass(frozen=True)
class Settings(ImagingSettings):
    """Chest X-ray classification: 48 radiographs per hospital."""

    task: ClassVar[str] = "xray"
    subjects: int = 48
