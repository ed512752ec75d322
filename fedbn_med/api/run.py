"""One call for a federation: :func:`run`, in this process or over Flower, tracked or not.

Two ways in:

- a registered task (its name, or a :class:`~fedbn_med.spec.RunSpec`): the task builds
  every site, and the run goes through the same engines as the command line
  (``engine="inprocess"`` or ``"flower"``);
- a researcher's own network and data (``run(model, sites, objective)``): every site
  trains a copy of ``model`` on its own data, in this process.

Either way the result is a :class:`~fedbn_med.api.result.FederationResult`, and the
run is logged to MLflow when ``tracking_uri`` is given. A sequence of specs is a
comparison: every run on one engine (over Flower, one federation serves them all; in
this process, a task with subject-level cells runs each cell's methods on the same
subjects, cells in parallel processes), one result per spec.

This is the one way a federation runs: the command line, the comparisons, the
benchmarks and the library call it; the engines are :mod:`fedbn_med.api.engines`. (Two
callers use the in-process engine's parts directly, for what a result does not hold:
onboarding trains a quick federation for its weights and BN layers, and two benchmarks
time or digest the engine itself.)
"""

from __future__ import annotations

import copy
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

from torch import nn

from fedbn_med.api.engines import Launch, Sites, run_inprocess, run_on_flower, spec_launch
from fedbn_med.api.result import FederationResult
from fedbn_med.spec import RunSpec
from fedbn_med.training.inprocess import History, RoundCallback, run_in_process
from fedbn_med.training.objective import Objective

__all__ = ["ENGINES", "run"]

logger = logging.getLogger(__name__)

#: The engines :func:`run` drives.
ENGINES = ("inprocess", "flower")


@overload
def run(what: RunSpec | str | nn.Module,
        sites: Mapping[str, Any] | Sequence[str] | None = None,
        objective: Objective | None = None, *, engine: str = "inprocess",
        tracking_uri: str | None = None, workdir: str | Path | None = None,
        experiment: str = "fedbn-med", progress: bool = False,
        data: Mapping[str, Any] | None = None, server: Mapping[str, Any] | None = None,
        workers: int | None = None, **settings: Any) -> FederationResult: ...


@overload
def run(what: Sequence[RunSpec],
        sites: Mapping[str, Any] | Sequence[str] | None = None,
        objective: Objective | None = None, *, engine: str = "inprocess",
        tracking_uri: str | None = None, workdir: str | Path | None = None,
        experiment: str = "fedbn-med", progress: bool = False,
        data: Mapping[str, Any] | None = None, server: Mapping[str, Any] | None = None,
        workers: int | None = None, **settings: Any) -> list[FederationResult]: ...


def run(what: RunSpec | str | nn.Module | Sequence[RunSpec],
        sites: Mapping[str, Any] | Sequence[str] | None = None,
        objective: Objective | None = None, *, engine: str = "inprocess",
        tracking_uri: str | None = None, workdir: str | Path | None = None,
        experiment: str = "fedbn-med", progress: bool = False,
        data: Mapping[str, Any] | None = None, server: Mapping[str, Any] | None = None,
        workers: int | None = None, **settings: Any
        ) -> FederationResult | list[FederationResult]:
    """Run one federation (or a comparison's) and return its typed result.

    Parameters
    ----------
    what : RunSpec, str, torch.nn.Module or sequence of RunSpec
        A run spec; a registered task's name (its spec is
        ``RunSpec.for_task(name, **settings)``); a network every site trains a copy of;
        or a comparison's specs (every method on every fold and seed, one task and one
        set of sites), which returns one result per spec, in order.
    sites : mapping of site name to site data, or sequence of str, optional
        With a network: each site's data (:func:`fedbn_med.image_site` of MONAI
        datasets, or :class:`fedbn_med.TensorSiteData`). With a task: the sites' names.
    objective : Objective, optional
        With a network only: the loss and the scores (:class:`fedbn_med.Segmentation`,
        :class:`fedbn_med.Classification`, ...).
    engine : {"inprocess", "flower"}
        With a task: this process, or a local Flower federation (a SuperLink and one
        process per site on 127.0.0.1). A network with its own data runs in process, and
        so does a strategy that trains on every site's data at once (Centralized).
    tracking_uri : str, optional
        The MLflow store to log the run to (a parent run, a child run per site, the
        shared weights of the last and the selected round). None: not tracked (a Flower
        run is always tracked: in ``<workdir>/mlflow.db`` unless given).
    workdir : path, optional
        Where the selected round's weights are written: the shared weights
        (``shared.selected.safetensors``) and each site's kept layers
        (``<site>.selected.safetensors``); over Flower, every process's files. Default: a
        new temporary folder. A comparison in this process writes no weights (its shared
        weights are in MLflow when tracked).
    experiment : str
        The MLflow experiment of a network's run (a task's run uses the task's).
    progress : bool
        Show a progress bar over the rounds (a comparison in process: over its runs).
    data : mapping of site name to site data, optional
        With a task in this process: each site's data to train on instead of the task's
        own (e.g. a subsample of the task's ``site_data``), one for every site.
    server : mapping, optional
        Over Flower: further server settings (``secagg=True``, ``round_timeout=...``,
        :class:`~fedbn_med.federation.config.ServerSettings`).
    workers : int, optional
        A comparison in this process: how many processes run its cells at once (default:
        one per free core, at most one per cell).
    **settings
        The run's settings: with a task's name, any :class:`RunSpec` field or task
        setting (``rounds=3``, ``strategy="fedavg"``); with a network, ``strategy``
        (``"fedbn"``), ``rounds`` (5), ``lr``, ``batch_size``, ``local_epochs``, ``seed``,
        ``mu``, ``device``, ``weighting``.

    Raises
    ------
    ValueError
        For an unknown engine, a network without sites or objective, sites given with
        a task, data given over Flower, or an empty comparison.
    TypeError
        When ``what`` is none of these.
    """
    if engine not in ENGINES:
        raise ValueError(f"Unknown engine '{engine}'. Valid engines: {', '.join(ENGINES)}.")
    if data is not None and engine != "inprocess":
        raise ValueError("Sites' data given in this process stay in it: data= needs "
                         "engine='inprocess'.")
    folder = Path(workdir).resolve() if workdir is not None else None
    if isinstance(what, nn.Module):
        if not isinstance(sites, Mapping) or objective is None:
            raise ValueError("A network runs on its sites' data with an objective: "
                             "run(model, sites={name: data, ...}, objective=...).")
        if engine != "inprocess":
            raise ValueError("A network with its own data runs in this process "
                             "(engine='inprocess'); over Flower, register it as a task "
                             "(fedbn_med.register_task) so that each site process can "
                             "build it.")
        launch = _model_launch(what, sites, objective, experiment, settings)
        return run_inprocess(launch, tracking_uri=tracking_uri, workdir=_folder(folder),
                             progress=progress)
    if sites is not None and not isinstance(sites, Mapping):
        settings["sites"] = tuple(sites)  # a task's run names its sites
        sites = None
    if sites is not None or objective is not None:
        raise ValueError("A task builds its own sites and objective: name its sites "
                         "(sites=('A', 'B')); give site data and objective= only with a "
                         "network.")
    if isinstance(what, str):
        return _run_specs([RunSpec.for_task(what, **settings)], engine, tracking_uri, folder,
                          progress, data, server, workers, one=True)[0]
    if isinstance(what, RunSpec):
        spec = what.replace(**settings) if settings else what
        return _run_specs([spec], engine, tracking_uri, folder, progress, data, server,
                          workers, one=True)[0]
    if isinstance(what, Sequence):
        specs = [s for s in what if isinstance(s, RunSpec)]
        if len(specs) != len(what):
            raise TypeError("A comparison is a sequence of RunSpecs; it holds "
                            f"{sorted({type(s).__name__ for s in what})}.")
        if not specs:
            raise ValueError("A comparison needs at least one run spec; none was given.")
        specs = [s.replace(**settings) if settings else s for s in specs]
        return _run_specs(specs, engine, tracking_uri, folder, progress, data, server,
                          workers, one=False)
    raise TypeError(f"run takes a RunSpec, a task name, a torch.nn.Module or a sequence of "
                    f"RunSpecs, got {type(what).__name__}.")


def _folder(folder: Path | None) -> Path:
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="fedbn-med-run-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _run_specs(specs: list[RunSpec], engine: str, tracking_uri: str | None,
               folder: Path | None, progress: bool, data: Mapping[str, Any] | None,
               server: Mapping[str, Any] | None, workers: int | None, *, one: bool
               ) -> list[FederationResult]:
    """Run specs on ``engine``; one result per spec, in order.

    A strategy that trains on every site's data (Centralized) runs in this process
    whatever the engine (logged to the same store as the Flower runs). A comparison
    (``one`` false) in this process of a task with subject-level cells runs each cell's
    methods on the same subjects, and keeps each test subject's prediction
    (:func:`fedbn_med.evaluation.parallel.run_cells`).
    """
    if one and workers is not None:
        raise ValueError("workers= runs a comparison's cells at once; one run has none.")
    if engine == "flower":
        folder = _folder(folder)
        tracking_uri = tracking_uri or f"sqlite:///{folder / 'mlflow.db'}"
    local = [i for i, s in enumerate(specs)
             if engine == "inprocess" or s.strategy_obj().reads_every_site]
    federated = [i for i in range(len(specs)) if i not in local]
    out: dict[int, FederationResult] = {}
    if federated:  # Flower loads only here: a second's import an in-process run skips
        assert folder is not None and tracking_uri is not None
        out.update(zip(federated, run_on_flower([specs[i] for i in federated], folder,
                                                tracking_uri, progress=progress,
                                                server=server)))
    if not one and engine == "inprocess" and _has_cells(specs[0].task):
        from tqdm.auto import tqdm

        from fedbn_med.evaluation.parallel import default_workers, run_cells

        if data is not None:
            raise ValueError("A comparison's cells prepare their own subjects; data= goes "
                             "with one run.")
        cells = [specs[i] for i in local]
        with tqdm(total=len(cells), desc="compare", unit="run", disable=not progress) as bar:
            out.update(zip(local, run_cells(cells, workers=workers or default_workers(cells),
                                            tracking_uri=tracking_uri, on_cell=bar.update)))
    else:
        for i in local:
            out[i] = run_inprocess(spec_launch(specs[i], data=data), tracking_uri=tracking_uri,
                                   workdir=_folder(folder) if one else None,
                                   progress=progress)
    return [out[i] for i in range(len(specs))]


def _has_cells(task: str) -> bool:
    from fedbn_med.evaluation.cell_data import has_cells

    return has_cells(task)


_MODEL_DEFAULTS: dict[str, Any] = {"strategy": "fedbn", "rounds": 5, "lr": 1e-3,
                                   "batch_size": 4, "local_epochs": 1, "seed": 0,
                                   "mu": None, "device": "auto", "weighting": "samples"}


def _model_launch(model: nn.Module, sites: Mapping[str, Any], objective: Objective,
                  experiment: str, settings: Mapping[str, Any]) -> Launch:
    """Return the federation of a copy of ``model`` at every site."""
    from fedbn_med.api.sites import site_trainer  # imports MONAI: a task's run needs none

    unknown = sorted(set(settings) - set(_MODEL_DEFAULTS))
    if unknown:
        raise ValueError(f"Unknown setting(s) {', '.join(unknown)} for a network's run. "
                         f"Valid: {', '.join(sorted(_MODEL_DEFAULTS))}.")
    if not sites:
        raise ValueError("A federation needs at least one site; sites is empty.")
    values = {**_MODEL_DEFAULTS, **settings}
    trainers = {name: site_trainer(
        str(name), copy.deepcopy(model), data, objective, strategy=values["strategy"],
        mu=values["mu"], lr=values["lr"], batch_size=values["batch_size"],
        local_epochs=values["local_epochs"], seed=values["seed"], device=values["device"])
        for name, data in sites.items()}
    first = next(iter(trainers.values()))
    pooled = None
    if first.strategy.pooled:
        pooled_of = getattr(type(first.data), "pooled", None)
        if pooled_of is None:
            raise ValueError(f"Strategy '{first.strategy.name}' pools the sites' training "
                             f"data; {type(first.data).__name__} has no pooled().")
        pooled = first.derive("pooled", pooled_of([t.data for t in trainers.values()]))
    params = {k: v for k, v in values.items() if v is not None}
    params.update(model=type(model).__name__, objective=type(objective).__name__)
    rounds = int(values["rounds"])

    def go(on_round: RoundCallback | None = None) -> History:
        return run_in_process(trainers, first.strategy, rounds, pooled=pooled,
                              on_round=on_round, weighting=values["weighting"])

    return Launch(lambda: Sites(go, first.kept), first.strategy.label,
                  tuple(str(s) for s in trainers), experiment, params, {"task": "own-model"},
                  name=first.strategy.label, rounds=rounds)
