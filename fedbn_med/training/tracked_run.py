"""Run a spec in this process with its MLflow record: what ``--engine inprocess`` does."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fedbn_med.spec import RunSpec

__all__ = ["run_tracked"]

logger = logging.getLogger(__name__)


def run_tracked(spec: RunSpec, *, tracking_uri: str | None = None, progress: bool = False
                ) -> dict[str, Any]:
    """Run ``spec`` in this process, logging every round and the results to MLflow.

    Parameters
    ----------
    spec : RunSpec
        What to train.
    tracking_uri : str, optional
        MLflow store (default: :func:`fedbn_med.tracking.default_tracking_uri`).
    progress : bool
        Show a progress bar over the rounds.

    Returns
    -------
    dict
        As the Flower engine returns: ``strategy``; ``selected`` (each site's metrics at
        ``selected_round``, the round of lowest mean validation loss over the sites: the
        run's result); ``final`` (each site's metrics at ``last_round``); ``table``
        (markdown: the selected round, the last round's scores beside it, the round of the
        saved weights and any site that predicts one class only); ``rows`` (every round and
        site) and ``parent_run_id`` (MLflow).
    """
    from tqdm.auto import tqdm

    from fedbn_med.evaluation.report import progress_postfix
    from fedbn_med.tasks import get_task
    from fedbn_med.tracking import tracked
    from fedbn_med.training.inprocess import run_spec

    task = get_task(spec.task)
    with tracked(task.experiment, spec.label, {**spec.params(), "engine": "inprocess"},
                 spec.sites, tracking_uri=tracking_uri, tags={"task": spec.task}) as tracker, \
            tqdm(total=spec.rounds, desc=spec.label, unit="round", disable=not progress,
                 dynamic_ncols=True) as bar:

        def on_round(rnd: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
            tracker.log_round(rnd, metrics)
            bar.set_postfix(progress_postfix(metrics), refresh=False)
            bar.update(1)

        history, kept = run_spec(spec, on_round=on_round)
        result = history.result()
        tracker.log_text(result.table + "\n", "results.md")
        tracker.log_metrics({"selected_round": result.selected_round})
        if history.global_weights:
            tracker.log_shared_weights(history.global_weights, kept)
        if history.selected_weights and history.selected_round == result.selected_round:
            tracker.log_shared_weights(history.selected_weights, kept, "model/selected")
    return {"strategy": history.strategy, "selected": result.selected,
            "selected_round": result.selected_round, "final": result.last,
            "last_round": result.last_round, "table": result.table, "rows": history.rows,
            "parent_run_id": tracker.parent_id}
