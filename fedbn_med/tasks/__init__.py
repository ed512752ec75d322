"""Tasks a federation can run (ABIDE connectivity, MRI segmentation, X-ray classification).

A task tells an engine how to build a site's trainer and the server's copy of the model,
so the Flower adapter and the in-process driver stay task-agnostic. The built-in tasks
are subpackages, ``fedbn_med.tasks.<name>``, whose ``__init__`` calls
:func:`register_task`. A task of another package joins without editing this one, in
either of two ways:

- its module calls :func:`register_task` when imported (in this process only);
- its distribution declares an entry point in the group :data:`ENTRY_POINT_GROUP`
  (``fedbn_med.tasks``), named after the task, pointing at the module (or at its
  :class:`Task` object, ``"package.module:TASK"``); every process that looks the name up
  (a Flower site, the command line) then imports it, read with :mod:`importlib.metadata`.

This module imports no task and no run configuration: it only maps names to tasks.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import keyword
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, overload

if TYPE_CHECKING:
    from torch import nn

    from fedbn_med.training.trainer import SiteTrainer

__all__ = ["ENTRY_POINT_GROUP", "TASK_NAMES", "BuildSite", "Cells", "Selection", "Task",
           "get_task", "lazy", "register_task", "settings_module_name", "task_names"]


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
class Cells:
    """How a task prepares a comparison's (fold, seed) cell for the subject-level tests.

    Every method of a cell, and its reference rows, then see the same subjects
    (:mod:`fedbn_med.evaluation.cell_data` calls these; the comparison's code names no
    task). The values are :class:`fedbn_med.evaluation.cell_data.PreparedSite`.

    Attributes
    ----------
    load_sites : callable
        ``(names) -> {name: site file}``: the sites' files.
    prepare : callable
        ``(spec, sites) -> {site: PreparedSite}``: each site loaded and split for the
        spec's fold and repetition seed (``sites``: their files, or None to load them).
    with_features : callable
        ``(spec, prepared, sites) -> {site: PreparedSite}``: the prepared sites with the
        spec's own feature chain applied, on the same split (``prepared`` when it has none).
    """

    load_sites: Callable[[Sequence[str]], Mapping[str, Any]]
    prepare: Callable[[Any, Mapping[str, Any] | None], Mapping[str, Any]]
    with_features: Callable[[Any, Mapping[str, Any], Mapping[str, Any] | None],
                            Mapping[str, Any]]


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
    settings : str or None
        The module of the task's run settings (``DEFAULTS``, ``Settings``, optionally
        ``COMPARE``, ``ENGINE`` and ``METRICS``), imported without torch. None: a built-in
        task's ``fedbn_med.tasks.<name>.settings``, an outside task's
        :mod:`fedbn_med.tasks.generic` (no settings of its own).
    sites : tuple of str
        The task's sites when the run names none (used with the generic settings).
    cells : Cells or None
        How a comparison's cell is prepared for subject-level tests (every method on the
        same subjects, each test subject's prediction kept); None when the task's
        comparisons score runs only.
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
    settings: str | None = None
    sites: tuple[str, ...] = ()
    cells: Cells | None = None


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


_MODULES = {"abide": "fedbn_med.tasks.abide", "histo": "fedbn_med.tasks.histo",
            "mri": "fedbn_med.tasks.mri", "xray": "fedbn_med.tasks.xray"}
#: The entry-point group an outside package names its tasks in (``name = "pkg.module"``).
ENTRY_POINT_GROUP = "fedbn_med.tasks"
_TASKS: dict[str, Task] = {}


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Return the installed tasks' entry points by name (read afresh: a test may add one)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def task_names() -> tuple[str, ...]:
    """Return every task name known now: built-in, registered and installed, sorted."""
    return tuple(sorted(set(_MODULES) | set(_TASKS) | set(_entry_points())))


class _TaskNames(Sequence[str]):
    """The task names, read when used: registering a task adds its name.

    It stands where a tuple of names did (``choices=TASK_NAMES``, ``name in TASK_NAMES``).
    """

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return task_names()[index]

    def __len__(self) -> int:
        return len(task_names())

    def __iter__(self) -> Iterator[str]:
        return iter(task_names())

    def __contains__(self, name: object) -> bool:
        # Built-in and registered names first: reading the installed packages' entry
        # points takes tens of milliseconds, and a site checks its task on every message.
        if not isinstance(name, str):
            return False
        return name in _MODULES or name in _TASKS or name in _entry_points()

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self) -> int:
        return hash(task_names())

    def __repr__(self) -> str:
        return repr(task_names())


#: Every task name (built-in, registered, installed): a live sequence.
TASK_NAMES: Sequence[str] = _TaskNames()


def register_task(task: Task, *, replace: bool = False) -> Task:
    """Add a task to the registry; return it.

    A built-in task's package calls it when imported; an outside package calls it too
    (for this process), or declares an entry point in :data:`ENTRY_POINT_GROUP` so that
    every process finds it by name.

    Raises
    ------
    TypeError
        If ``task`` is not a :class:`Task`.
    ValueError
        If its name is not a lowercase identifier, or another task holds the name
        (unless ``replace``).
    """
    if not isinstance(task, Task):
        raise TypeError(f"register_task takes a fedbn_med.tasks.Task, got "
                        f"{type(task).__name__}.")
    name = task.name
    if not (isinstance(name, str) and name.isidentifier() and name == name.lower()
            and not keyword.iskeyword(name)):
        raise ValueError(f"A task name is a lowercase Python identifier (it names the "
                         f"task on the command line and in MLflow), got {name!r}.")
    known = _TASKS.get(name)
    if known is not None and known is not task and not replace and known != task:
        raise ValueError(f"Task '{name}' is registered already (experiment "
                         f"'{known.experiment}'); choose another name, or pass "
                         f"replace=True.")
    _TASKS[name] = task
    return task


def get_task(name: str) -> Task:
    """Return a task by name, importing its module (built-in or entry point) on first use.

    Raises
    ------
    ValueError
        For a name no task has, naming the valid ones, or a module that did not
        register the task it names.
    """
    if name in _TASKS:
        return _TASKS[name]
    if name in _MODULES:
        importlib.import_module(_MODULES[name])
        where = _MODULES[name]
    else:
        points = _entry_points()
        if name not in points:
            raise ValueError(f"Unknown task '{name}'. Valid tasks: "
                             f"{', '.join(task_names())}.")
        loaded = points[name].load()
        if isinstance(loaded, Task) and name not in _TASKS:
            register_task(loaded)
        where = f"entry point {points[name].value} ({ENTRY_POINT_GROUP})"
    if name not in _TASKS:
        raise ValueError(f"Task module {where} did not register task '{name}'.")
    return _TASKS[name]


def settings_module_name(name: str) -> str:
    """Return the module of a task's run settings (see :attr:`Task.settings`)."""
    if name in _MODULES and name not in _TASKS:
        return f"{_MODULES[name]}.settings"  # no need to import the task for it
    task = get_task(name)
    if task.settings:
        return task.settings
    return f"fedbn_med.tasks.{name}.settings" if name in _MODULES else "fedbn_med.tasks.generic"
