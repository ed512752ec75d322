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
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn

    from fedbn_med.training.trainer import SiteTrainer

__all__ = ["TASK_NAMES", "BuildSite", "Selection", "Task", "get_task", "lazy", "register_task"]


class BuildSite(Protocol):
    """``(site, config, data_dir, device, data=None) -> SiteTrainer``: a task's site builder."""

    def __call__(self, site: str, config: Any, data_dir: Path | None, device: str, /, *,
                 data: Any = None) -> SiteTrainer:
        """Return the site's trainer; on ``data`` when given (see ``Task.site_data``)."""
        ...


@dataclass(frozen=True)
class Selection:
    """The validation metric that selects a run's round, and which way is better.

    Attributes
    ----------
    metric : str
        A score of the task's trainer, read from each site's ``val_<metric>``.
    lower : bool
        Whether a lower mean over the sites is better (a loss) or a higher one (a score).
    """

    metric: str = "loss"
    lower: bool = True


@dataclass(frozen=True)
class Task:
    """How to build one kind of federation.

    Attributes
    ----------
    name : str
        Registry name (``"abide"``).
    experiment : str
        MLflow experiment of the task's pipeline.
    build_site : BuildSite
        ``(site, config, data_dir, device) -> SiteTrainer``: a site's trainer with its data;
        ``config`` holds the run's settings (typed ``Any`` so that the registry depends on
        no run configuration). A task with ``site_data`` also takes ``data=``: the site's
        data from it, instead of building them.
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
    selection : Selection
        The validation metric that selects a run's round
        (:func:`fedbn_med.evaluation.comparison.best_round`): the objective's
        (:attr:`fedbn_med.training.objective.Objective.selection`), written out here so
        that the registry imports no torch.
    headline : str
        The score a run is summarised by (``test_<headline>``, e.g. a benchmark's curve).
    site_data : callable or None
        ``(site, config) -> data``: a site's data for the run's fold, which ``build_site``
        then takes as ``data=`` (a benchmark subsamples it in between); None when the
        task's sites build their data only inside ``build_site``.
    """

    name: str
    experiment: str
    build_site: BuildSite
    build_server_model: Callable[[Any, tuple[int, ...]], nn.Module]
    default_input_shape: tuple[int, ...]
    check_sites: Callable[[Sequence[str]], None] = lambda names: None
    build_pooled: Callable[[Mapping[str, SiteTrainer], Any], SiteTrainer] | None = None
    prepare: Callable[[Any], None] | None = None
    preload: tuple[str, ...] = ()
    # fedbn_med.evaluation.metrics.METRIC_NAMES (SiteTrainer.score), written out: no numpy here
    score_metrics: tuple[str, ...] = ("accuracy", "balanced_accuracy", "auc", "f1", "loss",
                                      "n", "positive_rate", "majority_rate")
    selection: Selection = Selection()
    headline: str = "accuracy"
    site_data: Callable[[str, Any], Any] | None = None


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
