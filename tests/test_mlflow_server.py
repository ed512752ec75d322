"""The tracking store behind a real ``mlflow server`` on 127.0.0.1, read over its REST API."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from fedbn_med.fl.strategies import FedBN
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.tracking import FederationTracker
from fedbn_med.training.inprocess import run_in_process
from fedbn_med.training.trainer import SiteData, SiteTrainer
from tests.mlflow_ui import mlflow_server as serve
from tests.stores import sqlite_store

pytestmark = pytest.mark.integration


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _get(base: str, path: str) -> dict:
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture()
def mlflow_server(tmp_path):
    sqlite_store(tmp_path / "server.db")  # the server's store, already at MLflow's schema
    with serve(tmp_path / "server.db", tmp_path / "artifacts") as base:
        yield base


def _trainers():
    out = {}
    for i, site in enumerate(("A", "B")):
        gen = torch.Generator().manual_seed(i)
        y = torch.randint(0, 2, (40,), generator=gen)
        x = torch.randn(40, 8, generator=gen) + 2.0 * i + y[:, None]
        data = SiteData(train=(x[:24], y[:24]), val=(x[24:32], y[24:32]), test=(x[32:], y[32:]))
        torch.manual_seed(0)
        out[site] = SiteTrainer(site, AbideMLP(8), data, FedBN(), batch_size=8, device="cpu")
    return out


def test_runs_are_found_through_the_rest_api(mlflow_server):
    tracker = FederationTracker("rest-check", "fedbn", {"rounds": 3}, ["A", "B"],
                                tracking_uri=mlflow_server)
    history = run_in_process(_trainers(), FedBN(), rounds=3, on_round=tracker.log_round)
    tracker.log_shared_weights(history.global_weights)
    tracker.finish()

    exps = _post(mlflow_server, "/api/2.0/mlflow/experiments/search", {"max_results": 50})
    exp_id = next(e["experiment_id"] for e in exps["experiments"] if e["name"] == "rest-check")
    runs = _post(mlflow_server, "/api/2.0/mlflow/runs/search",
                 {"experiment_ids": [exp_id]})["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    assert sum(t.get("kind") == "federation" for t in tags) == 1
    site_runs = {t["site"]: r for t, r in zip(tags, runs) if t.get("kind") == "site"}
    assert set(site_runs) == {"A", "B"}
    for run in site_runs.values():
        hist = _get(mlflow_server, "/api/2.0/mlflow/metrics/get-history?run_id="
                    f"{run['info']['run_id']}&metric_key=test_accuracy")
        assert sorted(int(m["step"]) for m in hist["metrics"]) == [1, 2, 3]
        assert run["info"]["status"] == "FINISHED"
