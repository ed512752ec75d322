"""What the command line prints and logs when its runs are done.

One run prints its per-site table; ``--compare`` gathers every run into a
:class:`~fedbn_med.evaluation.comparison.Comparison` (with the ABIDE reference rows),
prints its report and logs it to MLflow as one run named ``compare``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedbn_med.spec import RunSpec

if TYPE_CHECKING:
    from fedbn_med.api.result import FederationResult
    from fedbn_med.evaluation.comparison import Comparison

__all__ = ["print_results"]


def print_results(specs: list[RunSpec], results: list[FederationResult], compare: tuple[str, ...],
                  tracking_uri: str, seconds: float) -> None:
    """Print one run's table, or the comparison's report (then log it to MLflow)."""
    if compare:
        comparison = _comparison(specs, results)
        print("\n" + comparison.report())
        run_id = _log_comparison(specs, comparison, tracking_uri)
        print(f"\nMLflow: the comparison is run {run_id}, each strategy's runs beside it")
    else:
        spec = specs[0]
        print(f"\n{results[0].strategy}: round {results[0].selected_round} of "
              f"{spec.rounds}, selected on validation (test split of fold {spec.fold}), "
              "% per site:\n")
        print(results[0].table)
        kept = list(results[0].kept_weights.values())
        if kept and results[0].engine == "inprocess":  # each site's private layers
            print(f"\nThe selected round's weights: the shared ones in "
                  f"{results[0].shared_weights} (and MLflow's model/selected), each site's "
                  f"kept layers (never logged to MLflow) in "
                  f"{kept[0].parent}/<site>.selected.safetensors")
    from fedbn_med.paths import runs_page

    parent = results[-1].run_id if results else None
    print(f"\nwall time {seconds:.1f} s. See the runs in MLflow:\n  "
          f"{runs_page(tracking_uri, parent)}")


def _comparison(specs: list[RunSpec], results: list[FederationResult]) -> Comparison:
    from fedbn_med.evaluation.comparison import Cell, Comparison
    from fedbn_med.evaluation.runner import task_metrics
    from fedbn_med.tasks import get_task

    # the task's scores (MRI: Dice) and the validation metric that picks each run's round
    metrics = task_metrics(specs[0].task)
    selection = get_task(specs[0].task).selection
    comparison = Comparison(sites=tuple(specs[0].sites), n_folds=specs[0].n_folds,
                            metric_names=metrics)
    for spec, result in zip(specs, results):
        # in-process ABIDE runs keep their test subjects' predictions: subject-level tests
        comparison.add(Cell.from_rows(spec.label, spec.fold, spec.seed, result.rows,
                                      predictions=result.predictions or None,
                                      n_train=result.n_train, n_test=result.n_test,
                                      metrics=metrics, selection=selection))
    from fedbn_med.evaluation.cell_data import has_cells

    if has_cells(specs[0].task):  # the reference rows (majority class, motion, ridge)
        from fedbn_med.evaluation.references import add_reference_rows

        add_reference_rows(comparison, specs[0], dict.fromkeys((s.fold, s.seed)
                                                               for s in specs))
    return comparison


def _log_comparison(specs: list[RunSpec], comparison: Comparison, tracking_uri: str) -> str:
    """Log the comparison's tables and figures as one MLflow run; return its id."""
    from fedbn_med.evaluation.report import csv_text
    from fedbn_med.tasks import get_task
    from fedbn_med.tracking import tracked

    first = specs[0]
    params = {**first.params(), "strategy": ",".join(comparison.strategies),
              "folds": len({s.fold for s in specs}), "seeds": len({s.seed for s in specs}),
              "seed": ",".join(str(s) for s in sorted({s.seed for s in specs})),
              "fold": "all", "strategy_label": "compare"}
    with tracked(get_task(first.task).experiment, "compare", params, tracking_uri=tracking_uri,
                 tags={"task": first.task, "kind": "compare"}) as tracker:
        tracker.log_metrics(comparison.metrics())
        tracker.log_text(comparison.report() + "\n", "compare.md")
        tracker.log_text(csv_text(comparison.rows()), "cells.csv")
        # runs kept predictions in process only (the reference rows always have them)
        if any(c.predictions for c in comparison.cells if not c.reference):
            subjects = comparison.prediction_rows()
            tracker.log_text(csv_text(subjects), "predictions.csv")
            tracker.log_text(csv_text(comparison.cell_prediction_rows()),
                             "cell_predictions.csv")
    return tracker.parent_id

