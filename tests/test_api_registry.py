"""An outside task joins through register_task or an entry point, without editing fedbn_med."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import fedbn_med as fb
from fedbn_med import tasks
from fedbn_med.cli.command import main
from tests.outside_task import install


@pytest.fixture
def squares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install the outside task 'squares' (an entry point) for this test only."""
    folder = install(tmp_path / "site-packages")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(tasks, "_TASKS", dict(tasks._TASKS))
    yield folder
    sys.modules.pop("squares_task", None)


def test_the_public_names_are_the_exported_ones() -> None:
    assert fb.__all__ == sorted(fb._EXPORTS)
    for name in fb.__all__:
        assert getattr(fb, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fb.nope  # noqa: B018


def test_register_task_refuses_what_is_not_a_task_or_a_name() -> None:
    with pytest.raises(TypeError, match=r"register_task takes a fedbn_med.tasks.Task, got dict"):
        fb.register_task({"name": "x"})  # type: ignore[arg-type]
    task = fb.get_task("xray")
    with pytest.raises(ValueError, match=r"lowercase Python identifier.*'My Task'"):
        fb.register_task(fb.Task(**{**task.__dict__, "name": "My Task"}))
    with pytest.raises(ValueError, match=r"Task 'xray' is registered already.*replace=True"):
        fb.register_task(fb.Task(**{**task.__dict__, "experiment": "other"}))


def test_an_unknown_task_names_the_valid_ones() -> None:
    with pytest.raises(ValueError,
                       match=r"Unknown task 'nope'. Valid tasks: abide, histo, mri, xray"):
        fb.get_task("nope")
    with pytest.raises(ValueError, match=r"Unknown task 'nope'"):
        fb.RunSpec.for_task("nope")


def test_a_known_task_name_is_checked_without_reading_installed_packages(monkeypatch) -> None:
    # A site checks its task on every message: reading every installed package's entry
    # points costs tens of milliseconds each time. Only a name not known here needs them.
    reads: list[int] = []
    real = tasks._entry_points
    monkeypatch.setattr(tasks, "_entry_points", lambda: reads.append(1) or real())
    assert "abide" in tasks.TASK_NAMES and "histo" in tasks.TASK_NAMES and not reads
    assert "nope" not in tasks.TASK_NAMES and 3 not in tasks.TASK_NAMES
    assert reads == [1]


def test_an_entry_point_task_works_with_the_spec_run_tracking_and_cli(
        squares: Path, tmp_path: Path) -> None:
    assert "squares" in tasks.TASK_NAMES and "squares" in fb.task_names()
    spec = fb.RunSpec.for_task("squares", rounds=2, batch_size=3)
    assert spec.sites == ("north", "south") and spec.input_shape() == (1, 16, 16)
    assert fb.RunSpec.from_json(spec.to_json()) == spec
    assert fb.check_task("squares") == ["registered", "contract", "spec", "server_model",
                                        "build_sites", "one_round"]

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = fb.run(spec, tracking_uri=uri, workdir=tmp_path / "run")
    assert isinstance(result, fb.FederationResult)
    assert result.sites == ("north", "south") and result.last_round == 2
    assert 1 <= result.selected_round <= 2
    assert [r["round"] for r in result.site_rounds("north")] == [1, 2]
    assert set(result.metric("test_dice")) == {"north", "south"}
    # the kept files hold the BN layers, the shared file none of them
    assert sorted(result.kept_weights) == ["north", "south"]
    assert Path(str(result.shared_weights)).is_file()
    run = MlflowClient(tracking_uri=uri).get_run(str(result.run_id))
    assert run.data.tags["task"] == "squares" and run.data.params["task"] == "squares"

    # the command line takes the task by name and runs it, tracked: fedbn-med squares ...
    code = main(["squares", "--engine", "inprocess", "--rounds", "1",
                 "--tracking-uri", uri, "--workdir", str(tmp_path / "cli")])
    assert code == 0
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("squares-fedbn")
    assert experiment is not None
    assert len(client.search_runs([experiment.experiment_id],
                                  "tags.kind = 'federation'")) == 2


def test_a_tasks_run_names_its_sites(squares: Path, tmp_path: Path) -> None:
    result = fb.run("squares", sites=("south",), rounds=1, batch_size=3,
                    workdir=tmp_path / "run")
    assert result.sites == ("south",) and set(result.selected) == {"south"}


def test_check_task_names_the_rule_a_task_breaks(squares: Path) -> None:
    good = fb.get_task("squares")
    bad = fb.register_task(fb.Task(**{**good.__dict__, "name": "squares_bad",
                                      "score_metrics": ("dice", "loss")}))
    with pytest.raises(fb.TaskCheckError,
                       match=r"check 'one_round' failed: sites report metrics not in "
                             r"score_metrics \(dice_square\)"):
        fb.check_task(bad)
    with pytest.raises(fb.TaskCheckError, match=r"check 'contract' failed: headline 'auc'"):
        fb.check_task(fb.register_task(fb.Task(**{**good.__dict__, "name": "squares_auc",
                                                  "headline": "auc"})))


def test_a_network_with_its_own_data_refuses_what_it_cannot_run() -> None:
    from monai.networks.nets import UNet

    net = UNet(2, 1, 2, channels=(4, 8), strides=(2,), norm="batch")
    with pytest.raises(ValueError, match=r"run\(model, sites=\{name: data, \.\.\.\}"):
        fb.run(net)
    with pytest.raises(ValueError, match=r"A task builds its own sites and objective"):
        fb.run("xray", objective=fb.Classification())
    with pytest.raises(ValueError, match=r"Unknown engine 'ray'. Valid engines: inprocess"):
        fb.run(net, engine="ray")
    with pytest.raises(TypeError, match=r"run takes a RunSpec, a task name, a torch"):
        fb.run(3)  # type: ignore[arg-type]


def test_an_entry_point_task_runs_over_flower_and_is_tracked(
        squares: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the site processes find the task through the entry point on their own path
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", f"{squares}:{root}")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = int(time.time() * 1000)
    result = fb.run("squares", engine="flower", rounds=2, batch_size=3,
                    workdir=tmp_path / "flower", tracking_uri=uri)
    after = int(time.time() * 1000)
    assert result.engine == "flower" and result.last_round == 2
    assert [r["round"] for r in result.site_rounds("south")] == [1, 2]
    assert sorted(result.kept_weights) == ["north", "south"]
    assert all(f".round-{result.selected_round}." in p.name
               for p in result.kept_weights.values())
    assert Path(str(result.shared_weights)).is_file()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(str(result.run_id))
    assert run.data.params["task"] == "squares"
    # its MLflow runs start when the federation did, so their duration counts the
    # start-up (the SuperLink, the site processes, the server opening its store)
    from fedbn_med.federation.events import Ready, read_events

    (run_dir,) = (tmp_path / "flower").glob("run-0-*")
    ready = next(e.t for e in read_events(run_dir / "progress.jsonl") if isinstance(e, Ready))
    assert before <= run.info.start_time < 1000 * ready < run.info.end_time <= after
    children = client.search_runs([run.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{result.run_id}'")
    assert {c.info.start_time for c in children} == {run.info.start_time}
