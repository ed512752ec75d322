"""Where a probability becomes a predicted class: 0.5, or each site's training prevalence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedbn_med.evaluation.metrics import classification_metrics
from fedbn_med.spec import RunSpec
from fedbn_med.training.data import SiteData
from fedbn_med.training.objective import BinaryClassification, prior_threshold

CPU = torch.device("cpu")


def _shifted_site(n: int = 40, seed: int = 0) -> tuple[nn.Module, SiteData]:
    """Return a model whose probabilities all lie below 0.5 and a balanced site it ranks well.

    The positive class has the larger first feature; the model's bias pushes every
    probability under 0.5, as a site whose features are shifted against the others' does.
    """
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 3, generator=gen) * 0.3
    x[:, 0] += y.float()
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[1, 0] = 1.0
        model.bias.copy_(torch.tensor([3.0, 0.0]))
    half = n // 2
    return model, SiteData(train=(x[:half], y[:half]), val=(x[half:], y[half:]),
                           test=(x[half:], y[half:]))


def test_the_threshold_moves_the_predictions_and_nothing_else() -> None:
    labels = np.array([0, 0, 1, 1])
    prob = np.array([0.1, 0.3, 0.35, 0.6])
    at_half = classification_metrics(labels, prob, 0.7)
    lower = classification_metrics(labels, prob, 0.7, threshold=0.33)
    assert at_half["positive_rate"] == 0.25 and lower["positive_rate"] == 0.5
    assert lower["accuracy"] == 1.0 and at_half["accuracy"] == 0.75
    assert lower["auc"] == at_half["auc"] and lower["loss"] == at_half["loss"]
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="threshold must be a probability in"):
            classification_metrics(labels, prob, 0.7, threshold=bad)


def test_a_site_whose_scores_lie_on_one_side_is_not_scored_as_one_class() -> None:
    model, data = _shifted_site()
    fixed = BinaryClassification().score(model, data, "test", CPU)
    own = BinaryClassification(threshold="site_prior").score(model, data, "test", CPU)
    assert fixed["positive_rate"] == 0.0 and fixed["balanced_accuracy"] == 0.5
    assert 0.3 <= own["positive_rate"] <= 0.7
    assert own["balanced_accuracy"] > 0.8
    assert own["auc"] == fixed["auc"] and own["loss"] == fixed["loss"]
    # the threshold is the (1 - prevalence) quantile of the training rows' probabilities
    prob = torch.softmax(model(data.train[0]), dim=1)[:, 1].detach().numpy()
    assert prior_threshold(model, data, CPU) == pytest.approx(np.quantile(prob, 0.5))
    assert prior_threshold(model, data, CPU) < 0.5


def test_a_training_split_of_one_class_or_none_keeps_half() -> None:
    model, data = _shifted_site()
    x, _ = data.train
    one_class = SiteData(train=(x, torch.zeros(x.shape[0], dtype=torch.int64)),
                         val=data.val, test=data.test)
    empty = SiteData(train=(x[:0], data.train[1][:0]), val=data.val, test=data.test)
    assert prior_threshold(model, one_class, CPU) == 0.5
    assert prior_threshold(model, empty, CPU) == 0.5


def test_an_unknown_threshold_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="threshold must be one of 0.5, site_prior, got 'median'"):
        BinaryClassification(threshold="median")
    with pytest.raises(ValueError, match="threshold must be one of 0.5, site_prior, got '0.4'"):
        RunSpec.for_task("abide", threshold="0.4")
    spec = RunSpec.for_task("abide", threshold="site_prior")
    assert spec.settings.threshold == "site_prior"
    assert spec.settings.log_params()["threshold"] == "site_prior"
    # the task's torch-free copy of the names is the objective's
    from fedbn_med.tasks.abide.settings import THRESHOLDS as TASK_THRESHOLDS
    from fedbn_med.training.objective import THRESHOLDS

    assert TASK_THRESHOLDS == THRESHOLDS


def test_the_run_scores_every_site_at_its_own_threshold() -> None:
    from fedbn_med.tasks.abide.build import build_trainer
    from fedbn_med.tasks.abide.sites import load_site

    spec = RunSpec.for_task("abide", threshold="site_prior")
    _, data = _shifted_site()
    trainer = build_trainer(load_site("PITT"), spec, data=data, device="cpu")
    assert isinstance(trainer.objective, BinaryClassification)
    assert trainer.objective.threshold == "site_prior"


def test_the_threshold_benchmark_chooses_on_validation_and_publishes_both(
        benchmark_module, tmp_path) -> None:
    import csv

    from tests.test_determinism import write_release

    release = write_release(tmp_path / "release", {"PITT": 12, "YALE": 12, "KKI": 12,
                                                   "TRINITY": 12}, seed=2)
    out = tmp_path / "out"
    bench = benchmark_module("threshold")
    assert bench.main(["--quick", "--data-dir", str(release), "--groups",
                       "PITT,YALE/KKI,TRINITY", "--out", str(out), "--tracking-uri",
                       f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 0
    with open(out / "table.csv", newline="", encoding="utf-8") as handle:
        rows = {r["threshold"]: r for r in csv.DictReader(handle)}
    assert set(rows) == {"0.5", "site_prior", "Majority class", "Motion only (mean FD)",
                         "Ridge, pooled (site z)", "Ridge, site only (site z)"}
    assert sum(r["chosen"] == "True" for r in rows.values()) == 1
    assert rows["0.5"]["chosen"] == "True" or rows["site_prior"]["chosen"] == "True"
    # the majority class predicts one class everywhere: balanced accuracy and AUC 0.5
    majority = rows["Majority class"]
    for g in "AB":
        assert float(majority[f"test_balanced_accuracy_{g}"]) == 0.5
        assert float(majority[f"val_balanced_accuracy_{g}"]) == 0.5
        assert float(majority[f"test_auc_{g}"]) == 0.5
        assert float(majority[f"test_one_class_{g}"]) == 1.0
    for g in "AB":
        # the threshold moves no AUC; the choice follows the validation figures
        assert rows["0.5"][f"test_auc_{g}"] == rows["site_prior"][f"test_auc_{g}"]
        assert 0.0 <= float(rows["site_prior"][f"test_one_class_{g}"]) <= 1.0
    wins = all(float(rows["site_prior"][f"val_balanced_accuracy_{g}"])
               > float(rows["0.5"][f"val_balanced_accuracy_{g}"]) for g in "AB")
    assert rows["site_prior" if wins else "0.5"]["chosen"] == "True"
