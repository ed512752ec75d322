"""What leaves a site: the same bounded figures on either engine."""

from __future__ import annotations

import math

import pytest

from fedbn_med.fl.release import MAX_LOSS, SCORE_DECIMALS, bounded
from fedbn_med.spec import RunSpec
from fedbn_med.training.inprocess import build_federation


def test_bounded_rounds_and_caps() -> None:
    out = bounded({"val_acc": 0.5185185, "test_loss": 3 * MAX_LOSS, "val_loss": math.inf,
                   "val_auc": math.nan})
    assert out["val_acc"] == round(0.5185185, SCORE_DECIMALS) != 0.5185185
    assert out["test_loss"] == MAX_LOSS
    assert out["val_loss"] == math.inf and math.isnan(out["val_auc"])


@pytest.mark.parametrize("strategy", ["fedbn", "centralized"])
def test_in_process_records_figures_as_sites_send_them(small_cohort, strategy: str) -> None:
    spec = RunSpec(task="abide", strategy=strategy, sites=("NYU", "UM"), rounds=2,
                   data_dir=small_cohort, device="cpu")
    history = build_federation(spec).run()
    figures = [(k, v) for row in history.rows for k, v in row.items()
               if k.endswith(("loss", "accuracy", "auc")) and isinstance(v, float)]
    assert figures
    assert all(v == round(v, SCORE_DECIMALS) for _, v in figures if math.isfinite(v)), figures
