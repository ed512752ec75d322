"""One call for a federation: :func:`run`, in this process or over Flower, tracked or not.

Two ways in:

- a registered task (its name, or a :class:`~fedbn_med.spec.RunSpec`): the task builds
  every site, and the run goes through the same engines as the command line
  (``engine="inprocess"`` or ``"flower"``);
- a researcher's own network and data (``run(model, sites, objective)``): every site
  trains a copy of ``model`` on its own data, in this process.

Either way the result is a :class:`~fedbn_med.api.result.FederationResult`, and the
run is logged to MLflow when ``tracking_uri`` is given.
"""

from __future__ import annotations

import copy
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from fedbn_med.api.result import FederationResult
from fedbn_med.api.sites import site_trainer
from fedbn_med.checkpoint import save_tensors
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import get_task
from fedbn_med.training.inprocess import History, run_in_process
from fedbn_med.training.objective import Objective

__all__ = ["ENGINES", "run"]

logger = logging.getLogger(__name__)

#: The engines :func:`run` drives.
ENGINES = ("inprocess", "flower")


def run(what: RunSpec | str | nn.Module,
        sites: Mapping[str, Any] | Sequence[str] | None = None,
        objective: Objective | None = None, *, engine: str = "inprocess",
        tracking_uri: str | None = None, workdir: str | Path | None = None,
        experiment: str = "fedbn-med", **settings: Any) -> FederationResult:
    """Run one federation and return its typed result.

    Parameters
    ----------
    what : RunSpec, str or torch.nn.Module
        A run spec; a registered task's name (its spec is
        ``RunSpec.for_task(name, **settings)``); or a network every site trains a copy of.
    sites : mapping of site name to site data, or sequence of str, optional
        With a network: each site's data (:func:`fedbn_med.image_site` of MONAI
        datasets, or :class:`fedbn_med.TensorSiteData`). With a task: the sites' names.
    objective : Objective, optional
        With a network only: the loss and the scores (:class:`fedbn_med.Segmentation`,
        :class:`fedbn_med.Classification`, ...).
    engine : {"inprocess", "flower"}
        With a task: this process, or a local Flower federation (a SuperLink and one
        process per site on 127.0.0.1). A network with its own data runs in process.
    tracking_uri : str, optional
        The MLflow store to log the run to (a parent run, a child run per site, the
        selected shared weights). None: not tracked (a Flower run is always tracked: in
        ``<workdir>/mlflow.db`` unless given).
    workdir : path, optional
        Where the selected round's weights are written (default: a new temporary folder).
    experiment : str
        The MLflow experiment of a network's run (a task's run uses the task's).
    **settings
        The run's settings: with a task's name, any :class:`RunSpec` field or task
        setting (``rounds=3``, ``strategy="fedavg"``); with a network, ``strategy``
        (``"fedbn"``), ``rounds`` (5), ``lr``, ``batch_size``, ``local_epochs``, ``seed``,
        ``mu``, ``device``, ``weighting``.

    Raises
    ------
    ValueError
        For an unknown engine, a network without sites or objective, or sites given with
        a task.
    TypeError
        When ``what`` is none of the three.
    """
    if engine not in ENGINES:
        raise ValueError(f"Unknown engine '{engine}'. Valid engines: {', '.join(ENGINES)}.")
    folder = Path(workdir) if workdir is not None else Path(
        tempfile.mkdtemp(prefix="fedbn-med-run-"))
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(what, nn.Module):
        if not isinstance(sites, Mapping) or objective is None:
            raise ValueError("A network runs on its sites' data with an objective: "
                             "run(model, sites={name: data, ...}, objective=...).")
        if engine != "inprocess":
            raise ValueError("A network with its own data runs in this process "
                             "(engine='inprocess'); over Flower, register it as a task "
                             "(fedbn_med.register_task) so that each site process can "
                             "build it.")
        return _run_model(what, sites, objective, folder, tracking_uri, experiment, settings)
    if sites is not None and not isinstance(sites, Mapping):
        settings["sites"] = tuple(sites)  # a task's run names its sites
        sites = None
    if sites is not None or objective is not None:
        raise ValueError("A task builds its own sites and objective: name its sites "
                         "(sites=('A', 'B')); give site data and objective= only with a "
                         "network.")
    if isinstance(what, str):
        spec = RunSpec.for_task(what, **settings)
    elif isinstance(what, RunSpec):
        spec = what.replace(**settings) if settings else what
    else:
        raise TypeError(f"run takes a RunSpec, a task name or a torch.nn.Module, got "
                        f"{type(what).__name__}.")
    if engine == "flower":
        return _run_flower(spec, folder, tracking_uri)
    return _run_spec(spec, folder, tracking_uri)


_MODEL_DEFAULTS: dict[str, Any] = {"strategy": "fedbn", "rounds": 5, "lr": 1e-3,
                                   "batch_size": 4, "local_epochs": 1, "seed": 0,
                                   "mu": None, "device": "auto", "weighting": "samples"}


def _run_model(model: nn.Module, sites: Mapping[str, Any], objective: Objective,
               folder: Path, tracking_uri: str | None, experiment: str,
               settings: Mapping[str, Any]) -> FederationResult:
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

    def go(on_round: Any = None) -> History:
        return run_in_process(trainers, first.strategy, int(values["rounds"]), pooled=pooled,
                              on_round=on_round, weighting=values["weighting"])

    return _tracked(go, first.strategy.label, tuple(trainers), first.kept, folder,
                    tracking_uri, experiment, params, {"task": "own-model"})


def _run_spec(spec: RunSpec, folder: Path, tracking_uri: str | None) -> FederationResult:
    from fedbn_med.training.inprocess import build_federation

    federation = build_federation(spec)

    def go(on_round: Any = None) -> History:
        return federation.run(on_round)

    return _tracked(go, spec.label, spec.sites, federation.kept, folder, tracking_uri,
                    get_task(spec.task).experiment, {**spec.params(), "engine": "inprocess"},
                    {"task": spec.task})


def _tracked(go: Any, label: str, sites: tuple[str, ...], kept: frozenset[str], folder: Path,
             tracking_uri: str | None, experiment: str, params: Mapping[str, object],
             tags: Mapping[str, str]) -> FederationResult:
    """Run ``go`` (tracked when ``tracking_uri``) and write the selected round's weights."""
    if tracking_uri is None:
        history = go()
        return _result(history, sites, kept, folder, None, None)
    from fedbn_med.tracking import tracked

    with tracked(experiment, label, params, sites, tracking_uri=tracking_uri,
                 tags=tags) as tracker:
        history = go(tracker.log_round)
        result = history.result()
        tracker.log_text(result.table + "\n", "results.md")
        tracker.log_metrics({"selected_round": result.selected_round})
        if history.selected_weights and history.selected_round == result.selected_round:
            tracker.log_shared_weights(history.selected_weights, kept, "model/selected")
        return _result(history, sites, kept, folder, tracker.parent_id, tracking_uri)


def _result(history: History, sites: tuple[str, ...], kept: frozenset[str], folder: Path,
            run_id: str | None, tracking_uri: str | None) -> FederationResult:
    result = history.result()
    shared: str | None = None
    files: dict[str, Path] = {}
    if history.selected_weights and history.selected_round == result.selected_round:
        meta = {"round": result.selected_round, "strategy": history.strategy,
                "mlflow_run_id": run_id}
        leaked = set(history.selected_weights) & set(kept)
        if leaked:  # the server never holds a kept key; neither does the shared file
            raise RuntimeError(f"Shared weights hold kept keys: {sorted(leaked)[:5]}.")
        shared = str(save_tensors(folder / "shared.selected.safetensors",
                                  history.selected_weights, meta))
        files = {site: save_tensors(folder / f"{site}.selected.safetensors", tensors, meta)
                 for site, tensors in history.selected_kept.items() if tensors}
    return FederationResult(
        strategy=history.strategy, sites=tuple(sites), rows=tuple(history.rows),
        selected_round=result.selected_round, last_round=result.last_round,
        selected=result.selected, last=result.last, table=result.table,
        shared_weights=shared, kept_weights=files, run_id=run_id, tracking_uri=tracking_uri)


def _run_flower(spec: RunSpec, folder: Path, tracking_uri: str | None) -> FederationResult:
    from fedbn_med.federation.run import FlowerOptions, run_flower

    uri = tracking_uri or f"sqlite:///{folder / 'mlflow.db'}"
    options = FlowerOptions.local(folder, uri, progress=False)
    values = run_flower([spec], options)[0]
    run_dir = next(iter(sorted(folder.glob("run-0-*"))), folder)
    selected = run_dir / "server" / "selected.safetensors"
    chosen = int(values.get("selected_round", 0))
    kept = {site: path for site in spec.sites  # each site keeps its selected round's layers
            for path in sorted(folder.rglob(f"{site}.round-{chosen}.safetensors"))[:1]}
    return FederationResult.from_mapping(
        values, spec.sites, engine="flower",
        shared_weights=str(selected) if selected.is_file() else None, kept_weights=kept)
