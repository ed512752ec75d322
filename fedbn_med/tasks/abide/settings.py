"""ABIDE's own run settings and its defaults (kept light: no torch, no data stack)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["COHORT_VERSION", "COMPARE", "DEFAULTS", "ENGINE", "NUM_FEATURES", "Settings"]

#: Version of the built-in cohort's generator (:mod:`fedbn_med.tasks.abide.cohort`); it is
#: in the cohort's manifest, its directory name, the feature-cache key and MLflow params.
#: 2: per-site gain (temporal noise) and wider offsets (global signal), a sparse and
#: heterogeneous diagnosis effect.
COHORT_VERSION = "2"

#: Upper triangle of the 111 x 111 Harvard-Oxford connectivity matrix.
NUM_FEATURES = 111 * 110 // 2

#: The paper's ABIDE set-up: four sites, SGD at 1e-2, batches of 32.
DEFAULTS: dict[str, Any] = {
    "sites": ("NYU", "UM", "USM", "UCLA"),
    "rounds": 100,
    "batch_size": 32,
    "lr": 1e-2,
}


#: The strategies ``--compare`` runs when given no list, in table order.
COMPARE = ("singleset", "fedavg", "fedprox", "fedbn", "centralized")

#: The engine a pipeline uses unless ``--engine`` says otherwise.
ENGINE = "flower"


@dataclass(frozen=True)
class Settings:
    """Settings of the ABIDE task.

    Attributes
    ----------
    site_effect : float
        Strength of the built-in cohort's site effects (0: every site scans alike; 1: the
        real sites' figures). Ignored for real ABIDE data.
    """

    task: ClassVar[str] = "abide"
    site_effect: float = 1.0

    def __post_init__(self) -> None:
        value = self.site_effect
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value >= 0):
            raise ValueError(f"site_effect must be a finite number >= 0, got {value!r}.")

    def log_params(self) -> dict[str, object]:
        """Return what MLflow logs of these settings (with the built-in cohort's version)."""
        return {"site_effect": self.site_effect, "cohort_version": COHORT_VERSION}

    def input_shape(self) -> tuple[int, ...]:
        """Return ``(6105,)``: one connectivity vector per subject."""
        return (NUM_FEATURES,)
