"""The run settings of a task that brings none of its own (light: no torch).

An outside task registered without a ``settings`` module (:attr:`fedbn_med.tasks.Task.settings`)
runs with these: no task-specific settings, the generic run defaults, and the task's own
sites (:attr:`fedbn_med.tasks.Task.sites`) and input shape
(:attr:`fedbn_med.tasks.Task.default_input_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["COMPARE", "DEFAULTS", "ENGINE", "Settings"]

#: No defaults beyond the run's own (the sites come from the task).
DEFAULTS: dict[str, Any] = {}

#: The strategies ``--compare`` runs when given no list, in table order.
COMPARE = ("singleset", "fedavg", "fedavg_localbn", "silobn", "fedprox", "fedbn")

#: The engine a pipeline uses unless ``--engine`` says otherwise.
ENGINE = "inprocess"


@dataclass(frozen=True)
class Settings:
    """No settings: the task's network input is its ``default_input_shape``."""

    task: ClassVar[str] = "generic"

    def input_shape(self) -> tuple[int, ...]:
        """Return ``()``: the run takes the task's ``default_input_shape``."""
        return ()
