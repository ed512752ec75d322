from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

from fedbn_med.tracking import FederationTracker


@pytest.fixture()
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_parent_and_site_runs_with_metrics_per_round(store, tmp_path):
    tracker = FederationTracker("exp", "fedbn", {"rounds": 2, "lr": 0.01}, ["NYU", "UM"],
                                tracking_uri=store)
    for rnd in (1, 2):
        tracker.log_round(rnd, {"NYU": {"test_accuracy": 0.5 + rnd / 10, "num_examples": 100},
                                "UM": {"test_accuracy": 0.6, "num_examples": 50}})
    tracker.log_text("| site |\n", "results.md")
    tracker.log_shared_weights({"w": torch.ones(2)}, private_keys={"bn.weight"})
    with pytest.raises(ValueError, match="Refusing to log site-private"):
        tracker.log_shared_weights({"bn.weight": torch.ones(2)}, private_keys={"bn.weight"})
    tracker.finish()

    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("exp")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "federation"]
    sites = {r.data.tags["site"]: r for r in runs if r.data.tags.get("kind") == "site"}
    assert len(parents) == 1 and set(sites) == {"NYU", "UM"}
    parent = parents[0]
    assert parent.data.params["lr"] == "0.01"
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in sites.values())
    hist = client.get_metric_history(sites["NYU"].info.run_id, "test_accuracy")
    assert [(m.step, round(m.value, 6)) for m in hist] == [(1, 0.6), (2, 0.7)]
    assert parent.data.tags["round_0002_sites"] == "NYU,UM"
    # which floating-point code path made the numbers (fedbn_med.numerics)
    from fedbn_med.numerics import describe

    assert parent.data.tags["numerics"].startswith(f"{describe()['mode']} (torch ")
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"results.md", "model"} <= arts


def test_resume_reuses_runs_and_late_site_gets_its_own_run(store):
    first = FederationTracker("exp", "fedbn", {}, ["A"], tracking_uri=store)
    first.log_round(1, {"A": {"test_accuracy": 0.5}})
    again = FederationTracker("exp", "fedbn", {}, ["A"], tracking_uri=store,
                              parent_run_id=first.parent_id)
    assert again.site_runs == first.site_runs
    again.log_round(2, {"A": {"test_accuracy": 0.55}, "NEW": {"test_accuracy": 0.4}})
    client = MlflowClient(tracking_uri=store)
    new_run = client.get_run(again.site_runs["NEW"])
    assert new_run.data.tags["first_round"] == "2"
    steps = [m.step for m in client.get_metric_history(first.site_runs["A"], "test_accuracy")]
    assert steps == [1, 2]
