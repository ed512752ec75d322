"""What a run leaves behind: its events, its checkpoints, its MLflow runs and its results.

A round is complete when its evaluation is in (it comes with the next round's replies);
its rows go to MLflow in batches on the tracking thread, and the checkpoint written after
every round holds every completed row, so a crash loses none.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Collection, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from fedbn_med.background import SerialWorker
from fedbn_med.checkpoint import load_tensors, save_tensors, write_text_atomic
from fedbn_med.evaluation.report import convergence_plot, metrics_at, run_result
from fedbn_med.evaluation.selection import Rule, RunningBest, select_round
from fedbn_med.federation.events import (
    Done,
    Event,
    Round,
    TrackingReady,
    TrackingWarm,
    append_event,
)

if TYPE_CHECKING:
    import torch

    from fedbn_med.tracking import FederationTracker

__all__ = ["Resumed", "RunRecorder", "resume_point", "warm_up_tracking"]

logger = logging.getLogger("fedbn_med.server")

#: A round's training metrics per site (the checkpoint's ``pending``).
Fits = dict[str, dict[str, float]]


@dataclass
class Resumed:
    """What a checkpoint gives back to go on after a crash."""

    round: int
    tensors: dict[str, torch.Tensor]
    pending: Fits
    norm_reference: float
    parent_run_id: str | None


class RunRecorder:
    """Write a run's events, checkpoints, MLflow runs and results; own its rows.

    Parameters
    ----------
    workdir : Path
        The run's folder: ``progress.jsonl``, ``server/global.safetensors``,
        ``results.json`` and ``convergence.png`` go there.
    tracking_uri : str or None
        The MLflow store (None: MLflow's default).
    rule : Rule, optional
        The task's selection rule (``Task.selection``; None: the lowest mean validation
        loss): the selected round whose weights are kept and whose scores are the result.
    """

    def __init__(self, workdir: Path, tracking_uri: str | None = None,
                 rule: Rule | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.progress = self.workdir / "progress.jsonl"
        self.checkpoint = self.workdir / "server" / "global.safetensors"
        #: the shared weights of the best round so far, the weights its scores are of
        self.selected = self.workdir / "server" / "selected.safetensors"
        self.rule = rule
        self.running = RunningBest.by(rule)
        self.tracking_uri = tracking_uri
        self.rows: list[dict[str, object]] = []  # every completed round, one row per site
        self.tracker: FederationTracker | None = None
        self._tracking = ExitStack()  # the open MLflow runs (fedbn_med.tracking.tracked)
        self.worker: SerialWorker | None = None
        self._unlogged: list[tuple[int, Fits]] = []
        self._handed_over = time.monotonic()

    # -- events --------------------------------------------------------------------------
    def event(self, event: Event) -> None:
        """Append one event to ``progress.jsonl`` (from any thread)."""
        append_event(self.progress, event)

    # -- tracking ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the tracking thread and open the store on it (its first use is slow)."""
        self.worker = SerialWorker()
        self.worker.submit(self._warm_up)

    def _warm_up(self) -> None:
        warm_up_tracking(self.tracking_uri)
        self.event(TrackingWarm())  # made now, so its time is when the store opened

    def open_tracking(self, experiment: str, label: str, params: Mapping[str, object],
                      sites: list[str], parent_run_id: str | None,
                      start_time: int | None = None) -> None:
        """Create the run's MLflow runs (or reopen a resumed run's), catching up on rows.

        ``start_time`` (ms since the epoch): when new runs start (default: now).
        """
        self._worker().flush()
        from fedbn_med.tracking import tracked

        self.tracker = self._tracking.enter_context(tracked(
            experiment, label, dict(params), sites, tracking_uri=self.tracking_uri,
            parent_run_id=parent_run_id, start_time=start_time))
        if parent_run_id is not None:
            # Rounds the checkpoint holds but the store missed (logging runs behind the
            # rounds), then a round that may have been logged in part before the crash.
            caught_up = self.tracker.log_missing_rounds(self.rows)
            if caught_up:
                logger.info("Logged rounds %s to MLflow from the checkpoint", caught_up)
            self.tracker.dedupe_next = True
        self.event(TrackingReady())

    def close(self, error: BaseException | None = None) -> None:
        """Run what the tracking thread holds, stop it, and end any MLflow run still open.

        ``error`` is what stopped the run (None: nothing); runs that :meth:`finish` did
        not close end ``FAILED`` (``KILLED`` when interrupted), as
        :func:`fedbn_med.tracking.tracked` decides.
        """
        try:
            if self.worker is not None:
                self.worker.close()
        except BaseException as err:
            self._end_tracking(error or err)
            raise
        self._end_tracking(error)

    def _end_tracking(self, error: BaseException | None) -> None:
        if error is None:
            self._tracking.close()
        else:
            self._tracking.__exit__(type(error), error, error.__traceback__)

    def _worker(self) -> SerialWorker:
        if self.worker is None:
            raise RuntimeError("The recorder's tracking thread is not started (call start).")
        return self.worker

    def _tracker(self) -> FederationTracker:
        if self.tracker is None:
            raise RuntimeError("The run's MLflow runs are not open (call open_tracking).")
        return self.tracker

    # -- rounds --------------------------------------------------------------------------
    def complete(self, rnd: int, fits: Mapping[str, Mapping[str, float]],
                 evals: Mapping[str, Mapping[str, float]]) -> None:
        """Record round ``rnd``: its training metrics and the scores of its model."""
        round_metrics = {site: {**fits[site], **evals.get(site, {})} for site in fits}
        self.rows = [r for r in self.rows if r["round"] != rnd]
        for site, metrics in round_metrics.items():
            self.rows.append({"round": rnd, "site": site, **metrics})
        self._unlogged.append((rnd, round_metrics))
        self._hand_over_logging()
        self.event(Round(round=rnd, sites=round_metrics))

    def start_afresh(self) -> None:
        """Forget a selected model left in this workdir by an earlier run (not resumed)."""
        self.selected.unlink(missing_ok=True)

    def keep_if_best(self, rnd: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Keep ``weights``, those round ``rnd``'s scores are of, if ``rnd`` is the best yet.

        Written atomically beside the checkpoint, so a resumed run keeps it; the run's
        end logs it as the selected model (``model/selected``).
        """
        metrics = [r for r in self.rows if r["round"] == rnd]
        if weights and self.running.take(rnd, metrics):
            save_tensors(self.selected, dict(weights), {"round": rnd})

    def _hand_over_logging(self, now: bool = False, every: float = 2.0) -> None:
        # Rounds go to MLflow in batches, every ``every`` seconds, on the tracking thread:
        # the store sees each round within seconds, and a round never waits for it. What
        # a crash leaves unlogged is in the checkpoint and logged on resume.
        if self._unlogged and (now or time.monotonic() - self._handed_over >= every):
            self._worker().submit(self._tracker().log_rounds, list(self._unlogged))
            self._unlogged.clear()
            self._handed_over = time.monotonic()

    def save(self, rnd: int, tensors: Mapping[str, torch.Tensor], pending: Fits,
             strategy: str, norm_reference: float) -> None:
        """Write the checkpoint of round ``rnd``, atomically: a crash leaves the last whole.

        It holds everything needed to go on: the global weights (and control variates),
        the training metrics of ``rnd`` whose evaluation comes with the next round, every
        completed row and the MLflow run to log into.
        """
        save_tensors(self.checkpoint, dict(tensors),
                     {"round": rnd, "parent_run_id": self._tracker().parent_id,
                      "rows": self.rows, "pending": pending, "strategy": strategy,
                      "norm_reference": norm_reference})

    def resume(self) -> Resumed:
        """Load the last checkpoint and take back its rows.

        Raises
        ------
        FileNotFoundError
            When there is no checkpoint.
        ValueError
            When its metadata is damaged (:func:`resume_point`).
        """
        if not self.checkpoint.exists():
            raise FileNotFoundError(
                f"--resume was given but there is no checkpoint at {self.checkpoint}.")
        tensors, meta = load_tensors(self.checkpoint)
        done, reference = resume_point(meta, self.checkpoint)
        self.rows = list(cast("list[dict[str, object]]", meta.get("rows", [])))
        for rnd in sorted({int(r["round"]) for r in self.rows}):  # type: ignore[call-overload]
            self.running.take(rnd, [r for r in self.rows if r["round"] == rnd])
        return Resumed(done, tensors, dict(cast(Fits, meta.get("pending", {}))), reference,
                       str(meta.get("parent_run_id") or "") or None)

    def _selected_round(self) -> int | None:
        """Return the round of the kept selected weights (None: none kept, or unreadable)."""
        if not self.selected.exists():
            return None
        try:
            rnd = load_tensors(self.selected)[1].get("round")
        except (OSError, ValueError) as err:
            logger.warning("The selected round's weights %s are unreadable (%s): only the "
                           "last round's are saved.", self.selected, err)
            return None
        return rnd if isinstance(rnd, int) and not isinstance(rnd, bool) else None

    # -- the end -------------------------------------------------------------------------
    def finish(self, strategy: str, rounds: int, sites: Collection[str],
               weights: Mapping[str, torch.Tensor], private: Collection[str]) -> None:
        """Write ``results.json`` and the plot, finish the MLflow runs, then say Done.

        ``weights`` are the final shared weights (logged, never a key of ``private``).
        """
        tracker = self._tracker()
        self._hand_over_logging(now=True)
        self._worker().flush()
        final = metrics_at(self.rows, rounds, tuple(sites))
        # The run's result is the round the task's rule selects (the lowest mean validation
        # loss unless the task says otherwise), as in process; the last round's beside it.
        chosen = select_round(self.rows, self.rule) if self.rows else 0
        kept = self._selected_round() if weights else None
        note = (f" Each site keeps its private layers of round {chosen} beside its state "
                f"(<site>.round-{chosen}.safetensors)." if private and kept == chosen else "")
        result = run_result(self.rows, tuple(sites), weights_round=rounds if weights else None,
                            selected_weights_round=kept, private_note=note,
                            rule=self.rule) if self.rows else None
        table = result.table if result is not None else "No round completed."
        results = {"strategy": strategy, "rounds": rounds, "rows": self.rows, "final": final,
                   "table": table,
                   "selected": result.selected if result is not None else {},
                   "selected_round": result.selected_round if result is not None else 0,
                   "last_round": result.last_round if result is not None else 0,
                   "parent_run_id": tracker.parent_id, "tracking_uri": tracker.tracking_uri}
        write_text_atomic(self.workdir / "results.json",
                          json.dumps(results, default=float, indent=1))
        tracker.log_text(table + "\n", "results.md")
        if result is not None:
            tracker.log_result(self.rows, result.selected_round, result.last_round)
        plot = convergence_plot({strategy: self.rows},  # type: ignore[dict-item]
                                self.workdir / "convergence.png",
                                title=f"{strategy}, {len(final)} sites")
        tracker.log_file(plot)
        if weights:
            tracker.log_shared_weights(dict(weights), private)
        if kept is not None and kept == chosen and kept != rounds:
            tracker.log_shared_weights(load_tensors(self.selected)[0], private,
                                       "model/selected")
        self._tracking.close()  # the runs end FINISHED
        self.event(Done(table=table))


def resume_point(meta: Mapping[str, object], path: Path) -> tuple[int, float]:
    """Return the rounds a checkpoint has completed and its outlier-rule reference.

    Raises
    ------
    ValueError
        If the checkpoint's metadata holds anything else, naming the file and the value.
    """
    done = meta.get("round")
    if isinstance(done, bool) or not isinstance(done, int) or done < 0:
        raise ValueError(f"Checkpoint {path}: 'round' must be the number of rounds "
                         f"completed, a whole number from 0, got {done!r}.")
    reference = meta.get("norm_reference", 0.0)
    if isinstance(reference, bool) or not isinstance(reference, (int, float)) \
            or not math.isfinite(reference) or reference < 0:
        raise ValueError(f"Checkpoint {path}: 'norm_reference' must be a finite number "
                         f"from 0, got {reference!r}.")
    return done, float(reference)


def warm_up_tracking(tracking_uri: str | None) -> None:
    """Open the tracking store once before the first round (its first use is slow)."""
    from fedbn_med.tracking import warm_up

    warm_up(tracking_uri)
