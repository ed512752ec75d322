"""Run a spec in this process with its MLflow record: what ``--engine inprocess`` does."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedbn_med.background import SerialWorker
from fedbn_med.spec import RunSpec

if TYPE_CHECKING:
    from fedbn_med.evaluation.cell_data import PreparedSite
    from fedbn_med.tasks.abide.sites import SiteConfig
    from fedbn_med.tracking import FederationTracker
    from fedbn_med.training.inprocess import History

__all__ = ["run_tracked"]

logger = logging.getLogger(__name__)

#: Seconds between two writes of a run's per-round metrics to MLflow (and one at the end).
LOG_EVERY_S = 5.0


def run_tracked(spec: RunSpec, *, tracking_uri: str | None = None, progress: bool = False,
                prepared: Mapping[str, PreparedSite] | None = None,
                sites: Mapping[str, SiteConfig] | None = None,
                workdir: Path | None = None) -> dict[str, Any]:
    """Run ``spec`` in this process, logging every round and the results to MLflow.

    Parameters
    ----------
    spec : RunSpec
        What to train.
    tracking_uri : str, optional
        MLflow store (default: :func:`fedbn_med.tracking.default_tracking_uri`).
    progress : bool
        Show a progress bar over the rounds.
    prepared : mapping, optional
        The sites' data of the spec's (fold, seed) cell
        (:func:`fedbn_med.evaluation.cell_data.prepare_sites`, ABIDE): the run trains on
        them through the spec's own feature chain, as a comparison's runs do, and keeps
        each test subject's prediction at the selected round (``--compare`` then gives the
        subject-level tests).
    sites : mapping of site name to SiteConfig, optional
        The site files of ``prepared`` (loaded from ``sites/`` when omitted).
    workdir : path, optional
        Where each site's kept layers of the selected round are written
        (``<site>.selected.safetensors``, as a site keeps them over Flower); with the
        shared weights logged as ``model/selected`` they make each site's selected
        model. They are never logged to MLflow: under FedBN they are the BN layers,
        which do not leave a site. A run that selects no round of shared weights
        (SingleSet: each site's model is its own) writes none, and so does a strategy
        whose sites keep no layer (FedAvg; ``fedavg_localbn`` re-estimates each site's
        BN statistics on its training data when it scores).

    Returns
    -------
    dict
        As the Flower engine returns: ``strategy``; ``selected`` (each site's metrics at
        ``selected_round``, the round of lowest mean validation loss over the sites: the
        run's result); ``final`` (each site's metrics at ``last_round``); ``table``
        (markdown: the selected round, the last round's scores beside it, the round of the
        saved weights and any site that predicts one class only); ``rows`` (every round and
        site) and ``parent_run_id`` (MLflow). With ``prepared``, also ``predictions``
        (each site's test subjects at the selected round), ``n_train`` and ``n_test``
        (subjects of every site outside and inside the test fold). With ``workdir``,
        ``kept_files``: the files written (none when no site keeps a layer).
    """
    from tqdm.auto import tqdm

    from fedbn_med.evaluation.report import progress_postfix
    from fedbn_med.tasks import get_task
    from fedbn_med.training.inprocess import run_spec

    task = get_task(spec.task)
    # MLflow opens its store (seconds: importing it, creating a new sqlite database) and
    # takes the rounds on a thread of its own while the sites build and train; the runs
    # start when the run did, however late the thread makes them.
    started = int(time.time() * 1000)

    def open_runs() -> AbstractContextManager[FederationTracker]:
        from fedbn_med.tracking import tracked  # imports MLflow: on the record's thread

        return tracked(task.experiment, spec.label, {**spec.params(), "engine": "inprocess"},
                       spec.sites, tracking_uri=tracking_uri, tags={"task": spec.task},
                       start_time=started)

    record = _Record(open_runs)
    try:
        with tqdm(total=spec.rounds, desc=spec.label, unit="round", disable=not progress,
                  dynamic_ncols=True) as bar:

            # Rounds reach MLflow in batches, every LOG_EVERY_S seconds and at the end: one
            # write per round cost about as much as the round's training on small models.
            pending: list[tuple[int, Mapping[str, Mapping[str, float]]]] = []
            last_write = [time.monotonic()]

            def flush() -> None:
                record.submit(lambda tracker, rounds: tracker.log_rounds(rounds),
                              list(pending))
                pending.clear()
                last_write[0] = time.monotonic()

            def on_round(rnd: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
                pending.append((rnd, {site: dict(m) for site, m in metrics.items()}))
                if time.monotonic() - last_write[0] >= LOG_EVERY_S:
                    flush()
                bar.set_postfix(progress_postfix(metrics), refresh=False)
                bar.update(1)

            keeper = None
            if prepared is None:
                history, kept = run_spec(spec, on_round=on_round)
            else:
                from fedbn_med.evaluation.keeping import keeping_federation

                federation, keeping, prepared = keeping_federation(spec, prepared, sites)
                keeper = keeping

                def keep(rnd: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
                    on_round(rnd, metrics)
                    keeping(rnd, metrics)

                history, kept = federation.run(on_round=keep), federation.kept
        flush()
        tracker = record.tracker()
        result = history.result()
        tracker.log_text(result.table + "\n", "results.md")
        tracker.log_result(history.rows, result.selected_round, result.last_round)
        if history.global_weights:
            tracker.log_shared_weights(history.global_weights, kept)
        if history.selected_weights and history.selected_round == result.selected_round:
            tracker.log_shared_weights(history.selected_weights, kept, "model/selected")
        files: list[Path] = []
        if workdir is not None:
            for site in spec.sites:  # never leave an earlier run's file beside this one's
                (workdir / f"{site}.selected.safetensors").unlink(missing_ok=True)
            if history.selected_round == result.selected_round:
                files = _save_kept(history, workdir, tracker.parent_id)
    except BaseException as err:
        record.close(err)
        raise
    record.close()
    out = {"strategy": history.strategy, "selected": result.selected,
           "selected_round": result.selected_round, "final": result.last,
           "last_round": result.last_round, "table": result.table, "rows": history.rows,
           "parent_run_id": tracker.parent_id}
    if workdir is not None:
        out["kept_files"] = files
    if keeper is not None and keeper.best != result.selected_round:
        logger.warning("%s fold %d seed %d: predictions were kept at round %d, the result's "
                       "round is %d: they are left out.", spec.label, spec.fold, spec.seed,
                       keeper.best, result.selected_round)
        keeper = None
    if keeper is not None and prepared is not None:
        from fedbn_med.evaluation.keeping import subject_counts

        n_train, n_test = subject_counts(prepared)
        out.update(predictions=keeper.predictions, n_train=n_train, n_test=n_test)
    return out


class _Record:
    """A run's MLflow runs, opened and written in order on a thread of their own.

    ``opener`` returns the runs' context (:func:`fedbn_med.tracking.tracked`), entered on
    the thread (:class:`fedbn_med.background.SerialWorker`). :meth:`submit` queues a call
    on the open tracker; :meth:`tracker` waits for every call and raises what one met;
    :meth:`close` ends the runs as :func:`~fedbn_med.tracking.tracked` does, FAILED when
    given an error.
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


def _save_kept(history: History, workdir: Path, run_id: str | None) -> list[Path]:
    """Write each site's kept layers of the selected round; return the files."""
    from fedbn_med.checkpoint import save_tensors

    meta = {"round": history.selected_round, "strategy": history.strategy,
            "mlflow_run_id": run_id}
    return [save_tensors(workdir / f"{site}.selected.safetensors", kept, meta)
            for site, kept in history.selected_kept.items() if kept]
