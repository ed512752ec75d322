"""Seeded, stratified train/validation/test splits of one site's subjects.

Each site splits its own subjects (the federation never pools them): the test set is
one fold of a shuffled stratified k-fold (:func:`stratified_folds`, the folds of
scikit-learn's shuffled ``StratifiedKFold`` without importing it), and the
validation set is a stratified share of the remaining subjects, so validation is
carved from the training part only and the test folds stay a partition of the site.

A repetition of a cross-validation re-draws every site's split: the seed of a site's
split is :func:`repetition_split_seed` of the site file's ``split_seed`` and the run's
seed. Repetition 0 (run seed 0) keeps the site file's split as it is.

A choice of protocol (which round a run reports) is judged with :func:`nested_split`:
an inner split of one outer fold's training part, whose inner test set is drawn from
subjects the outer split trains on, so the outer test fold is never read.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Split", "nested_split", "repetition_split_seed", "site_splits", "stratified_folds"]


@dataclass(frozen=True, eq=False)
class Split:
    """Index arrays of one site's train, validation and test subjects (disjoint, sorted)."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    def __post_init__(self) -> None:
        """Make the index arrays read-only."""
        for part in (self.train, self.val, self.test):
            part.setflags(write=False)


def repetition_split_seed(split_seed: int, seed: int) -> int:
    """Return the seed of a site's split in the repetition of run seed ``seed``.

    Parameters
    ----------
    split_seed : int
        The site file's ``split_seed`` (>= 0).
    seed : int
        The run's seed: one per repetition of the cross-validation.

    Returns
    -------
    int
        ``split_seed`` itself for ``seed == 0`` (the site file's split); otherwise a
        31-bit seed derived from both, so that every repetition shuffles every site anew.

    Raises
    ------
    ValueError
        If either seed is not an integer or ``split_seed`` is negative.
    """
    for name, value in (("split_seed", split_seed), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {value!r}.")
    if split_seed < 0:
        raise ValueError(f"split_seed must be a non-negative integer, got {split_seed!r}.")
    if seed == 0:
        return int(split_seed)
    return zlib.crc32(f"split:{int(split_seed)}:{int(seed)}".encode()) & 0x7FFFFFFF


def _proportional_counts(class_sizes: np.ndarray, total: int) -> np.ndarray:
    """Share ``total`` over classes in proportion to their sizes (largest remainder)."""
    exact = class_sizes * total / class_sizes.sum()
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return np.minimum(counts, class_sizes)


def stratified_folds(labels: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """Return the test fold of each subject in a shuffled, stratified k-fold.

    The classes, numbered in the order they first appear, are sorted and dealt out over
    the folds in turn, which says how many subjects of each class each fold gets; then
    each class's fold numbers are shuffled by one ``numpy.random.RandomState(seed)``, class
    after class. This is the assignment of scikit-learn's ``StratifiedKFold(n_folds,
    shuffle=True, random_state=seed)`` (a test compares the two): the splits stay those
    of every published table, and a site's process no longer imports scikit-learn for
    them (``sklearn.model_selection`` takes about a second of CPU to import).

    Parameters
    ----------
    labels : numpy.ndarray
        Class label per subject (1-D).
    n_folds : int
        Number of folds; every class should have at least this many subjects
        (:func:`site_splits` checks it).
    seed : int
        Seed of the shuffles, in ``[0, 2**32)``.

    Returns
    -------
    numpy.ndarray
        The fold, in ``[0, n_folds)``, whose test set holds each subject (``int64``).
    """
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    code = np.argsort(np.argsort(first))[inverse.reshape(-1)]  # class by first appearance
    dealt = np.sort(code)
    per_fold = np.stack([np.bincount(dealt[k::n_folds], minlength=len(first))
                         for k in range(n_folds)])
    rng = np.random.RandomState(seed)
    fold_of = np.empty(len(code), dtype=np.int64)
    for c in range(len(first)):
        numbers = np.repeat(np.arange(n_folds), per_fold[:, c])
        rng.shuffle(numbers)
        fold_of[code == c] = numbers
    return fold_of


def site_splits(
    labels: Sequence[int] | np.ndarray,
    *,
    n_folds: int = 5,
    fold: int = 0,
    val_fraction: float = 0.15,
    seed: int = 0,
) -> Split:
    """Split one site's subjects into stratified train, validation and test indices.

    Parameters
    ----------
    labels : sequence of int or numpy.ndarray
        Class label per subject (1-D).
    n_folds : int, default=5
        Number of cross-validation folds; the test set is one of them.
    fold : int, default=0
        Which fold is the test set, in ``[0, n_folds)``.
    val_fraction : float, default=0.15
        Share of all the site's subjects held out for validation, taken from the subjects
        outside the test fold, stratified by label; 0 gives an empty validation set.
    seed : int, default=0
        Seed of the shuffles (one seed per repeated run).

    Returns
    -------
    Split
        Disjoint sorted index arrays that together cover every subject.

    Raises
    ------
    ValueError
        If ``labels`` is not 1-D, ``n_folds`` < 2, ``fold`` is out of range,
        ``val_fraction`` leaves no training subjects, or a class has fewer subjects
        than ``n_folds``.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"Expected a non-empty 1-D array of labels, got shape {y.shape}.")
    if isinstance(n_folds, bool) or not isinstance(n_folds, (int, np.integer)) or n_folds < 2:
        raise ValueError(f"n_folds must be an integer >= 2, got {n_folds!r}.")
    if isinstance(fold, bool) or not isinstance(fold, (int, np.integer)) or not 0 <= fold < n_folds:
        raise ValueError(f"fold must be an integer in [0, {n_folds - 1}] for n_folds={n_folds}, "
                         f"got {fold!r}.")
    max_val = 1.0 - 1.0 / n_folds
    if not 0.0 <= val_fraction < max_val:
        raise ValueError(f"val_fraction must lie in [0, {max_val:g}) for n_folds={n_folds} "
                         f"(the rest must keep training subjects), got {val_fraction!r}.")
    classes, class_sizes = np.unique(y, return_counts=True)
    if class_sizes.min() < n_folds:
        small = ", ".join(f"class {c.item()!r} has {n}"
                          for c, n in zip(classes, class_sizes, strict=True) if n < n_folds)
        raise ValueError(f"Each class needs at least n_folds={n_folds} subjects for a "
                         f"stratified split; got {small}.")
    fold_of = stratified_folds(y, n_folds, seed)
    rest, test = np.flatnonzero(fold_of != fold), np.flatnonzero(fold_of == fold)
    rng = np.random.default_rng([seed, fold])
    rest_sizes = np.array([(y[rest] == c).sum() for c in classes])
    n_val = min(round(val_fraction * len(y)), len(rest) - len(classes))
    val_counts = _proportional_counts(rest_sizes, max(n_val, 0))
    val = np.concatenate([
        rng.permutation(rest[y[rest] == c])[:k] for c, k in zip(classes, val_counts, strict=True)
    ]).astype(np.int64)
    train = np.setdiff1d(rest, val)
    return Split(train=np.sort(train).astype(np.int64), val=np.sort(val),
                 test=np.sort(test).astype(np.int64))


def nested_split(
    labels: Sequence[int] | np.ndarray,
    *,
    n_folds: int = 5,
    fold: int = 0,
    inner_folds: int = 4,
    inner_fold: int = 0,
    val_fraction: float = 0.15,
    seed: int = 0,
) -> Split:
    """Split the training part of one outer fold again: inner train, validation and test.

    The outer split is :func:`site_splits` of ``(n_folds, fold, seed)``; its training and
    validation subjects (never its test fold) are split by :func:`site_splits` once more,
    into ``inner_folds`` folds. The inner test set stands in for a test set when a rule of
    the protocol is chosen, so that nothing is chosen on an outer test split.

    Parameters
    ----------
    labels : sequence of int or numpy.ndarray
        Class label per subject of the whole site (1-D).
    n_folds, fold, val_fraction, seed
        The outer split, as in :func:`site_splits`.
    inner_folds : int, default=4
        Folds of the inner split of the outer training part.
    inner_fold : int, default=0
        Which inner fold is the inner test set.

    Returns
    -------
    Split
        Indices into ``labels`` (the whole site): inner train, validation and test, all
        disjoint from the outer test fold.

    Raises
    ------
    ValueError
        As :func:`site_splits`, for the outer or the inner split (a class of the outer
        training part with fewer than ``inner_folds`` subjects, for example).
    """
    y = np.asarray(labels)
    outer = site_splits(y, n_folds=n_folds, fold=fold, val_fraction=val_fraction, seed=seed)
    part = np.sort(np.concatenate([outer.train, outer.val]))
    inner_seed = zlib.crc32(f"inner:{int(seed)}:{int(fold)}".encode()) & 0x7FFFFFFF
    inner = site_splits(y[part], n_folds=inner_folds, fold=inner_fold,
                        val_fraction=val_fraction, seed=inner_seed)
    return Split(train=part[inner.train], val=part[inner.val], test=part[inner.test])
