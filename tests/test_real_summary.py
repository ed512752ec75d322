"""``benchmarks/research/real_summary.py``: the comparisons at a glance and the target's
power, from cells.

The tests write a published folder of their own (a ``table.csv`` of cells as the
comparison protocol writes it, and a ``report.md`` naming its n_test/n_train) and check
the figures against the interval the comparison tables use.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from fedbn_med.evaluation.comparison import MAJORITY, MOTION
from fedbn_med.evaluation.intervals import (
    corrected_half_width,
    corrected_half_width_floor,
    corrected_t_interval,
)

KEY = "real_compare-real-PITT_YALE"


@pytest.fixture()
def power(benchmark_module: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_module("real_summary")


def _write(folder: Path, auc: dict[str, list[float]], ratio: str = "0.250",
           folds: int = 5) -> Path:
    key = folder / KEY
    key.mkdir(parents=True)
    with open(key / "table.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["strategy", "fold", "seed", "auc_best_mean",
                                         "balanced_accuracy_best_mean"], lineterminator="\n")
        writer.writeheader()
        for strategy, values in auc.items():
            for k, v in enumerate(values):
                writer.writerow({"strategy": strategy, "fold": k % folds,
                                 "seed": k // folds, "auc_best_mean": v,
                                 "balanced_accuracy_best_mean": v - 0.01})
    (key / "report.md").write_text(f"... (each repetition re-draws every site's split) ... "
                                   f"corrected (Nadeau-Bengio, n_test/n_train = {ratio}) ...\n",
                                   encoding="utf-8")
    return folder


def test_the_figures_are_the_comparison_tables_and_the_projection_is_consistent(
        power: ModuleType, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    fedbn = list(0.65 + 0.05 * rng.standard_normal(15))
    motion = list(0.62 + 0.15 * rng.standard_normal(15))  # noisy and close: a high floor
    folder = _write(tmp_path, {"FedBN": fedbn, MAJORITY: [0.5] * 15, MOTION: motion})
    rows = {r["difference"]: r for r in power.power_rows(KEY, folder=folder)}
    majority, motion_row = rows[f"FedBN - {MAJORITY}"], rows[f"FedBN - {MOTION}"]

    diffs = [a - 0.5 for a in fedbn]
    mean, low, high = corrected_t_interval(diffs, 0.25)
    assert (majority["mean"], majority["corrected_low"], majority["corrected_high"]) == \
        pytest.approx((mean, low, high))
    assert majority["cells"] == 15 and majority["repetitions"] == 3
    # the projection at the observed design is the observed interval's half-width
    assert majority["half_width_3"] == pytest.approx((high - low) / 2)
    # more repetitions narrow it, never below the floor
    assert majority["half_width_50"] < majority["half_width_10"] < majority["half_width_3"]
    assert majority["floor"] < majority["half_width_50"]
    assert majority["floor"] == pytest.approx(1.959964 * np.std(diffs, ddof=1) * 0.5)
    # a mean above the floor: some design excludes 0, and the fewest repetitions do
    needed = majority["repetitions_needed"]
    assert needed is not None
    s = float(majority["sd"])
    assert corrected_half_width(s, 0.25, 5 * needed) < abs(mean)
    assert needed == 1 or corrected_half_width(s, 0.25, 5 * (needed - 1)) >= abs(mean)
    # a mean below the floor: no number of repetitions
    assert motion_row["floor"] > abs(float(motion_row["mean"]))
    assert motion_row["repetitions_needed"] is None
    table = power.render(list(rows.values()))
    assert "none (mean below the floor)" in table and "**excludes 0**" in table

    # the headline: FedBN's own figures and its differences, the target not met
    summary = power.summary_rows(KEY, folder=folder)
    assert summary["fedbn_auc"] == pytest.approx(corrected_t_interval(fedbn, 0.25))
    assert summary["fedbn_balanced_accuracy"] == pytest.approx(
        corrected_t_interval([v - 0.01 for v in fedbn], 0.25))
    assert summary[f"minus_{MAJORITY}"] == pytest.approx((mean, low, high))
    assert low > 0 and summary["target_met"] is False  # motion-only is not beaten
    assert "minus_FedAvg" not in summary
    line = power.render_summary([summary]).splitlines()[-1]
    assert line.startswith("| PITT, YALE | correlation, MLP | 15 |") and "| n/a |" in line
    assert line.endswith("| no | n/a | n/a | n/a |")  # no subject table in its report


def test_the_ratio_comes_from_the_report_and_main_prints_the_table(
        power: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = _write(tmp_path, {"FedBN": [0.6, 0.7, 0.65, 0.62, 0.68], MAJORITY: [0.5] * 5},
                    ratio="0.333")
    (row,) = power.power_rows(KEY, folder=folder)
    assert row["ratio"] == pytest.approx(0.333)
    assert math.isnan(corrected_half_width(0.1, 0.25, 1))
    monkeypatch.setattr(power, "PUBLISHED_DIR", folder)
    assert power.comparison_keys() == [KEY]
    assert power.main([]) == 0
    out = capsys.readouterr().out
    assert "FedBN - Majority class" in out and "n_test/n_train = 0.333" in out
    assert "the target is met where both reference rows' AUC intervals are above 0 " \
        "(0 of 1)" in out  # no motion-only row: not met


def test_the_target_is_met_only_above_both_reference_rows(power: ModuleType,
                                                          tmp_path: Path) -> None:
    fedbn = [0.70, 0.72, 0.69, 0.71, 0.73]
    folder = _write(tmp_path, {"FedBN": fedbn, "FedAvg": [0.6] * 5, MAJORITY: [0.5] * 5,
                               MOTION: [0.52, 0.5, 0.51, 0.49, 0.53]})
    summary = power.summary_rows(KEY, folder=folder)
    assert summary["target_met"] is True
    assert summary["minus_FedAvg"][0] == pytest.approx(np.mean(fedbn) - 0.6)
    last = power.render_summary([summary]).splitlines()[-1]
    assert last.endswith("| **yes** | n/a | n/a | n/a |")


def test_fedbn_behind_is_never_projected_ahead(power: ModuleType) -> None:
    assert power.repetitions_needed(-0.10, 0.01, 0.25, 5) is None
    assert power.repetitions_needed(0.10, 0.01, 0.25, 5) == 1
    assert power._needed(None, -0.10, 0.02) == "none (FedBN not ahead)"
    assert power._needed(None, 0.01, 0.02) == "none (mean below the floor)"
    # the floor is the limit of the projection: never above it, and close far out
    s = 0.1
    assert corrected_half_width_floor(s, 0.25) < corrected_half_width(s, 0.25, 5 * 1000)
    assert corrected_half_width(s, 0.25, 5 * 1000) == pytest.approx(
        corrected_half_width_floor(s, 0.25), rel=1e-2)


def test_shared_splits_and_bad_numbers_are_named(power: ModuleType, tmp_path: Path) -> None:
    folder = _write(tmp_path, {"FedBN": [0.6] * 5, MAJORITY: [0.5] * 5})
    report = folder / KEY / "report.md"
    report.write_text(report.read_text().replace("re-draws every site's split",
                                                 "the repetitions share each fold's split"))
    with pytest.raises(ValueError, match="report.md: its repetitions share each fold's split"):
        power.power_rows(KEY, folder=folder)
    (folder / KEY / "report.md").unlink()
    table = folder / KEY / "table.csv"
    table.write_text(table.read_text().replace("FedBN,0,0,0.6", "FedBN,zero,0,0.6", 1))
    with pytest.raises(ValueError, match=r"table.csv, row 2: fold and seed must be whole"):
        power.power_rows(KEY, folder=folder)
    table.write_text(table.read_text().replace("FedBN,zero,0,0.6", "FedBN,0,0,high", 1))
    with pytest.raises(ValueError, match=r"FedBN, fold 0, seed 0: 'auc_best_mean' must be"):
        power.power_rows(KEY, folder=folder)


@pytest.mark.parametrize(("content", "message"), [
    (None, "no published comparison 'real_compare-real-PITT_YALE'"),
    ("a,b\n1,2\n", "this is not a comparison's table"),
    ("strategy,fold,seed,auc_best_mean\nFedAvg,0,0,0.5\n", "no 'FedBN' rows"),
    ("strategy,fold,seed,acc\nFedBN,0,0,0.5\nMajority class,0,0,0.5\n",
     "no column 'auc_best_mean'"),
])
def test_a_missing_or_wrong_table_is_named(power: ModuleType, tmp_path: Path,
                                           content: str | None, message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    if content is not None:
        (tmp_path / KEY).mkdir()
        (tmp_path / KEY / "table.csv").write_text(content, encoding="utf-8")
    with pytest.raises((FileNotFoundError, ValueError), match=message):
        power.power_rows(KEY, folder=tmp_path)


def test_sites_come_from_the_meta_and_federations_are_ordered(power: ModuleType,
                                                              tmp_path: Path) -> None:
    import json

    keys = {"real_compare-real-MAX_MUN_LEUVEN_2-tangent": "MAX_MUN, LEUVEN_2",
            "real_compare-real-MAX_MUN_LEUVEN_2": "MAX_MUN, LEUVEN_2",
            "real_compare-real-PITT_YALE_KKI": "PITT, YALE, KKI",
            "real_compare-real-PITT_YALE": "PITT, YALE"}
    for key, sites in keys.items():
        (tmp_path / key).mkdir()
        (tmp_path / key / "meta.json").write_text(json.dumps(
            {"key": key, "data": f"real ABIDE Preprocessed (C-PAC), shared sites {sites}"}))
    assert power.site_list("real_compare-real-MAX_MUN_LEUVEN_2", tmp_path) == [
        "MAX_MUN", "LEUVEN_2"]  # the key alone cannot tell where a name ends
    assert power.ordered(list(keys), tmp_path) == [
        "real_compare-real-PITT_YALE", "real_compare-real-MAX_MUN_LEUVEN_2",
        "real_compare-real-MAX_MUN_LEUVEN_2-tangent", "real_compare-real-PITT_YALE_KKI"]
    assert power.describe_key("real_compare-real-PITT_YALE-tangent-linear-wd100") == (
        "PITT_YALE", "tangent, linear wd 100")


def test_the_summary_is_the_comparisons_own_interval(power: ModuleType, tmp_path: Path
                                                     ) -> None:
    """A comparison's own table.csv and report.md in, its own corrected figures out."""
    from fedbn_med.evaluation.comparison import Cell, Comparison
    from fedbn_med.evaluation.report import csv_text

    rng = np.random.default_rng(7)
    comparison = Comparison(sites=("PITT", "YALE"), n_folds=5)
    for strategy, level in (("FedBN", 0.66), ("FedAvg", 0.60), ("SingleSet", 0.57),
                            (MAJORITY, 0.5), (MOTION, 0.55)):
        for seed in range(3):
            for fold in range(5):
                scores = {at: {m: {s: float(level + 0.08 * rng.standard_normal())
                                   for s in ("PITT", "YALE")}
                               for m in ("balanced_accuracy", "auc", "accuracy")}
                          for at in ("best", "last")}
                for by_metric in scores.values():
                    for by_site in by_metric.values():
                        by_site["mean"] = float(np.mean(list(by_site.values())))
                comparison.add(Cell(strategy, fold, seed, 10, 20, scores, n_train=101,
                                    n_test=25, reference=strategy in (MAJORITY, MOTION)))
    key = tmp_path / KEY
    key.mkdir()
    (key / "table.csv").write_text(csv_text(comparison.rows()), encoding="utf-8")
    (key / "report.md").write_text(comparison.report(), encoding="utf-8")
    summary = power.summary_rows(KEY, folder=tmp_path)
    for other in ("FedAvg", "SingleSet", MAJORITY, MOTION):
        mean, low, high, _ = comparison.difference("FedBN", other, "best", "auc",
                                                   corrected=True)
        # the CSV's six decimals and the report's three-decimal ratio (25/101 = 0.2475)
        assert summary[f"minus_{other}"] == pytest.approx((mean, low, high), abs=5e-4)
    mean, low, high = comparison.corrected(comparison.values("FedBN", "best", "auc"))
    assert summary["fedbn_auc"] == pytest.approx((mean, low, high), abs=5e-4)


def _comparison_with_predictions(seed: int = 3) -> object:
    """Five folds x two repetitions of two sites, with every run's test predictions."""
    from fedbn_med.evaluation.comparison import Cell, Comparison, SitePredictions

    rng = np.random.default_rng(seed)
    labels = {site: np.arange(20) % 2 for site in ("PITT", "YALE")}
    comparison = Comparison(sites=("PITT", "YALE"), n_folds=5)
    for strategy, signal in (("FedBN", 1.5), ("FedAvg", 1.0), (MAJORITY, 0.0), (MOTION, 0.3)):
        for rep in range(2):
            for fold in range(5):
                preds = {}
                for site, y in labels.items():
                    test = np.flatnonzero((np.arange(20) + rep) % 5 == fold)
                    prob = (np.full(test.size, 0.5) if strategy == MAJORITY else
                            1 / (1 + np.exp(-(signal * (2 * y[test] - 1)
                                              + rng.standard_normal(test.size)))))
                    preds[site] = SitePredictions(test, y[test], prob)
                scores = {at: {m: {"PITT": 0.6, "YALE": 0.6, "mean": 0.6}
                               for m in ("balanced_accuracy", "auc", "accuracy")}
                          for at in ("best", "last")}
                comparison.add(Cell(strategy, fold, rep, 10, 20, scores, preds, n_train=32,
                                    n_test=8, reference=strategy in (MAJORITY, MOTION)))
    return comparison


def test_the_bootstrap_columns_are_the_reports_subject_level_figures(
        power: ModuleType, tmp_path: Path) -> None:
    from fedbn_med.evaluation.report import csv_text

    comparison = _comparison_with_predictions()
    key = tmp_path / KEY
    key.mkdir()
    (key / "table.csv").write_text(csv_text(comparison.rows()), encoding="utf-8")
    (key / "report.md").write_text(comparison.report(), encoding="utf-8")
    boot = power.bootstrap_auc(KEY, tmp_path)
    assert set(boot) == {MAJORITY, MOTION}
    for ref in (MAJORITY, MOTION):
        tests = comparison.subject_tests("FedBN", ref)
        expected = [tests[f"bootstrap_auc_{k}"] for k in ("diff", "ci_low", "ci_high")]
        assert boot[ref] == pytest.approx(expected, abs=5.1e-4)  # one decimal in pp
    summary = power.summary_rows(KEY, folder=tmp_path)
    assert summary["target_met_bootstrap"] is all(boot[r][1] > 0 for r in (MAJORITY, MOTION))
    table = power.render_summary([summary])
    assert "target met (subject bootstrap)" in table.splitlines()[0]


def test_a_report_without_a_subject_table_says_n_a_and_a_bad_cell_is_named(
        power: ModuleType, tmp_path: Path) -> None:
    _write(tmp_path, {"FedBN": [0.7] * 5, MAJORITY: [0.5] * 5, MOTION: [0.55] * 5})
    assert power.bootstrap_auc(KEY, tmp_path) == {}
    summary = power.summary_rows(KEY, folder=tmp_path)
    assert summary["target_met_bootstrap"] is None
    assert power.render_summary([summary]).splitlines()[2].endswith("| n/a | n/a | n/a |")
    report = tmp_path / KEY / "report.md"
    report.write_text(report.read_text(encoding="utf-8")
                      + "\nSubject-level paired tests (as a report opens them):\n\n"
                      "| difference | subjects | bootstrap AUC diff (pp) [95 % CI] |\n"
                      "|---|---|---|\n| FedBN - Majority class | 40 | +5.0 [oops] |\n",
                      encoding="utf-8")
    with pytest.raises(ValueError, match=r"report\.md: 'FedBN - Majority class': expected"):
        power.bootstrap_auc(KEY, tmp_path)


def test_a_bootstrap_cell_without_a_bound_or_a_value_is_read_not_refused(
        power: ModuleType, tmp_path: Path) -> None:
    _write(tmp_path, {"FedBN": [0.7] * 5, MAJORITY: [0.5] * 5, MOTION: [0.55] * 5})
    report = tmp_path / KEY / "report.md"
    report.write_text(report.read_text(encoding="utf-8")
                      + "\nSubject-level paired tests (as a report opens them):\n\n"
                      "| difference | subjects | bootstrap AUC diff (pp) [95 % CI] |\n"
                      f"|---|---|---|\n| FedBN - {MAJORITY} | 40 | +5.1 |\n"
                      f"| FedBN - {MOTION} | 40 | n/a |\n", encoding="utf-8")
    boot = power.bootstrap_auc(KEY, tmp_path)
    assert set(boot) == {MAJORITY} and boot[MAJORITY][0] == pytest.approx(0.051)
    assert math.isnan(boot[MAJORITY][1]) and math.isnan(boot[MAJORITY][2])
    assert power.summary_rows(KEY, folder=tmp_path)["target_met_bootstrap"] is None


def test_the_baseline_count_keeps_identical_methods_and_missing_intervals_apart(
        power: ModuleType) -> None:
    nan = math.nan
    rows = [{"key": "real_compare-real-PITT_YALE", "FedAvg": (0.05, 0.01, 0.09),
             "silobn": (0.0, 0.0, 0.0), "fedavg_localbn": (0.02, nan, nan),
             "fedavg_sitez": (-0.01, -0.05, 0.03), "Centralized": (-0.08, -0.12, -0.02)}]
    text = power.render_baselines(rows)
    assert ("Of 3 differences with an interval: FedBN ahead (interval above 0) in 1, behind "
            "(interval below 0) in 1, not separated in 1; 1 identical in every cell") in text
    assert "1 without an interval" in text
    header = text.splitlines()[0]
    assert "FedBN - FedProx" in header and "FedBN - FedAvg, ComBat" in header
    assert text.splitlines()[2].count("| n/a ") == 2  # neither FedProx nor ComBat was run


@pytest.mark.parametrize(("key", "described"), [
    ("real_compare-real-PITT_YALE", ("PITT_YALE", "correlation, MLP")),
    ("real_compare-real-PITT_YALE-tangent", ("PITT_YALE", "tangent, MLP")),
    ("real_compare-real-PITT_YALE-fdreg", ("PITT_YALE", "correlation, MLP, mean FD regressed out")),
    ("real_compare-real-PITT_YALE-tangent-linear-wd100",
     ("PITT_YALE", "tangent, linear wd 100")),
    ("real_compare-real-PITT_YALE-b8", ("PITT_YALE", "correlation, MLP, batch 8")),
    ("real_compare-real-PITT_YALE-linear-wd1e-05-b8",
     ("PITT_YALE", "correlation, linear wd 1e-05, batch 8")),
])
def test_every_variant_of_a_key_is_described(power: ModuleType, key: str,
                                             described: tuple[str, str], tmp_path: Path) -> None:
    assert power.describe_key(key, tmp_path) == described


def test_windowed_features_are_read_from_the_report(power: ModuleType, tmp_path: Path
                                                    ) -> None:
    key = "real_compare-real-PITT_YALE"
    (tmp_path / key).mkdir()
    (tmp_path / key / "report.md").write_text(
        "Sites PITT, YALE from DATA_DIR; features: correlation windows of 32 volumes every "
        "16 (a test subject scores the mean of its windows); SGD lr 0.003.\n")
    assert power.describe_key(key, tmp_path) == ("PITT_YALE", "windows 32/16, MLP")
    (tmp_path / f"{key}-w0").mkdir()
    (tmp_path / f"{key}-w0" / "report.md").write_text("features: whole-series correlation;\n")
    assert power.describe_key(f"{key}-w0", tmp_path) == ("PITT_YALE", "correlation, MLP")
