"""``--compare`` on the imaging tasks: Dice and AUC tables, folds that change the split.

Each task's comparison runs once for the module through the real command line
(:func:`fedbn_med.cli.main`, in-process engine, a real MLflow sqlite store); the
assertions read what it printed and the cells it logged.
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fedbn_med.cli import main


def _compare(task: str, tmp: Path, data: Path, options: list[str]
             ) -> tuple[str, list[dict[str, str]]]:
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["--data-dir", str(data), "--workdir", str(tmp / "run"),
                     "--tracking-uri", store, "--quiet", "--folds", "2", "--seeds", "1",
                     "--rounds", "1", *options], task=task)
    text = out.getvalue()
    assert code == 0, text
    run_id = re.search(r"the comparison is run (\w+)", text).group(1)
    path = MlflowClient(tracking_uri=store).download_artifacts(run_id, "cells.csv",
                                                               str(tmp))
    return text, list(csv.DictReader(Path(path).open(encoding="utf-8")))


def _table(text: str, title: str) -> dict[str, list[str]]:
    block = text.split(title, 1)[1].split("\n\n")[1]
    rows = [line.strip("|").split("|") for line in block.splitlines()[2:]]
    return {r[0].strip(): [c.strip() for c in r[1:]] for r in rows}


def _cell(cells: list[dict[str, str]], strategy: str, fold: int, key: str) -> float:
    return next(float(c[key]) for c in cells
                if c["strategy"] == strategy and int(c["fold"]) == fold)


@pytest.fixture(scope="module")
def mri(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, str]]]:
    # the session's built-in sites, as tests/test_mri3d.py makes them
    data = tmp_path_factory.getbasetemp() / "imaging_sites"
    return _compare("mri", tmp_path_factory.mktemp("mri_compare"), data, [
        "--compare", "fedbn,fedavg,fedavg_localbn,silobn", "--sites", "SiteA,SiteB",
        "--image-size", "24", "--subjects", "6", "--batch-size", "2", "--set", "patches=2",
        "--set", "patch_size=16"])


def test_mri_compare_scores_dice_for_every_method(mri) -> None:
    text, _ = mri
    table = _table(text, "Test dice at the best-validation round:")
    assert set(table) == {"fedbn", "fedavg", "fedavg_localbn", "silobn"}
    for method, cells in table.items():
        assert all(c != "n/a" and float(c.split()[0]) > 0 for c in cells), (method, cells)
    assert "Test dice_gm at the best-validation round:" in text
    diffs = [line for line in text.splitlines() if line.startswith("| fedbn - ")]
    assert {line.split("|")[1].strip() for line in diffs} >= {
        "fedbn - fedavg", "fedbn - fedavg_localbn", "fedbn - silobn"}
    assert all(line.split("|")[2].strip().startswith("dice") for line in diffs)


def test_mri_folds_change_the_split_and_own_bn_changes_the_score(mri) -> None:
    _, cells = mri
    key = "dice_best_mean"
    assert _cell(cells, "fedbn", 0, key) != _cell(cells, "fedbn", 1, key)
    # the same FedAvg training, scored with each site's own BN statistics
    assert _cell(cells, "fedavg", 0, key) != _cell(cells, "fedavg_localbn", 0, key)


def test_xray_compare_scores_auc_on_folds_that_differ(tmp_path: Path) -> None:
    text, cells = _compare("xray", tmp_path, tmp_path / "data", [
        "--compare", "fedbn", "--sites", "HospitalA,HospitalB",
        "--image-size", "32", "--subjects", "10", "--batch-size", "4"])
    table = _table(text, "Test AUC at the best-validation round:")
    assert set(table) == {"fedbn"}
    assert all(c != "n/a" for cells_ in table.values() for c in cells_), table
    # each fold's site runs: their test losses differ when the folds' test images do
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("xray-fedbn").experiment_id
    runs = client.search_runs([experiment])
    folds = {r.info.run_id: r.data.params["fold"] for r in runs
             if r.data.tags.get("kind") == "federation"
             and r.data.params.get("strategy") == "fedbn"}
    losses = {(folds[r.data.tags["mlflow.parentRunId"]], r.data.tags["site"]):
              r.data.metrics["test_loss"] for r in runs
              if r.data.tags.get("kind") == "site"
              and r.data.tags.get("mlflow.parentRunId") in folds}
    assert len(losses) == 4, losses
    for site in ("HospitalA", "HospitalB"):
        assert losses[("0", site)] != losses[("1", site)], losses
