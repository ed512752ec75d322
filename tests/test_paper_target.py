"""``benchmarks/_paper_target.py``: paper_table's verdict against the paper's figures.

The comparisons are built here from cells of known scores and predictions, so every
figure of the section can be checked against the comparison's own corrected interval.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from fedbn_med.evaluation.comparison import Cell, Comparison, SitePredictions

SITES = ("NYU", "UM")


@pytest.fixture()
def target(benchmark_module: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_module("_paper_target")


def _cell(strategy: str, fold: int, seed: int, accuracy: float, auc: float,
          probs: dict[str, list[float]]) -> Cell:
    scores = {at: {"accuracy": {"mean": accuracy}, "auc": {"mean": auc},
                   "balanced_accuracy": {"mean": accuracy}} for at in ("best", "last")}
    preds = {site: SitePredictions(np.arange(len(p)), np.arange(len(p)) % 2, np.array(p))
             for site, p in probs.items()}
    return Cell(strategy, fold, seed, 10, 10, scores, preds, n_train=80, n_test=20)


def _comparison(fedbn_accuracy: list[float], *, one_class_at: tuple[int, str] | None = None
                ) -> Comparison:
    rng = np.random.default_rng(0)
    comparison = Comparison(SITES)
    for i, (fold, seed) in enumerate([(f, s) for s in range(2) for f in range(5)]):
        for name, base in (("FedBN", fedbn_accuracy[i]), ("FedAvg", 0.60), ("SingleSet", 0.55)):
            noise = float(rng.normal(0, 0.02)) if name != "FedBN" else 0.0
            probs = {site: [0.2, 0.8, 0.3, 0.7] for site in SITES}
            if name == "FedBN" and one_class_at == (i, "UM"):
                probs["UM"] = [0.6, 0.9, 0.7, 0.8]
            comparison.add(_cell(name, fold, seed, base + noise, base + noise + 0.05, probs))
    return comparison


def _row(section: str, label: str) -> list[str]:
    line = next(ln for ln in section.splitlines() if ln.startswith(f"| {label}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_accuracy_and_differences_are_the_comparisons_own_corrected_intervals(
        target: ModuleType) -> None:
    comparison = _comparison([0.60 + 0.01 * (i % 5) for i in range(10)])
    section = target.target_section(comparison)
    mean, low, high = comparison.corrected(comparison.values("FedBN", "best", "accuracy"))
    row = _row(section, "FedBN site-mean accuracy")
    assert row[1] == f"{100 * mean:.1f} [{100 * low:.1f}, {100 * high:.1f}]"
    assert row[2] == "68.7" and "**not reached**" in row[3]
    for other, paper in (("FedAvg", "+0.9"), ("SingleSet", "+5.4")):
        for metric, name in (("accuracy", "accuracy"), ("auc", "AUC")):
            d, lo, hi, _ = comparison.difference("FedBN", other, "best", metric, corrected=True)
            cells = _row(section, f"FedBN - {other}, {name}")
            assert cells[1] == f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
            assert cells[2] == (paper if metric == "accuracy" else "—")
    # FedBN is ahead of SingleSet by about 7 pp in every cell: the interval excludes 0
    assert _row(section, "FedBN - SingleSet, accuracy")[3] == "FedBN ahead (interval above 0)"
    assert _row(section, "FedBN (cell, site)")[1:] == ["0 of 20", "—",
                                                       "both classes at every site"]


@pytest.mark.parametrize(("accuracies", "verdict"), [
    ([0.75] * 5 + [0.76] * 5, "**reached**, and the interval is above it"),
    ([0.60, 0.80] * 5, "**reached** (the mean; the interval reaches below it)"),
    ([0.55, 0.75] * 5, "**not reached** (the mean; the interval reaches above it)"),
    ([0.50] * 5 + [0.51] * 5, "**not reached**, and the interval is below it"),
])
def test_the_verdict_reads_the_mean_and_its_interval_against_68_7(
        target: ModuleType, accuracies: list[float], verdict: str) -> None:
    section = target.target_section(_comparison(accuracies))
    assert _row(section, "FedBN site-mean accuracy")[3] == verdict


def test_a_site_predicted_one_class_is_counted_and_named(target: ModuleType) -> None:
    comparison = _comparison([0.6] * 10, one_class_at=(3, "UM"))
    assert target.one_class_results(comparison, "FedBN") == (1, 0, 20)
    assert target.one_class_results(comparison, "FedAvg") == (0, 0, 20)
    row = _row(target.target_section(comparison), "FedBN (cell, site)")
    assert row[1] == "1 of 20" and "one class only at some sites" in row[3]


def test_without_fedbn_there_is_no_section_and_missing_baselines_are_left_out(
        target: ModuleType) -> None:
    comparison = _comparison([0.6] * 10)
    only_fedavg = Comparison(SITES, [c for c in comparison.cells if c.strategy == "FedAvg"])
    assert target.target_section(only_fedavg) == ""
    no_singleset = Comparison(SITES, [c for c in comparison.cells if c.strategy != "SingleSet"])
    section = target.target_section(no_singleset)
    assert "FedBN - FedAvg, accuracy" in section and "SingleSet" not in section
    assert re.search(r"at least 68\.7 %", section)


@pytest.mark.parametrize(("accuracy", "verdict"), [
    (0.75, "**reached** (the mean of one cell; no interval)"),
    (0.60, "**not reached** (the mean of one cell; no interval)"),
])
def test_one_cell_has_no_interval_and_the_verdict_says_so(
        target: ModuleType, accuracy: float, verdict: str) -> None:
    comparison = Comparison(SITES)
    probs = {site: [0.2, 0.8] for site in SITES}
    for name in ("FedBN", "FedAvg"):
        comparison.add(_cell(name, 0, 0, accuracy, accuracy, probs))
    section = target.target_section(comparison)
    assert _row(section, "FedBN site-mean accuracy")[1:] == [f"{100 * accuracy:.1f}", "68.7",
                                                             verdict]
    assert _row(section, "FedBN - FedAvg, accuracy")[1:] == [
        "+0.0 (one cell: no interval)", "+0.9", "no interval"]


def test_a_mean_just_below_the_target_is_not_printed_as_the_target(target: ModuleType
                                                                   ) -> None:
    section = target.target_section(_comparison([0.6866, 0.6868] * 5))
    shown = _row(section, "FedBN site-mean accuracy")
    assert shown[1].startswith("68.67 [") and shown[3].startswith("**not reached**")


def test_a_diverged_run_is_no_valid_prediction_and_the_majority_row_is_beside_it(
        target: ModuleType) -> None:
    comparison = _comparison([0.6] * 10)
    cell = next(c for c in comparison.cells if c.strategy == "FedBN")
    bad = cell.predictions["NYU"]
    cell.predictions["NYU"] = SitePredictions(bad.index, bad.labels,
                                              np.array([0.2, np.nan, 0.3, 0.7]))
    assert target.one_class_results(comparison, "FedBN") == (0, 1, 20)
    row = _row(target.target_section(comparison), "FedBN (cell, site)")
    assert row[1] == "0 of 20 (1 without a valid prediction)"
    assert "no valid prediction at some sites" in row[3]
    from fedbn_med.evaluation.comparison import MAJORITY

    for fold in range(5):
        comparison.add(_cell(MAJORITY, fold, 0, 0.58, 0.5, {s: [0.6] * 4 for s in SITES}))
    section = target.target_section(comparison)
    mean, low, high = comparison.corrected(comparison.values(MAJORITY, "best", "accuracy"))
    assert _row(section, f"{MAJORITY} site-mean accuracy")[1] == (
        f"{100 * mean:.1f} [{100 * low:.1f}, {100 * high:.1f}]")
