"""fedbn_med: FedBN federated learning for medical sites whose scanners differ.

The public face, importable from here (each is imported on first use, so that
``import fedbn_med`` stays light and changes nothing process-wide):

- running: :func:`run` (one federation, typed :class:`FederationResult`), :class:`RunSpec`;
- site data: :func:`image_site` (MONAI datasets), :class:`ImageSiteData`,
  :class:`TensorSiteData`; a site's trainer: :func:`site_trainer`, :func:`pooled_trainer`;
- objectives: :class:`Segmentation`, :class:`Classification`,
  :class:`BinaryClassification`, and :class:`ImageObjective` / :class:`Objective` to
  subclass;
- strategies by name: :data:`STRATEGIES`, :func:`get_strategy`;
- tasks: :class:`Task`, :class:`Selection`, :func:`register_task`, :func:`get_task`,
  :func:`task_names`, :func:`lazy`, and the conformance checks :func:`check_task`;
- numerics: :func:`pin_numerics` (opt-in; see :mod:`fedbn_med.numerics`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> ``module:attribute`` it is imported from on first use.
_EXPORTS = {
    "run": "fedbn_med.api.run:run",
    "FederationResult": "fedbn_med.api.result:FederationResult",
    "RunSpec": "fedbn_med.spec:RunSpec",
    "image_site": "fedbn_med.api.sites:image_site",
    "site_trainer": "fedbn_med.api.sites:site_trainer",
    "check_task": "fedbn_med.api.checks:check_task",
    "TaskCheckError": "fedbn_med.api.checks:TaskCheckError",
    "ImageSiteData": "fedbn_med.tasks.imaging.datasets:ImageSiteData",
    "TensorSiteData": "fedbn_med.training.data:SiteData",
    "pooled_trainer": "fedbn_med.tasks.imaging.trainer:pooled_trainer",
    "Objective": "fedbn_med.training.objective:Objective",
    "BinaryClassification": "fedbn_med.training.objective:BinaryClassification",
    "ImageObjective": "fedbn_med.tasks.imaging.trainer:ImageObjective",
    "Segmentation": "fedbn_med.tasks.mri.objective:Segmentation",
    "Classification": "fedbn_med.tasks.xray.objective:Classification",
    "SiteTrainer": "fedbn_med.training.trainer:SiteTrainer",
    "STRATEGIES": "fedbn_med.fl.registry:STRATEGIES",
    "get_strategy": "fedbn_med.fl.registry:get_strategy",
    "Task": "fedbn_med.tasks:Task",
    "Selection": "fedbn_med.tasks:Selection",
    "register_task": "fedbn_med.tasks:register_task",
    "get_task": "fedbn_med.tasks:get_task",
    "task_names": "fedbn_med.tasks:task_names",
    "lazy": "fedbn_med.tasks:lazy",
    "pin_numerics": "fedbn_med.numerics:pin",
}

__all__ = [
    "BinaryClassification",
    "Classification",
    "FederationResult",
    "ImageObjective",
    "ImageSiteData",
    "Objective",
    "RunSpec",
    "STRATEGIES",
    "Segmentation",
    "Selection",
    "SiteTrainer",
    "Task",
    "TaskCheckError",
    "TensorSiteData",
    "check_task",
    "get_strategy",
    "get_task",
    "image_site",
    "lazy",
    "pin_numerics",
    "pooled_trainer",
    "register_task",
    "run",
    "site_trainer",
    "task_names",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'fedbn_med' has no attribute '{name}'")
    module, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # what a type checker and an IDE see
    from fedbn_med.api.checks import TaskCheckError, check_task
    from fedbn_med.api.result import FederationResult
    from fedbn_med.api.run import run
    from fedbn_med.api.sites import image_site, site_trainer
    from fedbn_med.fl.registry import STRATEGIES, get_strategy
    from fedbn_med.numerics import pin as pin_numerics
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks import Selection, Task, get_task, lazy, register_task, task_names
    from fedbn_med.tasks.imaging.datasets import ImageSiteData
    from fedbn_med.tasks.imaging.trainer import ImageObjective, pooled_trainer
    from fedbn_med.tasks.mri.objective import Segmentation
    from fedbn_med.tasks.xray.objective import Classification
    from fedbn_med.training.data import SiteData as TensorSiteData
    from fedbn_med.training.objective import BinaryClassification, Objective
    from fedbn_med.training.trainer import SiteTrainer
