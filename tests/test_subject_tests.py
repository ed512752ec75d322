"""Subject-level tests recomputed from a comparison's published per-run predictions.

``fedbn_med.evaluation.comparison.comparison_from_predictions`` and
``benchmarks/research/subject_tests.py``, on predictions the tests make (the round trip through a
real benchmark's published files is in ``tests/test_readme_tables.py``).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from fedbn_med.evaluation.comparison import (
    Cell,
    Comparison,
    SitePredictions,
    comparison_from_predictions,
)
from fedbn_med.evaluation.out_of_fold import cell_prediction_rows
from fedbn_med.evaluation.report import csv_text

KEY = "real_compare-real-PITT_YALE"


def _comparison() -> Comparison:
    """FedBN and FedAvg on two sites, 2 folds x 2 seeds, each site's subjects split in two."""
    rng = np.random.default_rng(4)
    labels = {"PITT": rng.integers(0, 2, 12), "YALE": rng.integers(0, 2, 10)}
    comparison = Comparison(sites=("PITT", "YALE"), n_folds=2)
    for strategy, signal in (("FedBN", 0.3), ("FedAvg", 0.1)):
        for seed in (0, 1):
            order = {s: np.random.default_rng(seed).permutation(y.size)
                     for s, y in labels.items()}
            for fold in (0, 1):
                preds = {}
                for site, y in labels.items():
                    idx = np.sort(order[site][fold::2])
                    prob = np.clip(0.5 + signal * (y[idx] - 0.5)
                                   + 0.2 * rng.standard_normal(idx.size), 0, 1)
                    # each run's own threshold at each site, as with threshold=site_prior
                    preds[site] = SitePredictions(idx, y[idx], prob,
                                                  float(rng.uniform(0.35, 0.65)))
                comparison.add(Cell(strategy, fold, seed, 1, 2, {}, preds))
    return comparison


def _rows(comparison: Comparison) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(csv_text(cell_prediction_rows(comparison)))))


def test_the_rows_rebuild_every_subject_level_figure() -> None:
    original = _comparison()
    rebuilt = comparison_from_predictions(_rows(original), ("PITT", "YALE"))
    assert rebuilt.strategies == original.strategies
    for strategy in original.strategies:
        for site, (idx, y, prob, reps) in original.out_of_fold(strategy).items():
            r_idx, r_y, r_prob, r_reps = rebuilt.out_of_fold(strategy)[site]
            assert np.array_equal(idx, r_idx) and np.array_equal(y, r_y) and reps == r_reps
            np.testing.assert_array_equal(prob, r_prob)  # full precision in the CSV
    for a, b in zip(original.cells, rebuilt.cells):
        assert {s: p.threshold for s, p in a.predictions.items()} == {
            s: p.threshold for s, p in b.predictions.items()}
    assert rebuilt.subject_table(200) == original.subject_table(200)


def test_accuracy_tests_predict_at_each_run_s_threshold() -> None:
    original = _comparison()
    at_half = _rows(original)
    for row in at_half:
        del row["threshold"]  # a file from before thresholds were recorded: 0.5
    half = comparison_from_predictions(at_half, ("PITT", "YALE"))
    assert {p.threshold for c in half.cells for p in c.predictions.values()} == {0.5}
    own, plain = original.subject_tests("FedBN", "FedAvg"), half.subject_tests("FedBN",
                                                                               "FedAvg")
    assert own is not None and plain is not None
    # AUC does not depend on thresholds; the accuracy tests do
    assert own["delong_auc_diff"] == plain["delong_auc_diff"]
    assert own["bootstrap_auc_diff"] == plain["bootstrap_auc_diff"]
    assert (own["mcnemar_a_only"], own["mcnemar_b_only"], own["bootstrap_bal_acc_diff"]) != (
        plain["mcnemar_a_only"], plain["mcnemar_b_only"], plain["bootstrap_bal_acc_diff"])
    # every subject predicted at its run's threshold: one below 0.5 but above a threshold
    # of 0.3 counts as ASD
    c = Comparison(sites=("PITT",), n_folds=2)
    y = np.array([1, 0, 1, 0])
    for strategy, cut in (("FedBN", 0.3), ("FedAvg", 0.5)):
        for fold, idx in ((0, np.array([0, 1])), (1, np.array([2, 3]))):
            c.add(Cell(strategy, fold, 0, 1, 2, {}, {"PITT": SitePredictions(
                idx, y[idx], np.array([0.4, 0.2]), cut)}))
    tests = c.subject_tests("FedBN", "FedAvg", n_boot=100)
    assert tests is not None
    assert (tests["mcnemar_a_only"], tests["mcnemar_b_only"]) == (2, 0)


def test_sites_that_are_not_the_rows_are_named() -> None:
    with pytest.raises(ValueError, match="its predictions are of sites PITT, YALE, the "
                                         "comparison's are PITT, KKI"):
        comparison_from_predictions(_rows(_comparison()), ("PITT", "KKI"), source="f")


def test_a_csv_reader_gives_the_files_own_line() -> None:
    text = csv_text(cell_prediction_rows(_comparison()))
    lines = text.splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",x"  # the third record, after a blank line
    broken = "\n".join([*lines[:2], "", *lines[2:]]) + "\n"
    with pytest.raises(ValueError, match="^f, row 5: expected strategy"):
        comparison_from_predictions(csv.DictReader(io.StringIO(broken)), source="f")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda rows: rows[1].pop("label"), r"row 3: expected strategy, fold, seed"),
    (lambda rows: rows[1].update(fold="x"), r"row 3: expected strategy"),
    (lambda rows: rows[1].update(label="2"),
     r"row 3: label must be 0 or 1, prob_asd and threshold in \[0, 1\]"),
    (lambda rows: rows[1].update(threshold="1.5"), r"row 3: label must be 0 or 1"),
    (lambda rows: rows[1].update(threshold="0.123"),
     r"row 3: threshold 0.123 differs from 0.\d+ of the same run \(FedBN, fold 0, seed 0\) "
     r"at site PITT"),
    (lambda rows: rows[1].update(prob_asd="nan"), r"row 3: label must be 0 or 1"),
    (lambda rows: rows[1].update(subject=rows[0]["subject"], label=rows[0]["label"]),
     r"row 3: subject \d+ of site PITT is listed twice for FedBN, fold 0, seed 0"),
    (lambda rows: next(r for r in rows[1:] if r["subject"] == rows[0]["subject"]
                       and r["site"] == rows[0]["site"]).update(label="1" if rows[0]["label"]
                                                                == "0" else "0"),
     r"row \d+: subject \d+ of site PITT has label \d here and \d in another run"),
])
def test_a_bad_row_is_named(edit: Callable[[list[dict[str, str]]], object],
                            message: str) -> None:
    rows = _rows(_comparison())
    edit(rows)
    with pytest.raises(ValueError, match=f"^file.csv, {message}"):
        comparison_from_predictions(rows, source="file.csv")


@pytest.fixture()
def tool(benchmark_module: Callable[[str], ModuleType], tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = benchmark_module("subject_tests")
    monkeypatch.setattr(module, "PUBLISHED_DIR", tmp_path)
    return module


def test_the_tool_says_whether_the_published_table_is_reproduced(
        tool: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    comparison = _comparison()
    (tmp_path / KEY).mkdir()
    (tmp_path / KEY / tool.FILE).write_bytes(
        gzip.compress(csv_text(cell_prediction_rows(comparison)).encode(), mtime=0))
    table = comparison.subject_table(2000)
    report = tmp_path / KEY / "report.md"
    report.write_text(f"| method | PITT | YALE | mean |\n\nSubject-level paired tests on the "
                      f"out-of-fold predictions (...):\n\n{table}\n", encoding="utf-8")
    assert tool.main(["--key", KEY]) == 0
    assert "Identical to the subject-level table" in capsys.readouterr().err
    report.write_text(f"| method | PITT | YALE | mean |\n\nSubject-level paired tests (...):"
                      f"\n\n{table.replace('|', '| ', 1)}\n", encoding="utf-8")
    assert tool.main(["--key", KEY]) == 1
    assert "DIFFERS from" in capsys.readouterr().err
    # a table that is only the start of the published one does not pass for it
    third = Comparison(sites=comparison.sites, n_folds=2, cells=list(comparison.cells))
    third.cells += [Cell("SingleSet", c.fold, c.seed, 1, 2, {}, c.predictions)
                    for c in comparison.cells if c.strategy == "FedAvg"]
    report.write_text(f"| method | PITT | YALE | mean |\n\nSubject-level paired tests "
                      f"(...):\n\n{third.subject_table(2000)}\n\nBest-validation rounds\n",
                      encoding="utf-8")
    from _published import subject_level_table

    assert subject_level_table(report.read_text()) == third.subject_table(2000)
    assert tool.main(["--key", KEY]) == 1
    assert "DIFFERS from" in capsys.readouterr().err
    # predictions with nothing to pair are an error, not a match
    (tmp_path / KEY / tool.FILE).write_bytes(gzip.compress(csv_text(
        [r for r in cell_prediction_rows(comparison) if r["strategy"] == "FedAvg"]).encode(),
        mtime=0))
    with pytest.raises(SystemExit):
        tool.main(["--key", KEY])
    assert "no pair of FedBN and another method to test" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "message"), [
    (None, "no per-run predictions for 'real_compare-real-PITT_YALE'"),
    (b"not gzip at all", "not a readable gzip CSV"),
    (gzip.compress(b"strategy,fold,seed,site,subject,label,prob_asd\n", mtime=0),
     "holds no predictions"),
], ids=["missing", "not-gzip", "empty"])  # ids fixed: xdist's workers must collect alike
def test_a_missing_or_damaged_file_is_named(tool: ModuleType, tmp_path: Path,
                                            content: bytes | None, message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    if content is not None:
        (tmp_path / KEY).mkdir()
        (tmp_path / KEY / tool.FILE).write_bytes(content)
    with pytest.raises(SystemExit):
        tool.main(["--key", KEY])
    assert message in capsys.readouterr().err
