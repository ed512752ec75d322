"""Each round's metrics to MLflow (off the round's path), and the run's results at the end."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from flwr.app import MessageType

from fedbn_med.checkpoint import save_tensors, write_text_atomic
from fedbn_med.evaluation.report import convergence_plot, metrics_at, run_result
from fedbn_med.federation.records import unpack
from fedbn_med.federation.server.checks import evaluate_reason
from fedbn_med.fl.scaffold import join_controls

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from fedbn_med.federation.config import ServerSettings
    from fedbn_med.federation.server.background import SerialWorker
    from fedbn_med.federation.server.grid import FastGrid
    from fedbn_med.fl.partition import Partition
    from fedbn_med.fl.strategies import Strategy
    from fedbn_med.spec import RunSpec
    from fedbn_med.tracking import FederationTracker

__all__ = ["RunResults", "warm_up_tracking"]

logger = logging.getLogger("fedbn_med.server")


class RunResults:
    """The part of :class:`~fedbn_med.federation.server.FederationServer` that records.

    A round is complete when its evaluation is in (it comes with the next round's
    replies); its rows go to MLflow in batches on the tracking thread, and the checkpoint
    written after every round holds every completed row, so a crash loses none.
    """

    grid: FastGrid
    config: RunSpec
    settings: ServerSettings
    strategy: Strategy
    partition: Partition
    global_weights: dict[str, torch.Tensor]
    control: dict[str, torch.Tensor]
    scores: frozenset[str]
    norm_reference: float
    rows: list[dict[str, object]]
    workdir: Path
    checkpoint: Path
    tracker: FederationTracker | None
    worker: SerialWorker | None
    _unlogged: list[tuple[int, dict[str, dict[str, float]]]]
    _handed_over: float

    def _event(self, **event: object) -> None:
        raise NotImplementedError

    def _live_nodes(self, connected: object = None) -> dict[int, str]:
        raise NotImplementedError

    def _messages(self, nodes: object, mtype: str, rnd: int, evaluate_first: bool) -> list:
        raise NotImplementedError

    def _complete(self, rnd: int, fits: Mapping[str, Mapping[str, float]],
                  evals: Mapping[str, Mapping[str, float]]) -> None:
        round_metrics = {site: {**fits[site], **evals.get(site, {})} for site in fits}
        self.rows = [r for r in self.rows if r["round"] != rnd]
        for site, metrics in round_metrics.items():
            self.rows.append({"round": rnd, "site": site, **metrics})
        self._unlogged.append((rnd, round_metrics))
        self._hand_over_logging()
        self._event(event="round", round=rnd, sites=round_metrics)

    def _hand_over_logging(self, now: bool = False, every: float = 2.0) -> None:
        # Rounds go to MLflow in batches, every ``every`` seconds, on the tracking thread:
        # the store sees each round within seconds, and a round never waits for it. What
        # a crash leaves unlogged is in the checkpoint and logged on resume.
        if self._unlogged and (now or time.monotonic() - self._handed_over >= every):
            assert self.tracker is not None and self.worker is not None
            self.worker.submit(self.tracker.log_rounds, list(self._unlogged))
            self._unlogged.clear()
            self._handed_over = time.monotonic()

    def _save_checkpoint(self, rnd: int, fits: Mapping[str, Mapping[str, float]]) -> None:
        # Everything needed to go on after a crash: the global weights of round ``rnd``,
        # the training metrics of ``rnd`` whose evaluation comes with the next round, and
        # the MLflow run to log into. Written atomically: a crash leaves the last one whole.
        assert self.tracker is not None
        save_tensors(self.checkpoint, join_controls(self.global_weights, self.control),
                     {"round": rnd, "parent_run_id": self.tracker.parent_id,
                      "rows": self.rows, "pending": fits, "strategy": self.strategy.label,
                      "norm_reference": self.norm_reference})

    def _close(self, pending: dict[str, dict[str, float]]) -> None:
        nodes = self._live_nodes()
        replies = self.grid.send(
            self._messages(nodes, MessageType.EVALUATE, self.config.rounds, False),
            timeout=self.settings.round_timeout,
        )
        evals = {}
        for reply in replies:
            site = nodes.get(reply.metadata.src_node_id)
            if site is not None and not reply.has_error():
                try:
                    payload = unpack(reply.content)
                    reason = evaluate_reason(payload.sections, self.scores)
                    if reason is not None:
                        raise ValueError(reason)
                    evals[site] = payload.floats("metrics")
                except Exception as err:  # one bad reply loses that site's scores only
                    why = (str(err) if isinstance(err, ValueError)
                           else f"{type(err).__name__}: {err}")[:500]
                    logger.warning("Final evaluation of site %s refused: %s", site, why)
                    self._event(event="evaluation-refused", site=site, reason=why)
        if pending:
            self._complete(self.config.rounds, pending, evals)
        assert self.tracker is not None and self.worker is not None
        self._hand_over_logging(now=True)
        self.worker.flush()
        final = metrics_at(self.rows, self.config.rounds, self.config.sites)
        # The run's result is the round of lowest mean validation loss over the sites
        # (the protocol's rule, as in-process); the last round's scores go beside it.
        result = run_result(self.rows, self.config.sites,
                            weights_round=self.config.rounds if self.global_weights else None
                            ) if self.rows else None
        table = result.table if result is not None else "No round completed."
        results = {"strategy": self.strategy.label, "rounds": self.config.rounds,
                   "rows": self.rows, "final": final, "table": table,
                   "selected": result.selected if result is not None else {},
                   "selected_round": result.selected_round if result is not None else 0,
                   "last_round": result.last_round if result is not None else 0,
                   "parent_run_id": self.tracker.parent_id,
                   "tracking_uri": self.tracker.tracking_uri}
        write_text_atomic(self.workdir / "results.json", json.dumps(results, default=float,
                                                                   indent=1))
        self.tracker.log_text(table + "\n", "results.md")
        if result is not None:
            self.tracker.log_metrics({"selected_round": result.selected_round})
        plot = convergence_plot({self.strategy.label: self.rows},  # type: ignore[dict-item]
                                self.workdir / "convergence.png",
                                title=f"{self.strategy.label}, {len(final)} sites")
        self.tracker.log_file(plot)
        if self.global_weights:
            self.tracker.log_shared_weights(
                self.global_weights,
                self.partition.private if self.strategy.keeps_private else ())
        self.tracker.finish()
        self._event(event="done", table=table)


def warm_up_tracking(tracking_uri: str | None) -> None:
    """Open the tracking store once before the first round (its first use is slow)."""
    from fedbn_med.tracking import warm_up

    warm_up(tracking_uri)
