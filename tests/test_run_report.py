"""A single run's result: its selected (best-validation) round, with the last beside it."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from fedbn_med.evaluation.comparison import best_round
from fedbn_med.evaluation.intervals import wilson_interval
from fedbn_med.evaluation.metrics import METRIC_NAMES
from fedbn_med.evaluation.report import metrics_at, run_result
from fedbn_med.federation.server.checks import metrics_reason, score_names
from fedbn_med.fl.strategies import FedBN, SingleSet
from fedbn_med.tasks import get_task
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.training.inprocess import History, run_in_process
from fedbn_med.training.trainer import SiteData, SiteTrainer


def _row(rnd: int, site: str, val_loss: float, acc: float, **extra: float) -> dict:
    return {"round": rnd, "site": site, "num_examples": 30, "val_loss": val_loss,
            "test_accuracy": acc, "test_balanced_accuracy": acc, "test_auc": acc,
            "test_n": 12.0, "test_majority_rate": 7 / 12, "test_positive_rate": 0.5,
            **extra}


def _rows() -> list[dict]:
    # round 2 has the lowest mean validation loss; round 3 the best test accuracy
    return [_row(1, "A", 0.70, 0.50), _row(1, "B", 0.72, 0.50),
            _row(2, "A", 0.60, 8 / 12), _row(2, "B", 0.64, 0.75),
            _row(3, "A", 0.66, 11 / 12), _row(3, "B", 0.70, 1.0)]


def test_the_result_is_the_round_of_lowest_mean_validation_loss() -> None:
    rows = _rows()
    result = run_result(rows, weights_round=3)
    assert result.selected_round == best_round(rows) == 2 and result.last_round == 3
    assert result.selected == metrics_at(rows, 2) and result.last == metrics_at(rows, 3)
    history = History("FedBN", rows=rows)
    assert history.best_round() == 2 and history.rounds == 3
    assert history.selected() == metrics_at(rows, 2)
    assert history.final()["A"]["test_accuracy"] == pytest.approx(11 / 12)  # still the last


def test_the_table_has_test_n_wilson_majority_rate_and_the_last_round_beside() -> None:
    result = run_result(_rows(), ["B", "A"], weights_round=3)
    lines = result.table.splitlines()
    assert lines[0] == ("| site | test n | accuracy [95 % Wilson] | balanced accuracy | AUC | "
                        "majority rate | predicted positive | train examples | "
                        "round 3: accuracy | round 3: balanced accuracy | round 3: AUC |")
    low, high = wilson_interval(8, 12)
    assert lines[3].startswith(f"| A | 12 | 66.7 [{100 * low:.1f}, {100 * high:.1f}] | 66.7 |")
    assert lines[3].endswith("| 58.3 | 50.0 | 30 | 91.7 | 91.7 | 91.7 |")
    assert lines[2].startswith("| B | 12 | 75.0 [")  # the order asked for
    assert lines[4].startswith("| mean | 24 | 70.8 |")  # n: the sum; rates: site means
    assert "Round 2 of 3 selected (the lowest mean validation loss over the sites)" in \
        result.table
    assert "Saved model: the shared weights of round 3, not of the selected round 2." in \
        result.table
    kept = run_result(_rows(), weights_round=3, selected_weights_round=2,
                      private_note=" Each site keeps its private layers of round 2.")
    assert ("Saved models: the shared weights of the selected round 2 (model/selected) and "
            "of the last round 3 (model). Each site keeps its private layers of round 2.") in \
        kept.table
    assert result.one_class == () and "Warning" not in result.table


def test_a_one_class_site_is_flagged_and_a_run_without_weights_says_so() -> None:
    rows = [_row(1, "A", 0.6, 7 / 12, test_positive_rate=0.0), _row(1, "B", 0.6, 0.5)]
    result = run_result(rows, weights_round=None)
    assert result.one_class == ("A",)
    assert ("Warning: A predicts one class only at round 1 (predicted positive 0 %): its "
            "accuracy is that class's share of its test split.") in result.table
    assert "No shared weights are saved." in result.table
    assert "Saved model: the shared weights of round 1, the selected round." in \
        run_result(rows, weights_round=1).table


def test_without_validation_scores_the_last_round_is_the_result() -> None:
    rows = [{k: v for k, v in r.items() if k != "val_loss"} for r in _rows()]
    result = run_result(rows, weights_round=3)
    assert result.selected_round == 3
    assert "no validation loss was reported: the last round" in result.table


def test_a_dp_site_reports_the_whole_runs_epsilon_at_the_selected_round() -> None:
    rows = [{**r, "dp_epsilon": float(r["round"]), "dp_epsilon_replace_one": 2.5 * r["round"]}
            for r in _rows()]
    result = run_result(rows, weights_round=3)
    assert result.selected_round == 2
    assert result.selected["A"]["dp_epsilon"] == 3.0
    assert result.selected["A"]["test_accuracy"] == pytest.approx(8 / 12)
    assert "epsilon add/remove" in result.table and "| 7.500 |" in result.table


def test_wilson_interval_matches_its_formula_and_refuses_bad_counts() -> None:
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(1.959964 ** 2 / (10 + 1.959964 ** 2), rel=1e-6)
    low, high = wilson_interval(8, 12)
    assert (low, high) == pytest.approx((0.390622, 0.861880), abs=1e-6)
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(1 - high)  # symmetric about one half
    with pytest.raises(ValueError, match="n must be a whole number of subjects >= 1, got 0"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match=r"successes must be a count from 0 to n = 4, got 5"):
        wilson_interval(5, 4)
    with pytest.raises(ValueError, match="level must be in"):
        wilson_interval(1, 4, level=95)
    # its normal quantile is scipy.stats.norm.ppf's to the bit: the printed tables keep
    # their every digit
    from scipy import stats
    for level in (0.5, 0.8, 0.9, 0.95, 0.99):
        z = float(stats.norm.ppf(0.5 + level / 2))
        for successes, n in ((0, 10), (8, 12), (35, 53), (1, 1)):
            p = successes / n
            centre = (p + z * z / (2 * n)) / (1 + z * z / n)
            half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
            assert wilson_interval(successes, n, level) == (max(0.0, centre - half),
                                                            min(1.0, centre + half))



# -- what a site reports when it scores ----------------------------------------------------
def _trainer(windows: bool = False) -> SiteTrainer:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 8, generator=gen)
    y = torch.tensor([1] * 34 + [0] * 26)[torch.randperm(60, generator=gen)]
    groups = torch.arange(20).repeat_interleave(3) if windows else None
    if windows:  # every subject's windows share its label
        y = y[::3].repeat_interleave(3)
    data = SiteData(train=(x[:42], y[:42]), val=(x[42:], y[42:]), test=(x, y),
                    test_groups=groups)
    torch.manual_seed(0)
    return SiteTrainer("A", AbideMLP(8), data, FedBN(), batch_size=8, device="cpu")


@pytest.mark.parametrize("windows", [False, True])
def test_a_site_reports_test_n_its_majority_rate_and_its_positive_share(windows: bool) -> None:
    trainer = _trainer(windows)
    metrics = trainer.score()
    x, y = trainer.data.test
    prob = trainer.predict(x).double()
    labels = y
    if windows:  # one score per subject: the mean of its windows
        prob, labels = prob.reshape(20, 3).mean(1), y.reshape(20, 3)[:, 0]
    majority = int(float(trainer.data.train[1].double().mean()) >= 0.5)
    assert metrics["test_n"] == labels.numel() == (20 if windows else 60)
    assert metrics["test_majority_rate"] == pytest.approx(float((labels == majority).double()
                                                                .mean()))
    assert metrics["test_positive_rate"] == pytest.approx(float((prob >= 0.5).double().mean()))
    assert set(metrics) == {f"{s}_{m}" for s in ("val", "test") for m in METRIC_NAMES}


def test_the_server_takes_the_new_scores_within_their_ranges() -> None:
    scores = score_names(get_task("abide").score_metrics)
    assert {"test_n", "val_positive_rate", "test_majority_rate"} <= scores
    sound = {"eval": {"test_n": 12.0, "test_positive_rate": 0.25, "test_majority_rate": 0.5}}
    assert metrics_reason(sound, scores) is None
    for name, value, message in [
        ("test_n", 12.5, "'test_n' (eval) is 12.5 (expected a whole number from 1 to 1e+09)"),
        ("test_n", 0.0, "'test_n' (eval) is 0.0 (expected a whole number from 1"),
        ("test_positive_rate", 1.5, "'test_positive_rate' (eval) is 1.5 (expected a finite "
                                    "number from 0 to 1)"),
        ("val_majority_rate", math.nan, "'val_majority_rate' (eval) is nan"),
    ]:
        reason = metrics_reason({"eval": {name: value}}, scores)
        assert reason is not None and message in reason, reason


# -- a run, in process and tracked ----------------------------------------------------------
def _sites(strategy) -> dict[str, SiteTrainer]:
    out = {}
    for i, site in enumerate(("A", "B")):
        gen = torch.Generator().manual_seed(i)
        y = torch.randint(0, 2, (50,), generator=gen)
        x = torch.randn(50, 8, generator=gen) + 1.5 * y[:, None] * (torch.arange(8) < 2)
        torch.manual_seed(0)
        out[site] = SiteTrainer(site, AbideMLP(8), SiteData(
            train=(x[:30], y[:30]), val=(x[30:40], y[30:40]), test=(x[40:], y[40:])),
            strategy, batch_size=10, device="cpu")
    return out


def test_an_in_process_run_reports_its_selected_round() -> None:
    history = run_in_process(_sites(FedBN()), FedBN(), rounds=4)
    result = history.result()
    assert result.selected_round == best_round(history.rows)
    assert result.selected == metrics_at(history.rows, result.selected_round)
    assert result.last == history.final()
    assert all(m["test_n"] == 10 for m in result.selected.values())
    assert "Saved model: the shared weights of round 4" in result.table
    single = run_in_process(_sites(SingleSet()), SingleSet(), rounds=2).result()
    assert "No shared weights are saved." in single.table


def test_a_tracked_run_returns_and_logs_the_selected_round(small_cohort, tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    from fedbn_med import run
    from fedbn_med.spec import RunSpec

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = RunSpec.for_task("abide", rounds=3, sites=("NYU", "UM"), data_dir=small_cohort,
                            device="cpu")
    before = int(time.time() * 1000)
    out = run(spec, tracking_uri=store, workdir=tmp_path / "run")
    rows = list(out.rows)
    assert out.selected_round == best_round(rows) and out.last_round == 3
    assert out.selected == metrics_at(rows, out.selected_round)
    assert out.last == metrics_at(rows, 3)
    assert f"Round {out.selected_round} of 3 selected" in out.table
    client = MlflowClient(tracking_uri=store)
    text = client.download_artifacts(out.run_id, "results.md", str(tmp_path))
    assert open(text, encoding="utf-8").read() == out.table + "\n"
    parent = client.get_run(out.run_id)
    assert parent.data.metrics["selected_round"] == out.selected_round
    # the run's page in MLflow opens on the table the console printed (its description)
    table, said = out.table.rsplit("|\n", 1)
    assert parent.data.tags["mlflow.note.content"] == f"{said.strip()}\n\n{table}|\n"
    assert said.strip().startswith(f"Round {out.selected_round} of 3 selected")
    # the runs start when the run did, not when MLflow's thread got to making them
    assert before <= parent.info.start_time <= before + 1500
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{out.run_id}'")
    assert {r.info.start_time for r in children} == {parent.info.start_time}
    np.testing.assert_array_equal(sorted(out.selected), ["NYU", "UM"])
    # the selected round's weights: shared in a file and in MLflow, each site's kept layers
    # in a file of its own only
    assert out.shared_weights == str(tmp_path / "run" / "shared.selected.safetensors")
    assert sorted(out.kept_weights) == ["NYU", "UM"]
    assert {a.path for a in client.list_artifacts(out.run_id, "model")} >= {
        "model/selected", "model/shared_weights.safetensors"}


def test_the_progress_bar_shows_validation_loss_and_never_a_test_score():
    from fedbn_med.evaluation.report import progress_postfix

    shown = progress_postfix({
        "NYU": {"val_loss": 0.70, "test_accuracy": 0.9, "test_auc": 0.8},
        "UM": {"val_loss": 0.50, "test_accuracy": 0.1},
        "USM": {"val_loss": float("nan"), "test_balanced_accuracy": 0.5},
    })
    assert shown == {"sites": "3", "val_loss": "0.6000"}
    assert progress_postfix({"NYU": {"test_accuracy": 0.9}}) == {"sites": "1"}


def test_a_run_on_prepared_sites_is_the_same_run_and_keeps_its_subjects(small_cohort,
                                                                         tmp_path) -> None:
    # what --compare --engine inprocess does: every method of a cell trains on the cell's
    # prepared sites; the run must be the run the task builds alone, plus its predictions
    from fedbn_med import run
    from fedbn_med.api.engines import run_inprocess, spec_launch
    from fedbn_med.evaluation.cell_data import prepare_sites
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.sites import load_sites

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = RunSpec.for_task("abide", rounds=3, sites=("NYU", "UM"), data_dir=small_cohort,
                            device="cpu", fold=1, seed=2)
    alone = run(spec, tracking_uri=store, workdir=tmp_path / "alone")
    sites = load_sites(list(spec.sites))
    prepared = prepare_sites(spec, sites)
    kept = run_inprocess(spec_launch(spec, prepared=prepared, site_files=sites),
                         tracking_uri=store)
    assert not alone.predictions and alone.n_test == 0
    assert kept.rows == alone.rows
    assert kept.selected_round == alone.selected_round
    assert sorted(kept.predictions) == ["NYU", "UM"]
    for name, p in kept.predictions.items():
        assert np.array_equal(p.index, prepared[name].split.test)
        accuracy = float(np.mean(p.predicted == (p.labels == 1)))
        assert accuracy == pytest.approx(kept.selected[name]["test_accuracy"], abs=5e-5)
    assert kept.n_test == sum(p.split.test.size for p in prepared.values())
    # a comparison's run writes no weights file and keeps none in a temporary folder
    assert kept.shared_weights == f"runs:/{kept.run_id}/model/selected"
    assert kept.kept_weights == {}


def test_compare_in_process_prints_the_subject_level_tests(small_cohort, tmp_path,
                                                           capsys) -> None:
    from fedbn_med.cli import main

    # --workers 1: the cells run in this process, which has the stack imported already
    # (a pool would start a fresh interpreter per cell; test_parallel_cells.py checks that
    # a pool of two gives the same runs as one process)
    code = main(["--compare", "fedbn,fedavg", "--engine", "inprocess", "--sites", "NYU,UM",
                 "--data-dir", str(small_cohort), "--folds", "2", "--seeds", "1",
                 "--workers", "1",
                 "--rounds", "2", "--quiet", "--workdir", str(tmp_path / "work"),
                 "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Subject-level paired tests" in out
    rows = [line for line in out.splitlines() if line.startswith("| fedbn - ")]
    assert [r.split(" | ")[0] for r in rows if "McNemar" not in r and "p = " in r] == [
        "| fedbn - fedavg", "| fedbn - Majority class", "| fedbn - Motion only (mean FD)",
        "| fedbn - Ridge, pooled (site z)", "| fedbn - Ridge, site only (site z)"]
    # the comparison's MLflow run holds each subject's pooled out-of-fold prediction
    import csv

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = out.split("the comparison is run ")[1].split()[0].rstrip(",")
    with open(client.download_artifacts(run_id, "predictions.csv", str(tmp_path)),
              newline="") as fh:
        pooled = list(csv.DictReader(fh))
    assert {r["strategy"] for r in pooled} >= {"fedbn", "fedavg"}
    assert all(0.0 <= float(r["prob_asd"]) <= 1.0 for r in pooled)


def test_a_comparison_without_predictions_says_why_it_has_no_subject_tests() -> None:
    from fedbn_med.evaluation.comparison import Cell, Comparison

    comparison = Comparison(sites=("A", "B"))
    for name in ("FedBN", "FedAvg"):
        comparison.add(Cell.from_rows(name, 0, 0, _rows()))
    comparison.add(Cell.from_rows("Majority class", 0, 0, _rows(), reference=True))
    assert "No subject-level tests: no run kept its test subjects'" in comparison.report()


def test_in_process_keeps_each_site_s_selected_layers_beside_the_shared_weights(
        small_cohort, tmp_path, capsys) -> None:
    # --engine inprocess: model/selected (MLflow, shared only) with each site's kept layers
    # of that round (the workdir, never MLflow) score what the results table reports
    from mlflow.tracking import MlflowClient

    from fedbn_med.checkpoint import load_tensors
    from fedbn_med.cli import main
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.build import build_site

    store, work = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "work"
    assert main(["--engine", "inprocess", "--sites", "NYU,UM", "--data-dir", str(small_cohort),
                 "--rounds", "4", "--quiet", "--workdir", str(work),
                 "--tracking-uri", store]) == 0
    assert f"{work}/<site>.selected.safetensors" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=store)
    (parent,) = [r for r in client.search_runs(
        [client.get_experiment_by_name("abide-fedbn").experiment_id])
        if r.data.tags.get("mlflow.parentRunId") is None]
    chosen = int(parent.data.metrics["selected_round"])
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "model/selected")}
    if chosen == 4:  # the last round's weights are model/ itself
        artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "model")}
    (path,) = [p for p in artifacts if p.endswith(".safetensors")]
    shared, _ = load_tensors(client.download_artifacts(parent.info.run_id, path,
                                                       str(tmp_path)))
    spec = RunSpec.for_task("abide", sites=("NYU", "UM"), data_dir=small_cohort, rounds=4,
                            device="cpu")
    torch.set_num_threads(1)
    for site in ("NYU", "UM"):
        kept, meta = load_tensors(work / f"{site}.selected.safetensors")
        assert meta["round"] == chosen and kept
        assert not set(kept) & set(shared)  # a site's layers never in the shared file
        trainer = build_site(site, spec, small_cohort, "cpu")
        trainer.load_kept(kept)
        scores = trainer.score(shared)
        rows = client.get_metric_history(
            next(r.info.run_id for r in client.search_runs(
                [parent.info.experiment_id],
                f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.site = '{site}'")),
            "test_auc")
        logged = next(m.value for m in rows if m.step == chosen)
        assert scores["test_auc"] == pytest.approx(logged, abs=1e-4), site


def test_only_a_binary_objective_gives_subject_predictions() -> None:
    from fedbn_med import Segmentation

    trainer = _trainer(False)
    x = trainer.data.test[0]
    prob = trainer.predict(x)
    assert prob.shape == (x.shape[0],) and not prob.requires_grad
    assert trainer.predict(x[:0]).shape == (0,)
    with pytest.raises(NotImplementedError, match="Segmentation gives no per-example "
                                                  "probability of a positive class"):
        Segmentation(("background", "nucleus"), inferer=None).predict(  # type: ignore[arg-type]
            trainer.model, x, trainer.device)
