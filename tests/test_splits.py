"""Tests of the per-site stratified train/validation/test splits."""

from __future__ import annotations

import numpy as np
import pytest

from fedbn_med.tasks.abide.splits import Split, nested_split, site_splits, stratified_folds
from tests.fresh import modules_after

LABELS = np.array([1] * 37 + [0] * 27)  # UCLA_1 after QC: 37 ASD, 27 controls


def _parts(split: Split) -> list[np.ndarray]:
    return [split.train, split.val, split.test]


@pytest.mark.parametrize("fold", range(5))
def test_disjoint_and_covering(fold: int) -> None:
    split = site_splits(LABELS, fold=fold, seed=1)
    everything = np.concatenate(_parts(split))
    assert len(everything) == len(LABELS) == len(np.unique(everything))
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in _parts(split))
    assert len(split.test) in (12, 13) and len(split.val) == round(0.15 * len(LABELS))


def test_stratified() -> None:
    split = site_splits(LABELS, seed=2)
    share = LABELS.mean()
    for part in _parts(split):
        assert abs(LABELS[part].mean() - share) < 0.1


def test_test_folds_partition_the_site() -> None:
    tests = np.concatenate([site_splits(LABELS, fold=k, seed=3).test for k in range(5)])
    assert np.array_equal(np.sort(tests), np.arange(len(LABELS)))


def test_seeded() -> None:
    first, again, other = (site_splits(LABELS, seed=s) for s in (4, 4, 5))
    assert all(np.array_equal(a, b) for a, b in zip(_parts(first), _parts(again), strict=True))
    assert not np.array_equal(first.test, other.test)


def test_no_validation_set() -> None:
    split = site_splits(LABELS, val_fraction=0.0)
    assert split.val.size == 0 and split.train.size + split.test.size == len(LABELS)


def test_splits_are_read_only() -> None:
    with pytest.raises(ValueError, match="read-only"):
        site_splits(LABELS).train[0] = 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fold": 5}, r"fold must be an integer in \[0, 4\] for n_folds=5, got 5"),
        ({"fold": -1}, r"fold must be an integer in \[0, 4\]"),
        ({"n_folds": 1}, "n_folds must be an integer >= 2, got 1"),
        ({"val_fraction": 0.8}, r"val_fraction must lie in \[0, 0.8\) for n_folds=5"),
        ({"val_fraction": -0.1}, r"val_fraction must lie in \[0, 0.8\)"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        site_splits(LABELS, **kwargs)  # type: ignore[arg-type]


def test_too_few_subjects_per_class() -> None:
    with pytest.raises(ValueError, match=r"Each class needs at least n_folds=5 subjects for a "
                       r"stratified split; got class 1 has 3\."):
        site_splits([0] * 10 + [1] * 3)


def test_labels_must_be_1d() -> None:
    with pytest.raises(ValueError, match=r"Expected a non-empty 1-D array of labels, got shape"):
        site_splits(np.zeros((4, 2)))


@pytest.mark.parametrize("fold", range(5))
def test_nested_split_never_touches_the_outer_test_fold(fold: int) -> None:
    outer = site_splits(LABELS, fold=fold, seed=3)
    part = np.union1d(outer.train, outer.val)
    tests = []
    for inner_fold in range(4):
        inner = nested_split(LABELS, fold=fold, inner_folds=4, inner_fold=inner_fold, seed=3)
        everything = np.concatenate(_parts(inner))
        assert np.intersect1d(everything, outer.test).size == 0
        assert np.array_equal(np.sort(everything), part)  # the outer training part, once
        assert not np.intersect1d(inner.train, inner.test).size
        assert not np.intersect1d(inner.val, inner.test).size
        assert 0 < LABELS[inner.test].mean() < 1  # stratified: both classes
        tests.append(inner.test)
    # the inner test folds partition the outer training part
    assert np.array_equal(np.sort(np.concatenate(tests)), part)


def test_nested_split_is_seeded_and_names_a_too_small_class() -> None:
    a = nested_split(LABELS, fold=1, inner_fold=2, seed=5)
    b = nested_split(LABELS, fold=1, inner_fold=2, seed=5)
    c = nested_split(LABELS, fold=1, inner_fold=2, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(_parts(a), _parts(b)))
    assert not np.array_equal(a.test, c.test)
    with pytest.raises(ValueError, match="class 0 has 4"):
        nested_split(np.array([1] * 20 + [0] * 5), inner_folds=5)


@pytest.mark.parametrize("n_folds", [2, 3, 5, 10])
def test_our_folds_are_scikit_learns_shuffled_stratified_folds(n_folds):
    from sklearn.model_selection import StratifiedKFold

    rng = np.random.default_rng(n_folds)
    for trial in range(60):
        n = int(rng.integers(3 * n_folds, 120))
        classes = [np.array([0, 1]), np.array([1, 0]), np.array([2, 0, 7])][trial % 3]
        y = np.concatenate([classes, rng.choice(classes, n - len(classes))])  # each class in
        if np.unique(y, return_counts=True)[1].min() < n_folds:
            continue
        seed = int(rng.integers(0, 2**31 - 1))
        ours = stratified_folds(y, n_folds, seed)
        theirs = StratifiedKFold(n_folds, shuffle=True, random_state=seed).split(y * 0, y)
        for k, (rest, test) in enumerate(theirs):
            np.testing.assert_array_equal(np.flatnonzero(ours == k), test)
            np.testing.assert_array_equal(np.flatnonzero(ours != k), rest)


def test_a_split_imports_no_scikit_learn():
    code = ("from fedbn_med.tasks.abide.splits import site_splits\n"
            "site_splits([0, 1] * 20, fold=2, seed=3)")
    assert modules_after(code, ["sklearn"]) == []
