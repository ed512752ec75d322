"""The benchmarks' sweep harness (``benchmarks/_sweep.py``) and pairing by cell.

Two strategies' scores pair by their (axis value, fold, seed) cell, never by the position
of a run in a list: each test here collects one side in another order than the other,
where pairing by position would give other figures. No model is trained: the runs are
replaced by rows made from the cell.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

import fedbn_med
from fedbn_med.evaluation.comparison import Cell, Comparison
from fedbn_med.evaluation.pairing import paired_differences
from fedbn_med.evaluation.tables import markdown_table

CELLS = [(0, 0), (0, 1), (1, 0), (1, 1)]


def _score(strategy: str, value: float, fold: int, seed: int) -> float:
    """Return a score that differs in every cell, so that a mis-pairing shows."""
    return 0.5 + 0.1 * fold + 0.03 * seed + (0.05 if strategy == "fedbn" else 0.0) + value


def _rows(score: float) -> list[dict[str, float | int | str]]:
    """Return two rounds of two sites; round 1 has the lower validation loss."""
    return [{"round": rnd, "site": site, "val_loss": 0.5 + rnd, "test_balanced_accuracy":
             score if rnd == 1 else 0.0, "test_auc": score, "test_accuracy": score}
            for rnd in (1, 2) for site in ("A", "B")]


def test_paired_differences_pair_by_key_not_position():
    a = {cell: _score("fedbn", 0.0, *cell) for cell in CELLS}
    b = {cell: _score("fedavg", 0.0, *cell) for cell in reversed(CELLS)}
    diffs = paired_differences(a, b)
    assert diffs == pytest.approx({cell: 0.05 for cell in CELLS})
    by_position = [x - y for x, y in zip(a.values(), b.values())]
    assert by_position != pytest.approx([0.05] * len(CELLS))  # what pairing by list does


def test_paired_differences_refuse_a_cell_on_one_side():
    a = {(0, 0): 0.6, (0, 1): 0.7}
    b = {(0, 0): 0.5, (1, 0): 0.4}
    with pytest.raises(ValueError, match=r"only in the first: \[\(0, 1\)\], only in the "
                                         r"second: \[\(1, 0\)\]"):
        paired_differences(a, b)
    assert paired_differences(a, b, require_same=False) == pytest.approx({(0, 0): 0.1})


def test_comparison_difference_pairs_cells_added_in_another_order():
    comparison = Comparison(sites=("A", "B"))
    order = list(CELLS)
    for strategy in ("fedbn", "fedavg"):
        for fold, seed in order:
            comparison.add(Cell.from_rows(strategy, fold, seed,
                                          _rows(_score(strategy, 0.0, fold, seed))))
        random.Random(0).shuffle(order)  # the second strategy's cells come shuffled
    mean, low, high, n = comparison.difference("fedbn", "fedavg", "best", "balanced_accuracy")
    assert n == len(CELLS)
    assert (mean, low, high) == pytest.approx((0.05, 0.05, 0.05))


def test_sweep_pairs_by_cell_when_runs_arrive_shuffled(benchmark_module, monkeypatch,
                                                       tmp_path):
    common = benchmark_module("_common")
    sweep_mod = benchmark_module("_sweep")
    parser = common.make_parser("sweep_test", "test", full=common.Budget(3, 2, 2),
                                quick=common.Budget(3, 2, 2))
    bench = common.Benchmark(parser, ["--out", str(tmp_path)])
    assert bench.cells == CELLS

    def shuffled(grid, desc=None):
        bench.runs += len(grid)
        grid = list(grid)
        random.Random(1).shuffle(grid)
        return grid

    def fake_run(config, *, data=None, workdir=None):
        score = _score(config.strategy, config.lr, config.fold, config.seed)
        return SimpleNamespace(rows=_rows(score))

    monkeypatch.setattr(bench, "progress", shuffled)
    monkeypatch.setattr(fedbn_med, "run", fake_run)  # what run_grid calls

    def spec(value, strategy, fold, seed):
        return bench.config(strategy=strategy, fold=fold, seed=seed, lr=value)

    comparisons = sweep_mod.sweep(bench, (0.01, 0.02), ("fedbn", "fedavg"), spec)
    assert bench.runs == 2 * 2 * len(CELLS)
    for value, comparison in comparisons.items():
        expected = {cell: _score("fedbn", value, *cell) for cell in CELLS}
        assert comparison.values("fedbn", "best", "balanced_accuracy") == pytest.approx(
            expected)
        for ci in ("naive", "corrected"):
            mean, low, high = sweep_mod.gap(comparison, "fedbn", "fedavg", ci=ci)
            assert (mean, low, high) == pytest.approx((0.05, 0.05, 0.05))
        mean, _, _ = sweep_mod.summary(comparison, "fedavg", ci="naive")
        assert mean == pytest.approx(0.5 + 0.05 + 0.015 + value)


def test_markdown_table_is_the_one_renderer():
    assert markdown_table(["a", "b"], [[1, "x"], [2.5, None]]) == (
        "| a | b |\n|---|---|\n| 1 | x |\n| 2.5 | None |")
