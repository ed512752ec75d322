"""Check a task against the contract every engine relies on: :func:`check_task`.

As scikit-learn's ``check_estimator`` does for an estimator, :func:`check_task` builds a
task's run spec, server model and first sites, runs one FedBN round in this process, and
raises :class:`TaskCheckError` naming the first rule the task breaks. The built-in tasks
pass the same checks (``tests/test_api_checks.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch import nn

from fedbn_med.fl.partition import partition_model
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import Task, get_task
from fedbn_med.training.inprocess import run_in_process
from fedbn_med.training.trainer import SiteTrainer

__all__ = ["TaskCheckError", "check_task"]


class TaskCheckError(AssertionError):
    """Raised when a task breaks a rule of the contract; the message names the rule."""


def _require(ok: bool, check: str, message: str) -> None:
    if not ok:
        raise TaskCheckError(f"check '{check}' failed: {message}")


def check_task(task: Task | str, *, sites: int = 2, **settings: Any) -> list[str]:
    """Check that ``task`` works with the run spec, the engines and the trackers.

    Parameters
    ----------
    task : Task or str
        The task, or its registered name.
    sites : int
        How many of the task's sites to build and run one round on.
    **settings
        Run settings that make the check small (``image_size=32``), as
        :meth:`RunSpec.for_task` takes them; the check runs 1 round of ``fedbn``.

    Returns
    -------
    list of str
        The checks passed, in order.

    Raises
    ------
    TaskCheckError
        At the first check the task fails, naming it and what was expected.
    """
    passed: list[str] = []

    def step(name: str, body: Callable[[], None]) -> None:
        try:
            body()
        except TaskCheckError:
            raise
        except Exception as err:  # a task's own error: say which check met it
            raise TaskCheckError(f"check '{name}' failed: {type(err).__name__}: {err}"
                                 ) from err
        passed.append(name)

    name = task if isinstance(task, str) else getattr(task, "name", None)
    _require(isinstance(name, str), "registered", f"expected a Task or a task name, got "
             f"{type(task).__name__}.")
    assert isinstance(name, str)
    found: dict[str, Any] = {}

    def registered() -> None:
        found["task"] = get_task(name)
        _require(isinstance(task, str) or found["task"] == task, "registered",
                 f"get_task('{name}') returns another task than the one given; register it "
                 "with fedbn_med.register_task.")

    step("registered", registered)
    t: Task = found["task"]

    def contract() -> None:
        _require(bool(t.experiment), "contract", "experiment is empty (the MLflow "
                 "experiment of the task's runs).")
        _require(t.selection.metric in t.score_metrics, "contract",
                 f"selection metric '{t.selection.metric}' is not one of score_metrics "
                 f"({', '.join(t.score_metrics)}).")
        _require(t.headline in t.score_metrics, "contract", f"headline '{t.headline}' is not "
                 f"one of score_metrics ({', '.join(t.score_metrics)}).")

    step("contract", contract)

    def spec() -> None:
        built = RunSpec.for_task(name, **{"rounds": 1, **settings, "strategy": "fedbn"})
        _require(RunSpec.from_json(built.to_json()) == built, "spec",
                 "the run spec does not survive its JSON (what Flower carries).")
        _require(len(built.sites) >= 1, "spec", "the task's spec names no site.")
        t.check_sites(built.sites)
        found["spec"] = built

    step("spec", spec)
    run_spec: RunSpec = found["spec"]

    def server_model() -> None:
        model = t.build_server_model(run_spec, run_spec.input_shape())
        _require(isinstance(model, nn.Module), "server_model",
                 f"build_server_model returned {type(model).__name__}, not a torch.nn.Module.")
        part = partition_model(model)
        _require(bool(part.private), "server_model",
                 "the model has no normalisation layer a site could keep (FedBN would be "
                 "FedAvg): use batch norm, e.g. MONAI's norm='batch'.")
        found["server"] = model

    step("server_model", server_model)
    server = found["server"]
    chosen = run_spec.sites[:max(1, sites)]

    def build_sites() -> None:
        trainers = {}
        for site in chosen:
            trainer = t.build_site(site, run_spec, run_spec.data_dir, "cpu")
            _require(isinstance(trainer, SiteTrainer), "build_sites",
                     f"build_site('{site}') returned {type(trainer).__name__}, not a "
                     "SiteTrainer (fedbn_med.site_trainer builds one).")
            state, reference = trainer.model.state_dict(), server.state_dict()
            _require(set(state) == set(reference) and all(
                tuple(state[k].shape) == tuple(reference[k].shape) for k in reference),
                "build_sites", f"site '{site}''s model differs from the server model in "
                "its keys or shapes.")
            trainers[site] = trainer
        found["trainers"] = trainers

    step("build_sites", build_sites)

    def one_round() -> None:
        history = run_in_process(found["trainers"], run_spec.strategy_obj(), 1)
        scored = {k for row in history.rows for k in row if k.startswith(("val_", "test_"))}
        wanted = f"val_{t.selection.metric}"
        _require(all(wanted in row for row in history.rows), "one_round",
                 f"a site's scores lack '{wanted}', which selects the run's round.")
        unknown = sorted({k.split("_", 1)[1] for k in scored} - set(t.score_metrics))
        _require(not unknown, "one_round", f"sites report metrics not in score_metrics "
                 f"({', '.join(unknown)}); a Flower server refuses such replies.")
        bad = sorted(k for row in history.rows for k, v in row.items()
                     if k in scored and not math.isfinite(float(v)))
        _require(not bad, "one_round", f"non-finite scores: {', '.join(bad[:5])}.")

    step("one_round", one_round)
    return passed
