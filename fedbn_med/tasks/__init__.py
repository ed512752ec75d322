"""Tasks a federation can run (ABIDE connectivity, MRI segmentation, X-ray classification).

A task tells an engine how to build a site's trainer and the server's copy of the model,
so the Flower adapter and the in-process driver stay task-agnostic. Each task is a
subpackage, ``fedbn_med.tasks.<name>``, whose ``__init__`` calls :func:`register_task`;
adding a task means one such subpackage and one entry in ``_MODULES``. This module
imports no task and no run configuration: it only maps names to task packages.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from fedbn_med.training.trainer import SiteTrainer

__all__ = ["TASK_NAMES", "Task", "get_task", "lazy", "register_task"]


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
        ``(site, config, data_dir, device) -> SiteTrainer``: a site's trainer with its data;
        ``config`` holds the run's settings (typed ``Any`` so that the registry depends on
        no run configuration).
    build_server_model : callable
        ``(config, input_shape) -> nn.Module``: the model the server initialises.
    default_input_shape : tuple of int
        Shape of one example the federation's model takes, unless the run says otherwise.
    check_sites : callable
        ``(names) -> None``: raise ``ValueError`` naming the valid sites for an unknown one.
    build_pooled : callable or None
        ``(trainers, config) -> SiteTrainer``: one trainer over every site's training data
        (the Centralized upper bound); None when the task has no pooled baseline.
    prepare : callable or None
        ``(config) -> None``: make the built-in data and caches before site processes
        start, so that several local sites never race to write the same files.
    preload : tuple of str
        Modules a site host imports once before it forks its sites.
    score_metrics : tuple of str
        The metrics the task's trainer scores on each split (sent as ``val_<name>`` and
        ``test_<name>``); a federation server refuses a reply naming any other
        (:mod:`fedbn_med.federation.server.checks`).
    """

    name: str
    experiment: str
    build_site: Callable[[str, Any, Path | None, str], SiteTrainer]
    build_server_model: Callable[[Any, tuple[int, ...]], nn.Module]
    default_input_shape: tuple[int, ...]
    check_sites: Callable[[Sequence[str]], None] = lambda names: None
    build_pooled: Callable[[Mapping[str, SiteTrainer], Any], SiteTrainer] | None = None
    prepare: Callable[[Any], None] | None = None
    preload: tuple[str, ...] = ()
    # fedbn_med.evaluation.metrics.METRIC_NAMES (SiteTrainer.score), written out: no numpy here
    score_metrics: tuple[str, ...] = ("accuracy", "balanced_accuracy", "auc", "f1", "loss",
                                      "n", "positive_rate", "majority_rate")


def lazy(target: str, *bound: Any) -> Callable[..., Any]:
    """Return a function that imports ``"package.module:function"`` on its first call.

    A task's package registers itself with such functions, so that registering (and so
    the ServerApp, the command line, ``--help``) imports none of the task's heavy stack;
    ``bound`` arguments come first at every call.
    """
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"A lazy target is 'package.module:function', got '{target}'.")

    def call(*args: Any, **kwargs: Any) -> Any:
        function = getattr(importlib.import_module(module), name)
        return function(*bound, *args, **kwargs)

    call.__qualname__ = call.__name__ = name
    call.__doc__ = f"Call {target} (imported on first use)."
    return call


_MODULES = {"abide": "fedbn_med.tasks.abide", "mri": "fedbn_med.tasks.mri",
            "xray": "fedbn_med.tasks.xray"}
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
