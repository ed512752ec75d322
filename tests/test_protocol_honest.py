"""The honest protocol: re-drawn splits, validation-loss selection, per-subject predictions,
reference rows, corrected intervals and subject-level tests, on a real (small) comparison."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedbn_med.evaluation.cell_data import PreparedSite
from fedbn_med.evaluation.comparison import (
    MAJORITY,
    MOTION,
    REFERENCES,
    Cell,
    Comparison,
    best_round,
)
from fedbn_med.evaluation.metrics import classification_metrics
from fedbn_med.evaluation.references import reference_cells
from fedbn_med.evaluation.runner import compare, run_cell
from fedbn_med.fl.release import SCORE_DECIMALS
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.build import prepare_site_data
from fedbn_med.tasks.abide.sites import load_sites
from fedbn_med.tasks.abide.splits import repetition_split_seed, site_splits
from fedbn_med.training.trainer import SiteData

SITES = ("NYU", "UM", "USM", "UCLA")
BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
LABELS = np.array([1] * 37 + [0] * 27)
#: How far a run's recorded score may lie from the full-precision one: a site's figures
#: are recorded as it sends them, to fl.release.SCORE_DECIMALS decimals.
BOUNDED = 0.5 * 10.0 ** -SCORE_DECIMALS + 1e-12


# -- splits ----------------------------------------------------------------------------------
def test_repetition_seed_zero_keeps_the_site_file_split() -> None:
    assert repetition_split_seed(0, 0) == 0 and repetition_split_seed(7, 0) == 7
    seeds = {repetition_split_seed(0, s) for s in range(1, 6)}
    assert len(seeds) == 5 and 0 not in seeds
    assert repetition_split_seed(0, 1) != repetition_split_seed(1, 1)


@pytest.mark.parametrize(("args", "message"), [
    ((-1, 0), "split_seed must be a non-negative integer, got -1"),
    ((0, 1.5), "seed must be an integer, got 1.5"),
    ((True, 0), "split_seed must be an integer, got True"),
])
def test_repetition_seed_refuses_bad_seeds(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        repetition_split_seed(*args)


def test_repetitions_redraw_splits_and_validation_comes_from_training() -> None:
    tests = {s: [site_splits(LABELS, fold=k, seed=repetition_split_seed(0, s)).test
                 for k in range(5)] for s in range(3)}
    for folds in tests.values():  # each repetition's test folds partition the site
        assert np.array_equal(np.sort(np.concatenate(folds)), np.arange(len(LABELS)))
    assert not np.array_equal(tests[0][0], tests[1][0])
    assert not np.array_equal(tests[1][0], tests[2][0])
    for fraction in (0.0, 0.1, 0.3):  # the test fold does not depend on validation
        split = site_splits(LABELS, fold=2, seed=5, val_fraction=fraction)
        assert np.array_equal(split.test, site_splits(LABELS, fold=2, seed=5).test)
        assert not set(split.val) & set(split.test)


def test_run_seed_redraws_the_site_split(small_cohort: Path) -> None:
    site = load_sites(["UCLA"])["UCLA"]
    spec = RunSpec.for_task("abide", data_dir=small_cohort, sites=("UCLA",))
    first, again = (prepare_site_data(site, spec) for _ in range(2))
    other = prepare_site_data(site, spec.replace(seed=1))
    assert torch.equal(first.test[0], again.test[0])
    assert first.test[0].shape[0] == other.test[0].shape[0]
    assert not torch.equal(first.test[0], other.test[0])


# -- selection ---------------------------------------------------------------------------------
def _rows(val_loss: list[float], val_acc: list[float]) -> list[dict]:
    return [{"round": r + 1, "site": s, "val_loss": vl, "val_accuracy": va,
             "test_accuracy": 0.1 * (r + 1), "test_balanced_accuracy": 0.1 * (r + 1),
             "test_auc": 0.5}
            for r, (vl, va) in enumerate(zip(val_loss, val_acc)) for s in ("A", "B")]


def test_best_round_is_the_lowest_validation_loss() -> None:
    rows = _rows(val_loss=[0.7, 0.6, 0.65, 0.6], val_acc=[0.9, 0.5, 0.5, 0.5])
    assert best_round(rows) == 2  # the earliest lowest loss; accuracy would say 1
    assert best_round(rows, "accuracy") == 1
    cell = Cell.from_rows("fedbn", 0, 0, rows)
    assert cell.scores["best"]["balanced_accuracy"]["mean"] == pytest.approx(0.2)
    no_loss = [{k: v for k, v in r.items() if k != "val_loss"} for r in rows]
    assert best_round(no_loss) == 1


def test_a_round_with_a_broken_validation_loss_at_one_site_is_never_selected(caplog) -> None:
    rows = _rows(val_loss=[0.7, 0.3, 0.65, 0.6], val_acc=[0.5, 0.5, 0.5, 0.5])
    rows[3]["val_loss"] = math.nan  # round 2 at site B: the mean over A alone would win
    with caplog.at_level("WARNING", logger="fedbn_med.evaluation.comparison"):
        assert best_round(rows) == 4
    assert "round 2, sites B" in caplog.text
    every = [{**r, "val_loss": math.inf} for r in rows]
    with caplog.at_level("WARNING", logger="fedbn_med.evaluation.comparison"):
        assert best_round(every) == 1  # then validation accuracy, the earliest on ties
    assert "selecting by validation accuracy instead" in caplog.text


# -- reference rows --------------------------------------------------------------------------
def _prepared(fd: np.ndarray, labels: np.ndarray, seed: int = 0) -> PreparedSite:
    split = site_splits(labels, seed=seed)
    x = torch.zeros(len(labels), 3)
    y = torch.as_tensor(labels.copy())
    part = lambda i: (x[torch.as_tensor(i)], y[torch.as_tensor(i)])  # noqa: E731
    return PreparedSite(SiteData(part(split.train), part(split.val), part(split.test)),
                        split, labels, fd, np.zeros((len(labels), 3)))


def test_reference_rows_are_fitted_on_the_training_split() -> None:
    rng = np.random.default_rng(0)
    labels = np.array([1] * 30 + [0] * 50)
    fd = np.where(labels == 1, 0.2, 0.1) + rng.normal(scale=0.01, size=80)
    fd[3] = np.nan  # a missing FD is imputed, not a crash
    flat = rng.random(80)  # an FD with no link to the diagnosis
    cells = reference_cells(0, 0, {"S": _prepared(fd, labels), "T": _prepared(flat, labels)})
    majority, motion, *_ = cells
    assert (majority.strategy, motion.strategy) == (MAJORITY, MOTION)
    assert majority.scores["best"]["balanced_accuracy"]["S"] == 0.5
    assert majority.scores["best"]["auc"]["mean"] == 0.5
    assert majority.scores["best"]["accuracy"]["S"] == pytest.approx(50 / 80, abs=0.07)
    assert motion.scores["best"]["auc"]["S"] > 0.95
    assert motion.scores["best"]["auc"]["T"] < 0.9
    assert motion.reference and motion.predictions["S"].index.size == 16
    # scored on the validation subjects instead (tables that read no test split)
    site = _prepared(fd, labels)
    for cell in reference_cells(0, 0, {"S": site}, scored_on="val"):
        assert np.array_equal(cell.predictions["S"].index, site.split.val)
        assert not set(cell.predictions["S"].index) & set(site.split.test)
    with pytest.raises(ValueError, match="scored_on must be 'test' or 'val', got 'train'"):
        reference_cells(0, 0, {"S": site}, scored_on="train")  # type: ignore[arg-type]


# -- a real comparison -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def comparison(small_cohort: Path) -> Comparison:
    """FedAvg and FedBN on 2 folds x 2 repetitions of 2 rounds (8 runs)."""
    return compare(SITES, small_cohort, ("fedavg", "fedbn"), folds=2, seeds=2, rounds=2)


def test_every_cell_has_its_runs_and_the_reference_rows(comparison: Comparison) -> None:
    assert comparison.strategies == ["fedavg", "fedbn", *REFERENCES]
    assert REFERENCES[:2] == (MAJORITY, MOTION)
    assert len(comparison.cells) == 24
    assert {(c.fold, c.seed) for c in comparison.cells} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert comparison.test_train_ratio == pytest.approx(0.25, abs=0.02)


def test_predictions_are_the_selected_rounds_model(comparison: Comparison) -> None:
    for cell in comparison.cells:
        for site, p in cell.predictions.items():
            scores = classification_metrics(p.labels, p.prob, 0.0, threshold=p.threshold)
            for metric in ("balanced_accuracy", "auc", "accuracy"):  # scores: as sites send them
                assert scores[metric] == pytest.approx(cell.scores["best"][metric][site],
                                                       abs=BOUNDED)


def test_repetitions_test_different_subjects_and_folds_partition(
        comparison: Comparison) -> None:
    fedbn = [c for c in comparison.cells if c.strategy == "fedbn"]
    by = {(c.fold, c.seed): c.predictions for c in fedbn}
    assert any(not np.array_equal(by[0, 0][s].index, by[0, 1][s].index) for s in SITES)
    for seed in (0, 1):  # within a repetition the folds' test subjects are disjoint
        for s in SITES:
            assert not set(by[0, seed][s].index) & set(by[1, seed][s].index)
    oof = comparison.out_of_fold("fedbn")
    assert set(oof) == set(SITES)
    for index, labels, prob, reps in oof.values():
        assert reps >= 1 and np.all(np.diff(index) > 0) and labels.size == prob.size


def test_corrected_intervals_are_wider_and_reported(comparison: Comparison) -> None:
    mean, low, high, n = comparison.difference("fedbn", "fedavg", "best", "balanced_accuracy")
    c_mean, c_low, c_high, _ = comparison.difference("fedbn", "fedavg", "best",
                                                     "balanced_accuracy", corrected=True)
    assert n == 4 and c_mean == pytest.approx(mean)
    assert c_high - c_low > high - low
    report = comparison.report()
    for text in ("re-draws every site's split", "| Majority class |",
                 "| Motion only (mean FD) |", "corrected 95 % CI (pp)",
                 "| fedbn - fedavg | balanced_accuracy | best |",
                 "Subject-level paired tests", "| fedbn - Motion only (mean FD) |"):
        assert text in report
    tests = comparison.subject_tests("fedbn", "fedavg", n_boot=200)
    assert tests is not None and 0 <= tests["mcnemar_p"] <= 1 and 0 <= tests["delong_p"] <= 1
    assert tests["subjects"] == sum(o[0].size for o in comparison.out_of_fold("fedbn").values())
    assert tests["bootstrap_auc_ci_low"] <= tests["bootstrap_auc_diff"] <= tests[
        "bootstrap_auc_ci_high"]
    same = comparison.subject_tests("fedbn", "fedbn", n_boot=200)
    assert same is not None and same["bootstrap_auc_diff"] == 0.0
    assert same["bootstrap_auc_ci_low"] == same["bootstrap_auc_ci_high"] == 0.0
    assert "bootstrap AUC diff (pp) [95 % CI]" in report
    metrics = comparison.metrics()
    assert "fedbn_minus_fedavg.balanced_accuracy.best.corrected_ci_low" in metrics


def test_fixed_splits_collapse_repetitions_before_the_correction(
        comparison: Comparison) -> None:
    fixed = Comparison(sites=comparison.sites, cells=comparison.cells, resplit=False)
    values = fixed.values("fedbn", "best", "auc")
    assert len(fixed._collapse(values)) == 2  # one value per fold
    assert len(comparison._collapse(values)) == 4


def test_interval_design_projection_has_a_floor() -> None:
    sys.path.insert(0, str(BENCH_DIR / "research"))
    try:
        design = importlib.import_module("interval_design")
    finally:
        sys.path.remove(str(BENCH_DIR / "research"))
    widths = [design.projected_half_width(0.05, 0.25, 5, r, 1) for r in (1, 10, 1000)]
    assert widths[0] > widths[1] > widths[2] > 1.96 * 0.05 * math.sqrt(0.25)
    assert design.projected_half_width(0.05, 0.25, 5, 10, 4) == pytest.approx(widths[1] / 2)


def test_rounds_to_target_counts_censored_runs() -> None:
    sys.path.insert(0, str(BENCH_DIR / "research"))
    try:
        rtt = importlib.import_module("rounds_to_target")
    finally:
        sys.path.remove(str(BENCH_DIR / "research"))
    reach = [3, None, 5, None, None]
    assert rtt.restricted(reach, 10) == [3.0, 10.0, 5.0, 10.0, 10.0]
    assert rtt.km_median(reach, 10) is None  # 2 of 5 reach it: no median
    assert rtt.km_median([3, None, 5, 4], 10) == 4


# -- DP in honest terms ----------------------------------------------------------------------
def test_replace_one_epsilon_is_computed_and_larger() -> None:
    from fedbn_med.fl.dp_terms import replace_one_epsilon
    from fedbn_med.fl.privacy import epsilon

    for noise, rounds in ((1.0, 20), (2.0, 100), (0.8, 50)):
        add_remove = epsilon(noise, rounds, 1e-5)
        replace = replace_one_epsilon([(noise, 1.0, rounds)], 1e-5)
        assert replace == pytest.approx(epsilon(noise / 2, rounds, 1e-5))
        assert 2.0 < replace / add_remove < 4.0


def test_large_epsilon_warns_and_seeded_noise_is_labelled_not_private(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedbn_med.evaluation.report import result_columns, site_table
    from fedbn_med.fl import dp_terms
    from fedbn_med.fl.dp_terms import LargeEpsilonWarning

    # each message is said once per process: start from none said, whatever ran before
    monkeypatch.setattr(dp_terms, "_WARNED", set())

    with pytest.warns(LargeEpsilonWarning, match=r"spends add/remove epsilon = .*above 10"):
        RunSpec.for_task("abide", strategy="fedbn", dp_clip=1.0, dp_noise=0.5, rounds=31)
    # add/remove under 10, replace-one over it (sigma 3.49, 30 rounds): warned too
    from fedbn_med.fl.privacy import SAMPLE_RATE, epsilon

    assert epsilon(3.49, 30, 1e-5) < 10 < dp_terms.replace_one_epsilon(
        [(3.49, SAMPLE_RATE, 30)], 1e-5)
    with pytest.warns(LargeEpsilonWarning, match=r"add/remove epsilon = 8\.\d+, "
                                                 r"replace-one-patient epsilon 1\d\.\d+: above 10"):
        RunSpec.for_task("abide", strategy="fedbn", dp_clip=1.0, dp_noise=3.49, rounds=30)
    with pytest.warns(LargeEpsilonWarning, match="NOT PRIVATE: seeded noise"):
        spec = RunSpec.for_task("abide", strategy="fedbn", dp_clip=1.0, dp_noise=5.0,
                                rounds=3, dp_seeded_noise=True)
    assert spec.privacy().seeded  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="dp_seeded_noise seeds the noise of client-level DP"):
        RunSpec.for_task("abide", dp_seeded_noise=True)
    final = {"A": {"test_accuracy": 0.6, "dp_epsilon": 12.0, "dp_epsilon_replace_one": 30.0,
                   "dp_seeded": 1.0, "num_examples": 10}}
    table = site_table(final, result_columns(final))
    assert "epsilon add/remove (mean row: max; above 10: weak; NOT PRIVATE" in table
    assert "epsilon replace-one" in table and "| 30.000 |" in table


def test_seeded_noise_repeats_and_private_noise_does_not() -> None:
    from fedbn_med.fl.privacy import UpdatePrivacy
    from fedbn_med.fl.strategies import FedAvg
    from fedbn_med.tasks.abide.model import AbideMLP

    torch.manual_seed(0)
    x, y = torch.randn(24, 10), torch.arange(24) % 2
    data = SiteData(train=(x, y), val=(x[:4], y[:4]), test=(x[:4], y[:4]))

    def sent(seeded: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(1)
        trainer = SiteTrainer_("A", AbideMLP(10), data, FedAvg(), batch_size=8,
                               privacy=UpdatePrivacy(1.0, 1.0, seeded=seeded))
        weights, _, metrics = trainer.fit({}, {"round": 1})
        assert metrics["dp_epsilon_replace_one"] > metrics["dp_epsilon"] > 0
        assert metrics["dp_seeded"] == float(seeded)
        return weights

    from fedbn_med.training.trainer import SiteTrainer as SiteTrainer_

    first, again = sent(True), sent(True)
    assert all(torch.equal(first[k], again[k]) for k in first)
    private, other = sent(False), sent(False)
    assert not all(torch.equal(private[k], other[k]) for k in private)


def test_reference_rows_for_runs_made_elsewhere(comparison: Comparison,
                                                small_cohort: Path) -> None:
    """What --compare adds to Flower runs: the same reference cells, drawn the same way."""
    from fedbn_med.evaluation.references import add_reference_rows

    spec = RunSpec.for_task("abide", sites=SITES, data_dir=small_cohort)
    alone = Comparison(sites=SITES)
    add_reference_rows(alone, spec, [(1, 1)])
    assert [c.strategy for c in alone.cells] == list(REFERENCES)
    here = {c.strategy: c for c in comparison.cells if (c.fold, c.seed) == (1, 1)}
    for cell in alone.cells:
        assert cell.scores == here[cell.strategy].scores


@pytest.mark.parametrize("strategy", ["fedbn", "fedavg_localbn"])
def test_kept_predictions_carry_the_threshold_the_run_scored_with(small_cohort: Path,
                                                                  strategy: str) -> None:
    # threshold=site_prior (the default): each site predicts at its own threshold; the
    # kept predictions, classified at it, give the cell's own test accuracy at every site
    # (fedavg_localbn: with the site's own BN statistics, as it is scored)
    from fedbn_med.evaluation.cell_data import prepare_sites

    sites = load_sites(["UCLA", "USM"])
    spec = RunSpec.for_task("abide", data_dir=small_cohort, sites=("UCLA", "USM"),
                            strategy=strategy, rounds=3, threshold="site_prior")
    cell = run_cell(spec, "FedBN", prepare_sites(spec, sites), sites)
    cuts = set()
    for name, p in cell.predictions.items():
        cuts.add(p.threshold)
        accuracy = float(np.mean(p.predicted == (p.labels == 1)))
        assert accuracy == pytest.approx(cell.scores["best"]["accuracy"][name], abs=BOUNDED)
    assert cuts != {0.5}


def test_fixed_splits_window_the_cell_s_own_split(small_cohort: Path) -> None:
    # On fixed splits (interval_design's "fixed splits" design) a cell's seed is not the
    # seed its split was drawn with: its windows must be cut from the cell's split.
    from fedbn_med.evaluation.cell_data import prepare_sites, with_features
    from fedbn_med.evaluation.runner import run_comparison

    sites = load_sites(["UCLA", "USM"])
    drawn = RunSpec.for_task("abide", data_dir=small_cohort, sites=("UCLA", "USM"),
                             strategy="fedbn", windows=32, window_step=16, seed=0, rounds=2)
    prepared = prepare_sites(drawn.replace(windows=0), sites)
    other = with_features(drawn.replace(seed=1), prepared, sites)
    for name in sites:
        groups = other[name].data.test_groups
        assert groups is not None
        assert np.array_equal(np.unique(groups.numpy()), prepared[name].split.test)
    fixed = run_comparison({"FedBN": drawn}, [0], [1], split_seed=0)
    cell, = (c for c in fixed.cells if c.strategy == "FedBN")
    for name, p in cell.predictions.items():
        assert np.array_equal(p.index, prepared[name].split.test)
        assert np.isfinite(p.prob).all()


def test_a_method_that_transforms_features_gets_them_in_the_comparison(
        small_cohort: Path) -> None:
    # The comparison shares whole-series features between its methods; a baseline whose
    # strategy z-scores each site (fedavg_sitez) must still train on z-scored rows, fitted
    # on the training split, on the same split as the others.
    from fedbn_med.evaluation.cell_data import prepare_sites, with_features

    sites = load_sites(["UCLA", "USM"])
    plain = RunSpec.for_task("abide", data_dir=small_cohort, sites=("UCLA", "USM"),
                             strategy="fedavg", windows=0)
    prepared = prepare_sites(plain, sites)
    assert with_features(plain, prepared, sites) is prepared
    zspec = plain.replace(strategy="fedavg_sitez")
    z = with_features(zspec, prepared, sites)
    for name in sites:
        x = z[name].data.train[0].numpy()
        assert np.allclose(x.mean(0), 0.0, atol=1e-4)
        sd = x.std(0, ddof=1)
        assert np.allclose(sd[sd > 0], 1.0, atol=1e-3)
        assert np.array_equal(z[name].split.test, prepared[name].split.test)
        assert z[name].data.test[0].shape == prepared[name].data.test[0].shape
        assert not torch.equal(z[name].data.test[0], prepared[name].data.test[0])
    cell = run_cell(zspec.replace(rounds=2), "FedAvg, site z", prepared, sites)
    for name in sites:
        assert cell.predictions[name].index.size == prepared[name].split.test.size


def test_every_method_of_a_comparison_sees_the_same_subjects() -> None:
    """Methods on cohorts of other sizes or site effects would not share their cells."""
    from fedbn_med.evaluation.runner import run_comparison

    base = RunSpec.for_task("abide", sites=("USM", "UCLA"), rounds=1)
    for change in ({"cohort_scale": 2.0}, {"site_effect": 0.0}):
        other = base.replace(strategy="fedavg", **change)
        with pytest.raises(ValueError, match="must run on the same sites and data"):
            run_comparison({"FedBN": base, "FedAvg": other}, [0], [0])
    # on real data the folder decides (checked before any data is read)
    real = base.replace(data_dir=Path("/data/abide"))
    with pytest.raises(ValueError, match="must run on the same sites and data"):
        run_comparison({"a": real, "b": real.replace(data_dir=Path("/other"))}, [0], [0])


def test_a_scan_site_refuses_a_larger_cohort() -> None:
    from fedbn_med.tasks.abide.build import resolve_site_data_dir

    spec = RunSpec.for_task("abide", cohort_scale=2.0)
    with pytest.raises(ValueError, match="site 'CITY' brings its own scans"):
        resolve_site_data_dir(load_sites(["CITY"])["CITY"], spec)
