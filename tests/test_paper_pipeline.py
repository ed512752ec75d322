"""The published federated ABIDE pipeline as an option: sliding windows, per-subject scores,
Adam, and the benchmark that reports honest and best-test-round figures apart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedbn_med.evaluation.metrics import classification_metrics
from fedbn_med.fl.registry import get_strategy
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.tasks.abide.settings import OPTIMIZERS
from fedbn_med.tasks.abide.transforms import SlidingWindowConnectivity
from fedbn_med.training.optim import Adam
from fedbn_med.training.trainer import OPTIMISERS, SiteData, SiteTrainer

ROOT = Path(__file__).resolve().parents[1]


def _fisher_z(window: np.ndarray) -> np.ndarray:
    r = np.corrcoef(window.T)
    rows, cols = np.triu_indices(window.shape[1], k=1)
    return np.arctanh(np.clip(r[rows, cols], -1 + 1e-7, 1 - 1e-7))


def test_sliding_windows_give_one_correlation_vector_per_window():
    rng = np.random.default_rng(0)
    series = rng.normal(size=(75, 6))
    out = SlidingWindowConnectivity(window=32, step=10)(series)
    assert out.shape == (5, 15)  # starts 0, 10, 20, 30, 40
    for i, start in enumerate(range(0, 44, 10)):
        np.testing.assert_allclose(out[i], _fisher_z(series[start:start + 32]), atol=1e-5)
    # a series shorter than a window is one window; a constant ROI gives 0, never NaN
    short = series[:20].copy()
    short[:, 2] = 0.0
    one = SlidingWindowConnectivity(window=32)(short)
    assert one.shape == (1, 15) and np.isfinite(one).all()


def test_window_errors_say_what_is_valid():
    with pytest.raises(ValueError, match=r"window must be an integer of at least 3 volumes, "
                                         r"got 2"):
        SlidingWindowConnectivity(window=2)
    with pytest.raises(ValueError, match=r"windows must be 0 \(off\) or a window length of at "
                                         r"least 3 volumes, got 1"):
        RunSpec.for_task("abide", windows=1)


def test_optimiser_names_agree():
    assert OPTIMIZERS == OPTIMISERS


def _windowed_data() -> SiteData:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 8, generator=gen)
    y = (torch.arange(30) // 5) % 2  # 6 subjects of 5 windows
    groups = torch.arange(30) // 5
    return SiteData(train=(x, y), val=(x[:10], y[:10]), test=(x, y),
                    val_groups=groups[:10], test_groups=groups)


def test_subjects_are_scored_by_the_mean_of_their_windows():
    torch.manual_seed(0)
    trainer = SiteTrainer("A", AbideMLP(8), _windowed_data(), get_strategy("fedbn"),
                          batch_size=6, device="cpu", bn_init="data")
    metrics = trainer.score()
    trainer.model.eval()
    with torch.no_grad():
        prob = torch.softmax(trainer.model(trainer.data.test[0]).double(), 1)
    per_subject = prob.reshape(6, 5, 2).mean(1)
    labels = trainer.data.test[1].reshape(6, 5)[:, 0]
    loss = float(torch.nn.functional.nll_loss(per_subject.log(), labels))
    expected = classification_metrics(labels.numpy(), per_subject[:, 1].numpy(), loss)
    for key, value in expected.items():
        assert metrics[f"test_{key}"] == pytest.approx(value, abs=1e-9), key


def test_adam_with_weight_decay_trains_and_sgd_decay_shrinks_weights():
    data = _windowed_data()
    torch.manual_seed(0)
    adam = SiteTrainer("A", AbideMLP(8), data, get_strategy("fedbn"), lr=1e-2, batch_size=6,
                       device="cpu", optimiser="adam", weight_decay=5e-2)
    start = adam.model.net[0].weight.detach().clone()
    adam.fit({}, {"round": 1})
    adam.fit({}, {"round": 2})
    assert isinstance(adam.optimiser, Adam)
    torch_adam = adam.optimiser.torch_optimiser
    assert torch_adam is not None and torch_adam.defaults["weight_decay"] == 5e-2
    assert not torch.allclose(start, adam.model.net[0].weight)
    with pytest.raises(ValueError, match=r"optimiser must be one of sgd, adam, got 'lbfgs'"):
        SiteTrainer("A", AbideMLP(8), data, get_strategy("fedbn"), optimiser="lbfgs")


def test_the_best_test_round_is_the_published_selection():
    research = ROOT / "benchmarks" / "research"
    spec = importlib.util.spec_from_file_location("paper_pipeline",
                                                  research / "paper_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.path.insert(0, str(research))  # as when run as a script: it puts benchmarks/ on the path
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(research))
    rows = [{"round": r, "site": s, "test_accuracy": a}
            for r, accs in ((1, (0.5, 0.6)), (2, (0.7, 0.8)), (3, (0.8, 0.7)), (4, (0.4, 0.4)))
            for s, a in zip(("A", "B"), accs)]
    assert module.best_test_round(rows) == (2, 0.75)  # the earliest of two tied rounds
    assert module.PAPER["threshold"] == "0.5" and module.PAPER["optimizer"] == "adam"


def test_paper_pipeline_trains_on_windows_and_scores_subjects(small_cohort):
    from fedbn_med.tasks.abide.build import prepare_site_data
    from fedbn_med.tasks.abide.sites import load_sites

    site = load_sites(["UCLA"])["UCLA"]
    spec = RunSpec.for_task("abide", sites=("UCLA",), data_dir=small_cohort, windows=32,
                            window_step=24, harmonize="site_z")
    windowed = prepare_site_data(site, spec)
    plain = prepare_site_data(site, spec.replace(windows=0, harmonize="none"))
    assert windowed.num_train > plain.num_train  # several windows per training subject
    assert windowed.test_groups is not None
    assert len(torch.unique(windowed.test_groups)) == plain.test[0].shape[0]
    assert windowed.train_groups is not None and plain.train_groups is None
    assert len(torch.unique(windowed.train_groups)) == plain.num_train
    np.testing.assert_allclose(windowed.train[0].mean(0).numpy(), 0, atol=1e-4)
