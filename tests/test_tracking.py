from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient

from fedbn_med.tracking import FederationTracker, read_sites_per_round


@pytest.fixture()
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_parent_and_site_runs_with_metrics_per_round(store, tmp_path):
    tracker = FederationTracker("exp", "fedbn", {"rounds": 2, "lr": 0.01}, ["NYU", "UM"],
                                tracking_uri=store)
    for rnd in (1, 2):
        tracker.log_round(rnd, {"NYU": {"test_accuracy": 0.5 + rnd / 10, "num_examples": 100},
                                "UM": {"test_accuracy": 0.6, "num_examples": 50}})
    tracker.log_result([{"round": rnd, "site": site, "test_accuracy": acc}
                        for rnd, site, acc in ((1, "NYU", 0.6), (1, "UM", 0.6),
                                               (2, "NYU", 0.7), (2, "UM", 0.6))],
                       selected_round=1, last_round=2)
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
    assert read_sites_per_round(store, parent.info.run_id) == {1: ["NYU", "UM"],
                                                                2: ["NYU", "UM"]}
    # the headline is the selected round's (round 1), the last round's named as such
    assert parent.data.metrics["mean_test_accuracy"] == pytest.approx(0.6)
    assert parent.data.metrics["last_round.mean_test_accuracy"] == pytest.approx(0.65)
    assert parent.data.metrics["selected_round"] == 1
    assert not any(t.startswith("round_") for t in parent.data.tags)
    curve = client.get_metric_history(parent.info.run_id, "by_round/mean_test_accuracy")
    assert [(m.step, round(m.value, 6)) for m in curve] == [(1, 0.6), (2, 0.65)]
    assert client.get_experiment_by_name("exp").tags["mlflow.experimentKind"] == \
        "custom_model_development"
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


def test_a_headline_table_is_the_parent_runs_description_cut_to_mlflows_tag_length(store):
    tracker = FederationTracker("exp", "fedbn", {}, ["A"], tracking_uri=store)
    tracker.log_text("| site |\n| A |\n\nRound 1 of 1 selected (<site>.round-1).\n",
                     "results.md")
    tracker.log_text("not a headline\n", "notes.txt")
    long = "".join(f"| row {i} | {'x' * 60} |\n" for i in range(400))  # ~28 000 characters
    other = FederationTracker("exp", "compare", {}, ["A"], tracking_uri=store)
    other.log_text(long, "compare.md")
    client = MlflowClient(tracking_uri=store)
    assert client.get_run(tracker.parent_id).data.tags["mlflow.note.content"] == \
        "Round 1 of 1 selected (\\<site>.round-1).\n\n| site |\n| A |\n"  # what the table
    # says first; "<site>" escaped, or MLflow's markdown would drop it as an HTML tag
    note = client.get_run(other.parent_id).data.tags["mlflow.note.content"]
    assert note.endswith("(The whole table: compare.md.)") and len(note) <= 8000
    kept = note.split("\n\n(The whole")[0]
    assert long.startswith(kept + "\n")  # cut at a line's end, never mid-row
    tracker.finish()
    other.finish()



def test_the_runs_page_names_the_runs_experiment_without_importing_mlflow(tmp_path) -> None:
    # The command line prints this after a federation over Flower, where nothing else in
    # its process needs MLflow (about 2 s of CPU to import and open a store).
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("first")
    experiment = client.create_experiment("second")
    run = client.create_run(experiment).info.run_id
    code = ("import sys; from fedbn_med.paths import runs_page; "
            f"print(runs_page({uri!r}, {run!r})); print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()
    assert out == [f"MLFLOW_DISABLE_TELEMETRY=true mlflow ui --port 5000 --backend-store-uri "
                   f"{uri}",
                   f"  then open http://127.0.0.1:5000/#/experiments/{experiment}/runs"
                   "?workflowType=machine_learning", "False"]
    # a run the store does not hold, or no run: the default experiment, still a hint
    from fedbn_med.paths import runs_page
    assert "/#/experiments/0/runs" in runs_page(uri, "f" * 32)
    assert "/#/experiments/0/runs" in runs_page(uri, None)
    missing = tmp_path / "none" / "mlflow.db"
    assert "/#/experiments/0/runs" in runs_page(f"sqlite:///{missing}", run)
    assert not missing.parent.exists()  # asked, not made
    # a relative store is the file of that name in the current folder, as MLflow reads it
    code = ("from fedbn_med.paths import runs_page; "
            f"print(runs_page('sqlite:///mlflow.db', {run!r}))")
    relative = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, cwd=tmp_path, timeout=120).stdout
    assert f"/#/experiments/{experiment}/runs" in relative
    assert runs_page("http://mlflow.example:5000/", None) == (
        "open http://mlflow.example:5000/#/experiments/0/runs?workflowType=machine_learning")
