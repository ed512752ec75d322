"""Tasks a federation can run (ABIDE connectivity, MRI segmentation, X-ray classification).

A task tells an engine how to build a site's trainer and the server's copy of the model,
so the Flower adapter and the in-process driver stay task-agnostic. Adding a task means
one module that calls :func:`register_task` and one entry in ``_MODULES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from fedbn_med.experiment import ExperimentConfig
    from fedbn_med.trainer import SiteTrainer

__all__ = ["TASK_NAMES", "Task", "get_task", "register_task"]


@dataclass(frozen=True)
class Task:
    """How to build one kind of federation.

    Attributes
    ----------
    name : str
        Registry name (``"abide"``).
    experiment : str
        MLflow experiment of the task's pipeline.
    build_site : callable
        ``(site, config, data_dir, device) -> SiteTrainer``: a site's trainer with its data.
    build_server_model : callable
        ``(config, input_shape) -> nn.Module``: the model the server initialises.
    default_input_shape : tuple of int
        Shape of one example the federation's model takes, unless the run says otherwise.
    """

    name: str
    experiment: str
    build_site: Callable[[str, ExperimentConfig, Path | None, str], SiteTrainer]
    build_server_model: Callable[[ExperimentConfig, tuple[int, ...]], nn.Module]
    default_input_shape: tuple[int, ...]


_MODULES = {"abide": "fedbn_med.experiment", "mri": "fedbn_med.imaging.mri",
            "xray": "fedbn_med.imaging.xray"}
TASK_NAMES = tuple(sorted(_MODULES))
_TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add a task to the registry (called by the task's module at import)."""
    _TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    """Return a registered task, importing its module on first use."""
    if name not in _MODULES:
        raise ValueError(f"Unknown task '{name}'. Valid tasks: {', '.join(TASK_NAMES)}.")
    if name not in _TASKS:
        importlib.import_module(_MODULES[name])
    if name not in _TASKS:
        raise ValueError(f"Task module {_MODULES[name]} did not register task '{name}'.")
    return _TASKS[name]
