"""The two engines behind :func:`fedbn_med.run`: this process, and Flower on this host.

:func:`run_inprocess` runs a :class:`Launch` (a spec's federation, built through its task,
or a researcher's own trainers) round by round in this process, with a progress bar, its
MLflow record on a thread of its own, and the selected round's weights written where
asked. :func:`run_on_flower` runs specs over a SuperLink and one process per site. Both
return :class:`~fedbn_med.api.result.FederationResult`; the command line, the
comparisons, the benchmarks and the library all reach them through :func:`fedbn_med.run`
(a comparison's worker processes call :func:`run_inprocess` for each of their runs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedbn_med.api.result import FederationResult
from fedbn_med.background import SerialWorker
from fedbn_med.checkpoint import save_tensors

if TYPE_CHECKING:
    from fedbn_med.evaluation.cell_data import PreparedSite
    from fedbn_med.evaluation.keeping import BestRoundKeeper
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.sites import SiteConfig
    from fedbn_med.tracking import FederationTracker
    from fedbn_med.training.inprocess import History, RoundCallback

__all__ = ["LOG_EVERY_S", "Launch", "Sites", "run_inprocess", "run_on_flower", "spec_launch"]

logger = logging.getLogger(__name__)

#: Seconds between two writes of a run's per-round metrics to MLflow (and one at the end).
LOG_EVERY_S = 5.0


@dataclass(frozen=True)
class Sites:
    """A federation's sites, built and ready to run.

    Attributes
    ----------
    go : callable
        Runs every round, calling its argument after each (``(round, {site: metrics})``),
        and returns the :class:`~fedbn_med.training.inprocess.History`.
    kept : frozenset of str
        The keys each site keeps home (its BN layers under FedBN).
    keeper : BestRoundKeeper, optional
        Keeps each site's test predictions at the selected round (a comparison's cell).
    prepared : mapping, optional
        The cell's sites as the run's features made them (subject counts).
    """

    go: Callable[[RoundCallback | None], History]
    kept: frozenset[str]
    keeper: BestRoundKeeper | None = None
    prepared: Mapping[str, PreparedSite] | None = None


@dataclass(frozen=True)
class Launch:
    """A federation to run in this process, and how its MLflow record is named.

    Attributes
    ----------
    build : callable
        Builds the sites (:class:`Sites`): seconds of data loading, during which the
        MLflow record opens on a thread of its own.
    label, sites : str, tuple of str
        The strategy's label, the sites in order.
    experiment, params, tags
        The MLflow experiment, the parent run's parameters and tags.
    name : str
        How a warning names the run.
    rounds : int, optional
        The rounds to come (the progress bar's length).
    """

    build: Callable[[], Sites]
    label: str
    sites: tuple[str, ...]
    experiment: str
    params: Mapping[str, object]
    tags: Mapping[str, str]
    name: str = ""
    rounds: int | None = None


def spec_launch(spec: RunSpec, *, data: Mapping[str, Any] | None = None,
                prepared: Mapping[str, PreparedSite] | None = None,
                site_files: Mapping[str, SiteConfig] | None = None) -> Launch:
    """Return ``spec``'s federation, every site to be built through its task.

    ``data`` replaces each site's data (a benchmark's subsample of the task's
    ``site_data``); ``prepared`` (a comparison's cell, with its ``site_files``) trains on
    the cell's subjects through the spec's own feature chain and keeps each test
    subject's prediction at the selected round.
    """
    from fedbn_med.tasks import get_task

    if prepared is not None and data is not None:
        raise ValueError("Give a run either its sites' data or a comparison cell's "
                         "prepared sites, not both.")

    def build() -> Sites:
        from fedbn_med.training.inprocess import build_federation

        if prepared is None:
            federation = build_federation(spec, data)
            return Sites(federation.run, federation.kept)
        from fedbn_med.evaluation.keeping import keeping_federation

        federation, keeper, made = keeping_federation(spec, prepared, site_files)
        return Sites(federation.run, federation.kept, keeper, made)

    return Launch(build, spec.label, spec.sites, get_task(spec.task).experiment,
                  {**spec.params(), "engine": "inprocess"}, {"task": spec.task},
                  name=f"{spec.label} fold {spec.fold} seed {spec.seed}", rounds=spec.rounds)


def run_inprocess(launch: Launch, *, tracking_uri: str | None = None,
                  workdir: Path | None = None, progress: bool = False,
                  on_round: RoundCallback | None = None) -> FederationResult:
    """Run ``launch`` in this process; track it in MLflow when ``tracking_uri`` is given.

    The parent run gets the rounds (in batches every :data:`LOG_EVERY_S` seconds), the
    headline at the selected round (:meth:`~fedbn_med.tracking.FederationTracker.log_result`),
    the results table, and the shared weights of the last and the selected round
    (``model``, ``model/selected``). With ``workdir``, the selected round's shared weights
    (``shared.selected.safetensors``) and each site's kept layers
    (``<site>.selected.safetensors``, never logged to MLflow) are written there.
    """
    from tqdm.auto import tqdm

    from fedbn_med.evaluation.report import progress_postfix

    started = int(time.time() * 1000)  # the runs start when the run did
    record = None if tracking_uri is None else _Record(lambda: _open_runs(
        launch, tracking_uri, started))
    try:
        built = launch.build()
        with tqdm(total=launch.rounds, desc=launch.label, unit="round", disable=not progress,
                  dynamic_ncols=True) as bar:
            # Rounds reach MLflow in batches: one write per round cost about as much as
            # the round's training on small models.
            pending: list[tuple[int, Mapping[str, Mapping[str, float]]]] = []
            last_write = [time.monotonic()]

            def flush() -> None:
                if record is not None and pending:
                    record.submit(lambda tracker, rounds: tracker.log_rounds(rounds),
                                  list(pending))
                pending.clear()
                last_write[0] = time.monotonic()

            def each(rnd: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
                if record is not None:
                    pending.append((rnd, {site: dict(m) for site, m in metrics.items()}))
                    if time.monotonic() - last_write[0] >= LOG_EVERY_S:
                        flush()
                if built.keeper is not None:
                    built.keeper(rnd, metrics)
                if on_round is not None:
                    on_round(rnd, metrics)
                bar.set_postfix(progress_postfix(metrics), refresh=False)
                bar.update(1)

            history = built.go(each)
        flush()
        result = history.result()
        selected = bool(history.selected_weights) and (
            history.selected_round == result.selected_round)
        run_id = None
        if record is not None:
            tracker = record.tracker()
            run_id = tracker.parent_id
            tracker.log_text(result.table + "\n", "results.md")
            tracker.log_result(history.rows, result.selected_round, result.last_round)
            if history.global_weights:
                tracker.log_shared_weights(history.global_weights, built.kept)
            if selected:
                tracker.log_shared_weights(history.selected_weights, built.kept,
                                           "model/selected")
        shared, kept = (_write_selected(history, selected, launch.sites, built.kept, workdir,
                                        run_id) if workdir is not None else (None, {}))
    except BaseException as err:
        if record is not None:
            record.close(err)
        raise
    if record is not None:
        record.close()
    if shared is None and selected and run_id is not None:
        shared = f"runs:/{run_id}/model/selected"
    predictions: dict[str, Any] = {}
    n_train = n_test = 0
    if built.keeper is not None and built.keeper.best != result.selected_round:
        logger.warning("%s: predictions were kept at round %d, the result's round is %d: "
                       "they are left out.", launch.name, built.keeper.best,
                       result.selected_round)
    elif built.keeper is not None:
        predictions = dict(built.keeper.predictions)
    if built.prepared is not None:
        from fedbn_med.evaluation.keeping import subject_counts

        n_train, n_test = subject_counts(built.prepared)
    return FederationResult(
        strategy=history.strategy, sites=launch.sites, rows=tuple(history.rows),
        selected_round=result.selected_round, last_round=result.last_round,
        selected=result.selected, last=result.last, table=result.table,
        shared_weights=shared, kept_weights=kept, run_id=run_id, tracking_uri=tracking_uri,
        engine="inprocess", predictions=predictions, n_train=n_train, n_test=n_test,
        one_class=tuple(result.one_class))


def _open_runs(launch: Launch, tracking_uri: str, started: int
               ) -> AbstractContextManager[FederationTracker]:
    from fedbn_med.tracking import tracked  # imports MLflow: on the record's thread

    return tracked(launch.experiment, launch.label, launch.params, launch.sites,
                   tracking_uri=tracking_uri, tags=launch.tags, start_time=started)


def _write_selected(history: History, selected: bool, sites: Sequence[str],
                    kept_keys: frozenset[str], workdir: Path, run_id: str | None
                    ) -> tuple[str | None, dict[str, Path]]:
    """Write the selected round's shared weights and each site's kept layers.

    Only when ``selected``: the run kept the weights of the round its result reports.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    for site in sites:  # never leave an earlier run's file beside this one's
        (workdir / f"{site}.selected.safetensors").unlink(missing_ok=True)
    (workdir / "shared.selected.safetensors").unlink(missing_ok=True)
    if not selected:
        return None, {}
    leaked = set(history.selected_weights) & kept_keys
    if leaked:  # the server never holds a kept key; neither does the shared file
        raise RuntimeError(f"Shared weights hold kept keys: {sorted(leaked)[:5]}.")
    meta = {"round": history.selected_round, "strategy": history.strategy,
            "mlflow_run_id": run_id}
    shared = save_tensors(workdir / "shared.selected.safetensors", history.selected_weights,
                          meta)
    kept = {site: save_tensors(workdir / f"{site}.selected.safetensors", tensors, meta)
            for site, tensors in history.selected_kept.items() if tensors}
    return str(shared), kept


class _Record:
    """A run's MLflow runs, opened and written in order on a thread of their own.

    ``opener`` returns the runs' context (:func:`fedbn_med.tracking.tracked`), entered on
    the thread (:class:`fedbn_med.background.SerialWorker`) while the sites build and
    train. :meth:`submit` queues a call on the open tracker; :meth:`tracker` waits for
    every call and raises what one met; :meth:`close` ends the runs as
    :func:`~fedbn_med.tracking.tracked` does, FAILED when given an error.
    """

    def __init__(self, opener: Callable[[], AbstractContextManager[FederationTracker]]
                 ) -> None:
        self._runs = ExitStack()
        self._worker = SerialWorker("fedbn-tracking")
        self._open: list[FederationTracker] = []
        self._worker.submit(lambda: self._open.append(self._runs.enter_context(opener())))

    def submit(self, fn: Callable[..., object], *args: object) -> None:
        """Queue ``fn(tracker, *args)``; raise now if an earlier call failed."""
        self._worker.submit(lambda: fn(self._open[0], *args))

    def tracker(self) -> FederationTracker:
        """Wait for every queued call; return the open tracker (raise what a call met)."""
        self._worker.flush()
        return self._open[0]

    def close(self, error: BaseException | None = None) -> None:
        """Run what is queued, stop the thread and end the runs (FAILED on ``error``)."""
        try:
            self._worker.close()
        except Exception:
            if error is None:
                raise  # else the run's own error is the one to report
        finally:
            if error is None:
                self._runs.close()
            else:
                self._runs.__exit__(type(error), error, error.__traceback__)


def run_on_flower(specs: Sequence[RunSpec], workdir: Path, tracking_uri: str, *,
                  progress: bool = False, server: Mapping[str, Any] | None = None
                  ) -> list[FederationResult]:
    """Run ``specs`` over one local Flower federation (a SuperLink, a process per site).

    The processes start once and serve every spec in turn
    (:func:`fedbn_med.federation.run.run_flower`); ``server`` are further
    :class:`~fedbn_med.federation.config.ServerSettings` fields (``secagg=True``,
    ``round_timeout``). Each result points at its run's files under ``workdir``: the
    server's selected shared weights and each site's kept layers of that round.
    """
    started_ms = int(time.time() * 1000)  # the first run's MLflow runs start now
    from fedbn_med.federation.run import FlowerOptions, run_flower

    options = FlowerOptions.local(workdir, tracking_uri, progress=progress,
                                  **{"started_ms": started_ms, **(server or {})})
    results = []
    for spec, values in zip(specs, run_flower(specs, options)):
        selected = Path(values["run_dir"]) / "server" / "selected.safetensors"
        results.append(FederationResult.from_mapping(
            {**values, "tracking_uri": values.get("tracking_uri", tracking_uri)}, spec.sites,
            engine="flower", shared_weights=str(selected) if selected.is_file() else None,
            kept_weights={s: Path(p) for s, p in values["kept_files"].items()}))
    return results
