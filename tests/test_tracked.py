"""How a run's MLflow runs end: FINISHED, FAILED or KILLED, in every place that opens them.

Each test uses a real sqlite MLflow store in ``tmp_path`` (:func:`tests.stores.sqlite_store`).
"""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from mlflow.tracking import MlflowClient

from fedbn_med.tracking import FederationTracker, end_status, tracked
from tests.stores import sqlite_store


@pytest.fixture()
def store(tmp_path):
    return sqlite_store(tmp_path / "mlflow.db")


def _statuses(store: str, experiment: str = "exp") -> dict[str, str]:
    """Return ``{run name: status}`` of every run of the experiment."""
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name(experiment)
    return {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}


def test_the_status_follows_how_the_block_ended():
    assert end_status(None) == "FINISHED"
    assert end_status(KeyboardInterrupt()) == "KILLED"
    assert end_status(SystemExit(0)) == "KILLED"
    assert end_status(ValueError("x")) == "FAILED"
    assert end_status(MemoryError()) == "FAILED"


def test_a_block_that_completes_finishes_the_parent_and_site_runs(store):
    with tracked("exp", "fedbn", {"rounds": 1}, ["NYU", "UM"], tracking_uri=store) as tracker:
        assert isinstance(tracker, FederationTracker)
        tracker.log_round(1, {"NYU": {"test_accuracy": 0.5}, "UM": {"test_accuracy": 0.6}})
        tracker.add_site("LATE", first_round=2)
        assert set(_statuses(store).values()) == {"RUNNING"}
    assert _statuses(store) == {"fedbn": "FINISHED", "site-NYU": "FINISHED",
                                "site-UM": "FINISHED", "site-LATE": "FINISHED"}


@pytest.mark.parametrize(("error", "status"), [(ValueError("bad round"), "FAILED"),
                                               (KeyboardInterrupt(), "KILLED")])
def test_an_exception_ends_every_run_and_goes_on(store, error, status):
    with pytest.raises(type(error)):
        with tracked("exp", "fedbn", {}, ["NYU"], tracking_uri=store):
            raise error
    assert _statuses(store) == {"fedbn": status, "site-NYU": status}


def test_a_store_that_fails_at_the_end_does_not_hide_the_runs_error(store, monkeypatch,
                                                                    caplog):
    def broken(self, status="FINISHED"):  # noqa: ANN001, ANN202, ARG001
        raise OSError("the store went away")

    with pytest.raises(ValueError, match="the run's own error"), \
            caplog.at_level(logging.WARNING, logger="fedbn_med.tracking"):
        with tracked("exp", "fedbn", {}, (), tracking_uri=store):
            monkeypatch.setattr(FederationTracker, "finish", broken)
            raise ValueError("the run's own error")
    assert "Could not mark MLflow run" in caplog.text and "FAILED" in caplog.text
    # Without an error of its own, the store's failure is the block's error.
    monkeypatch.undo()
    with pytest.raises(OSError, match="the store went away"):
        with tracked("exp", "other", {}, (), tracking_uri=store):
            monkeypatch.setattr(FederationTracker, "finish", broken)


def test_resuming_a_failed_run_finishes_it(store):
    with pytest.raises(RuntimeError):
        with tracked("exp", "fedbn", {}, ["NYU"], tracking_uri=store) as first:
            raise RuntimeError("crash")
    assert _statuses(store)["fedbn"] == "FAILED"
    with tracked("exp", "fedbn", {}, ["NYU"], tracking_uri=store,
                 parent_run_id=first.parent_id):
        pass
    assert _statuses(store) == {"fedbn": "FINISHED", "site-NYU": "FINISHED"}


# -- each place that opens runs ------------------------------------------------------------
def test_the_tracked_in_process_run_fails_its_runs_on_error(store, monkeypatch, tmp_path):
    import fedbn_med.training.inprocess as inprocess
    from fedbn_med import run
    from fedbn_med.spec import RunSpec

    class Crashing:  # a federation whose first round's reply is its last
        kept: frozenset[str] = frozenset()

        def run(self, on_round=None, *, evaluate=True):  # noqa: ANN001, ANN202, ARG002
            on_round(1, {"UCLA": {"test_accuracy": 0.5}})
            raise RuntimeError("a site's data went missing")

    monkeypatch.setattr(inprocess, "build_federation", lambda spec, data=None: Crashing())
    spec = RunSpec.for_task("abide", rounds=2, sites=("UCLA",), data_dir=tmp_path)
    with pytest.raises(RuntimeError, match="went missing"):
        run(spec, tracking_uri=store, workdir=tmp_path / "run")
    from fedbn_med.tasks import get_task

    statuses = _statuses(store, get_task("abide").experiment)
    parent = next(name for name in statuses if not name.startswith("site-"))
    # the run's name says what ran: strategy, sites, engine, time
    assert parent.startswith(f"{spec.label} · UCLA · inprocess · 20")
    assert statuses == {parent: "FAILED", "site-UCLA": "FAILED"}


def test_an_onboarding_log_finishes_or_fails_its_runs(store, monkeypatch):
    from types import SimpleNamespace

    from fedbn_med.onboarding.compare import log_onboarding

    result = SimpleNamespace(site="NEW", sources=["in-process fedbn"], counts={"train": 3},
                             round=2, flat_metrics=lambda: {"fedbn_test_accuracy": 0.5},
                             table=lambda: "| table |")
    run_id = log_onboarding(cast(Any, result), tracking_uri=store, experiment="exp")
    assert _statuses(store) == {"onboard-NEW": "FINISHED", "site-NEW": "FINISHED"}
    assert MlflowClient(tracking_uri=store).get_run(run_id).info.run_name == "site-NEW"

    def broken() -> str:
        raise RuntimeError("no table")

    with pytest.raises(RuntimeError, match="no table"):
        bad = SimpleNamespace(**{**vars(result), "site": "BAD", "table": broken})
        log_onboarding(cast(Any, bad), tracking_uri=store, experiment="exp")
    statuses = _statuses(store)
    assert statuses["onboard-BAD"] == "FAILED" and statuses["site-BAD"] == "FAILED"


def test_a_comparison_log_fails_its_run_on_error(store):
    from fedbn_med.cli.results import _log_comparison
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks import get_task

    class Broken:
        strategies = ("fedbn",)

        def metrics(self) -> dict[str, float]:
            raise RuntimeError("no metrics")

    with pytest.raises(RuntimeError, match="no metrics"):
        _log_comparison([RunSpec()], cast(Any, Broken()), store)
    assert _statuses(store, get_task("abide").experiment) == {"compare": "FAILED"}


def test_a_federation_server_that_crashes_fails_its_runs_and_a_resume_finishes_them(
        tmp_path, patched_flower):
    from tests.test_server_loop import ScriptedGrid, _server, crashing

    sites = {1: "NYU", 2: "UM", 3: "USM"}
    crash = {"round": 2}
    answer = crashing(sites, crash)

    store = sqlite_store(tmp_path / "mlflow.db")  # the store _server logs into
    with pytest.raises(ConnectionError):
        _server(tmp_path, ScriptedGrid(sites, answer), rounds=3).run()
    from fedbn_med.tasks import get_task

    experiment = get_task("abide").experiment
    failed = _statuses(store, experiment)
    assert set(failed.values()) == {"FAILED"} and len(failed) == 4  # the parent, 3 sites
    crash["round"] = 0
    _server(tmp_path, ScriptedGrid(sites, answer), rounds=3, resume=True).run()
    assert _statuses(store, experiment) == dict.fromkeys(failed, "FINISHED")


# -- a new store ---------------------------------------------------------------------------
def test_a_new_store_starts_from_a_migrated_empty_copy(tmp_path, monkeypatch):
    import sqlite3

    from fedbn_med.paths import seed_store
    from fedbn_med.tracking import warm_up

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    first, second = tmp_path / "a" / "mlflow.db", tmp_path / "b" / "mlflow.db"
    warm_up(f"sqlite:///{first}")  # MLflow migrates once; its empty store is kept
    (template,) = (tmp_path / "cache" / "fedbn_med").glob("mlflow-*-empty.db")
    with sqlite3.connect(template) as db:
        assert db.execute("SELECT count(*) FROM experiments").fetchone() == (0,)
    seed_store(f"sqlite:///{second}")
    assert second.read_bytes() == template.read_bytes()
    # MLflow takes the copy as its own: it adds its Default experiment, here, and the runs
    with tracked("exp", "fedbn", {"lr": 0.1}, ["NYU"], tracking_uri=f"sqlite:///{second}",
                 tags={"kind": "federation"}) as tracker:
        tracker.log_metrics({"x": 1.0})
    client = MlflowClient(tracking_uri=f"sqlite:///{second}")
    assert sorted(e.name for e in client.search_experiments()) == ["Default", "exp"]
    assert str(tmp_path / "mlruns") in client.get_experiment("0").artifact_location
    assert client.get_run(tracker.parent_id).data.metrics["x"] == 1.0
    # a store that exists is left alone, and so is any other kind of store
    kept = second.read_bytes()
    seed_store(f"sqlite:///{second}")
    assert second.read_bytes() == kept
    seed_store("http://127.0.0.1:5000")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "cache"]
