"""The linear rows of every ABIDE table: ridge references and the linear model under FedBN."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedbn_med.evaluation.cell_data import PreparedSite
from fedbn_med.evaluation.comparison import REFERENCES, RIDGE_POOLED, RIDGE_SITE
from fedbn_med.evaluation.metrics import classification_metrics
from fedbn_med.evaluation.references import reference_cells, ridge_probabilities
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.splits import site_splits
from fedbn_med.training.trainer import SiteData


def _site(seed: int, shift: float, n: int = 60, p: int = 40, signal: float = 0.9
          ) -> PreparedSite:
    """A site whose first 5 features carry the diagnosis, shifted and scaled by site."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % 3 == 0).astype(np.int64)  # one third ASD
    x = rng.normal(size=(n, p))
    x[:, :5] += signal * labels[:, None]
    x = x * (1 + shift) + 3 * shift  # the site effect per-site z-scoring removes
    split = site_splits(labels, seed=seed)
    t = torch.as_tensor(x, dtype=torch.float32)
    y = torch.as_tensor(labels)
    part = lambda i: (t[torch.as_tensor(np.array(i))], y[torch.as_tensor(np.array(i))])  # noqa: E731
    return PreparedSite(SiteData(part(split.train), part(split.val), part(split.test)),
                        split, labels, np.full(n, np.nan), x)


def _with(site: PreparedSite, *, features: np.ndarray | None = None,
          labels: np.ndarray | None = None) -> PreparedSite:
    return PreparedSite(site.data, site.split,
                        site.labels if labels is None else labels, site.mean_fd,
                        site.features if features is None else features)


def _ridge(cells: list) -> dict[str, dict[str, np.ndarray]]:
    return {c.strategy: {s: p.prob for s, p in c.predictions.items()}
            for c in cells if c.strategy in (RIDGE_POOLED, RIDGE_SITE)}


def test_ridge_rows_are_in_every_reference_set_and_learn_the_signal() -> None:
    sites = {"A": _site(0, 0.0), "B": _site(1, 2.0), "C": _site(2, 5.0)}
    cells = reference_cells(0, 0, sites)
    assert [c.strategy for c in cells] == list(REFERENCES)
    pooled = next(c for c in cells if c.strategy == RIDGE_POOLED)
    assert pooled.reference and pooled.scores["best"]["auc"]["mean"] > 0.8
    # the probabilities are the scores the rows are tabulated by
    s = sites["B"]
    prob = pooled.predictions["B"].prob
    assert np.all((prob >= 0) & (prob <= 1))
    expected = classification_metrics(s.labels[s.split.test], prob, 0.0)["auc"]
    assert pooled.scores["best"]["auc"]["B"] == pytest.approx(expected)


def test_the_ridge_never_reads_a_test_subject() -> None:
    sites = {"A": _site(0, 0.0), "B": _site(1, 2.0)}
    before = _ridge(reference_cells(0, 0, sites))
    # flipping the test subjects' labels changes nothing: no model read them
    flipped = {}
    for name, s in sites.items():
        labels = s.labels.copy()
        labels[s.split.test] = 1 - labels[s.split.test]
        flipped[name] = _with(s, labels=labels)
    after = _ridge(reference_cells(0, 0, flipped))
    for row in before:
        for site in sites:
            assert np.array_equal(before[row][site], after[row][site])
    # scored on validation, the ridge is fitted on training subjects alone: test subjects
    # made NaN (features) and flipped (labels) leave every prediction finite and unchanged
    val_before = _ridge(reference_cells(0, 0, sites, scored_on="val"))
    poisoned = {}
    for name, s in sites.items():
        x = s.features.copy()
        x[s.split.test] = np.nan
        poisoned[name] = _with(flipped[name], features=x)
    val_after = _ridge(reference_cells(0, 0, poisoned, scored_on="val"))
    for row in val_before:
        for site in sites:
            assert np.isfinite(val_after[row][site]).all()
            assert np.array_equal(val_before[row][site], val_after[row][site])


def test_ridge_refuses_to_score_a_subject_it_was_fitted_on() -> None:
    s = _site(0, 0.0)
    fit = np.concatenate([s.split.train, s.split.val])
    with pytest.raises(ValueError, match="Site A: subjects to score are among those fitted"):
        ridge_probabilities({"A": (s.features, s.labels, fit)}, {"A": fit[:3]}, pooled=True)


def test_pooling_pays_when_each_site_is_small() -> None:
    # 4 small sites, the same signal under different site effects: the pooled ridge
    # (per-site z) sees 4 times the subjects
    sites = {k: _site(i, 2.0 * i, n=30, p=200, signal=1.0) for i, k in enumerate("ABCD")}
    aucs = {c.strategy: c.scores["best"]["auc"]["mean"] for c in reference_cells(0, 0, sites)}
    assert aucs[RIDGE_POOLED] > aucs[RIDGE_SITE]


def test_a_compare_entry_names_the_linear_model() -> None:
    spec = RunSpec.for_task("abide", strategy="fedbn:linear")
    assert (spec.strategy, spec.settings.model, spec.label) == ("fedbn", "linear",
                                                                "fedbn:linear")
    assert RunSpec.for_task("abide", strategy="fedbn").label == "fedbn"
    assert RunSpec.for_task("abide", strategy=spec.label) == spec
    with pytest.raises(ValueError, match="model must be one of mlp, linear, got 'cnn'"):
        RunSpec.for_task("abide", strategy="fedbn:cnn")
    with pytest.raises(ValueError, match="task 'mri' has no choice of network; use 'fedbn'"):
        RunSpec.for_task("mri", strategy="fedbn:linear")


@pytest.mark.parametrize("strategy", ["fedbn", "silobn"])
def test_the_linear_models_input_bn_stays_at_its_site(small_cohort: Path,
                                                      strategy: str) -> None:
    from fedbn_med.training.inprocess import build_federation

    spec = RunSpec.for_task("abide", strategy=f"{strategy}:linear", rounds=1,
                            data_dir=small_cohort, sites=("UM", "UCLA"))
    federation = build_federation(spec)
    history = federation.run()
    bn = {"net.0.N.running_mean", "net.0.N.running_var", "net.0.N.num_batches_tracked"}
    assert bn <= federation.kept  # the standardiser is the site's own
    assert not bn & set(history.global_weights)  # and never reached the server
    assert "net.1.weight" in history.global_weights
    um, ucla = (t.model.state_dict() for t in federation.trainers.values())
    assert not torch.equal(um["net.0.N.running_mean"], ucla["net.0.N.running_mean"])
