"""The comparison protocol: best-validation rounds, paired intervals, equal weighting, BN start."""

from __future__ import annotations

import math

import pytest
import torch

from fedbn_med.evaluation.comparison import Cell, Comparison, best_round, interval
from fedbn_med.fl.rounds import Reply, close_round
from fedbn_med.fl.strategies import FedAvg, FedBN
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.training.trainer import SiteData, SiteTrainer


def _rows(val: list[float], test: list[float]) -> list[dict]:
    return [{"round": r + 1, "site": site, "val_accuracy": v + d, "test_accuracy": t + d,
             "val_auc": v, "test_auc": t}
            for r, (v, t) in enumerate(zip(val, test)) for site, d in (("A", 0.0), ("B", 0.1))]


def test_best_round_is_chosen_on_validation_not_test() -> None:
    rows = _rows(val=[0.5, 0.7, 0.6], test=[0.9, 0.4, 0.5])
    assert best_round(rows) == 2  # the test split would have picked round 1
    cell = Cell.from_rows("fedbn", 0, 0, rows)
    assert cell.best_round == 2 and cell.last_round == 3
    assert cell.scores["best"]["accuracy"]["mean"] == pytest.approx(0.45)
    assert cell.scores["last"]["accuracy"]["A"] == pytest.approx(0.5)


def test_paired_interval_removes_what_cells_share() -> None:
    comparison = Comparison(sites=("A", "B"))
    # Cells differ a lot from each other, the methods by a steady 2 pp.
    for i, level in enumerate([0.5, 0.7, 0.6, 0.8, 0.55]):
        comparison.add(Cell.from_rows("fedavg", i, 0, _rows([0.5], [level])))
        comparison.add(Cell.from_rows("fedbn", i, 0, _rows([0.5], [level + 0.02 + 0.001 * i])))
    mean, low, high, n = comparison.difference("fedbn", "fedavg", "best")
    assert n == 5 and mean == pytest.approx(0.022)
    assert 0.0 < low < mean < high < 0.03
    _, unpaired_low, unpaired_high = interval(
        list(comparison.values("fedbn", "best", "accuracy").values()))
    assert unpaired_high - unpaired_low > 10 * (high - low)
    report = comparison.report()
    assert "fedbn - fedavg | accuracy | best | +2.2 |" in report
    assert "fedbn_minus_fedavg.accuracy.best.ci_low" in comparison.metrics()


def test_interval_needs_two_values() -> None:
    mean, low, high = interval([0.6])
    assert mean == 0.6 and math.isnan(low) and math.isnan(high)
    assert interval([0.5, 0.7])[1] < 0.5


def test_equal_weighting_ignores_sample_counts() -> None:
    start = {"w": torch.zeros(1)}
    replies = [Reply("big", {"w": torch.ones(1)}, 900, {}),
               Reply("small", {"w": torch.full((1,), 3.0)}, 100, {})]
    by_samples = close_round(FedAvg(), start, replies, weighting="samples").global_weights
    equal = close_round(FedAvg(), start, replies, weighting="equal").global_weights
    assert float(by_samples["w"]) == pytest.approx(1.2)
    assert float(equal["w"]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="weighting must be"):
        close_round(FedAvg(), start, replies, weighting="by-size")


def _trainer(bn_init: str) -> SiteTrainer:
    torch.manual_seed(0)
    x = torch.randn(40, 20) * 0.05 + 0.3  # small, shifted features, as connectivity is
    y = torch.arange(40) % 2
    data = SiteData(train=(x, y), val=(x[:4], y[:4]), test=(x[:4], y[:4]))
    return SiteTrainer("A", AbideMLP(20), data, FedBN(), bn_init=bn_init, batch_size=8)


def test_bn_statistics_start_from_the_site_data() -> None:
    default, data = _trainer("default"), _trainer("data")
    default.fit({}, {"round": 1})
    data.fit({}, {"round": 1})
    first_default = default.model.net[1].N.running_var  # the first BN layer
    first_data = data.model.net[1].N.running_var
    # PyTorch's start (1) still dominates after 5 batches; the site's start does not.
    assert float(first_default.mean()) > 0.5
    assert float(first_data.mean()) < 0.5 * float(first_default.mean())
    before = data.model.net[1].N.running_mean.clone()
    data.fit({}, {"round": 2})  # no second start: the layer has seen batches
    assert int(data.model.net[1].N.num_batches_tracked) == 15  # start pass + 2 rounds
    assert not torch.equal(before, data.model.net[1].N.running_mean)
