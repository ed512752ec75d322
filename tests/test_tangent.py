"""Tangent-space connectivity: a site's own training subjects set the reference, and the
features follow the correlation features' edge order and shape."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from sklearn.covariance import LedoitWolf

from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.transforms import TangentConnectivity


def _subjects(n: int, seed: int, n_rois: int = 6, volumes: int = 80) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(n_rois, n_rois))
    return [rng.normal(size=(volumes, n_rois)) @ (mix + np.eye(n_rois) * (1 + i % 3))
            for i in range(n)]


def _shrunk(series: np.ndarray) -> np.ndarray:
    z = (series - series.mean(0)) / series.std(0, ddof=1)
    return LedoitWolf(store_precision=False).fit(z).covariance_


def test_tangent_vectors_are_the_whitened_log_map_in_edge_order():
    train, other = _subjects(5, 0), _subjects(3, 1)
    transform = TangentConnectivity().fit(train)
    out = transform(other)
    assert out.shape == (3, 15) and out.dtype == np.float32
    # by hand, with scipy's matrix functions: the log-Euclidean mean of the training
    # covariances, then each covariance whitened by it and log-mapped
    reference = scipy.linalg.expm(np.mean([scipy.linalg.logm(_shrunk(s)).real for s in train],
                                          axis=0))
    np.testing.assert_allclose(transform.reference, reference, rtol=1e-8, atol=1e-10)
    whiten = scipy.linalg.inv(scipy.linalg.sqrtm(reference).real)
    rows, cols = np.triu_indices(6, k=1)
    for i, series in enumerate(other):
        mapped = scipy.linalg.logm(whiten @ _shrunk(series) @ whiten).real
        np.testing.assert_allclose(out[i], mapped[rows, cols], atol=2e-6)
    # one training subject is its own reference: it sits at the origin
    alone = TangentConnectivity().fit(train[:1])
    np.testing.assert_allclose(alone(train[:1]), 0.0, atol=1e-6)
    assert np.abs(alone(train[1:2])).max() > 0.01


def test_the_reference_comes_from_the_fitted_subjects_only():
    train = _subjects(5, 0)
    shifted = [s * np.linspace(1, 3, 6) for s in _subjects(5, 2)]
    test = _subjects(2, 3)
    a = TangentConnectivity().fit(train)(test)
    b = TangentConnectivity().fit(shifted)(test)
    assert not np.allclose(a, b, atol=1e-3)  # a different site's mean, other features
    # same fit, same numbers: nothing random
    np.testing.assert_array_equal(a, TangentConnectivity().fit(train)(test))


def test_a_constant_roi_gives_finite_features():
    train = _subjects(4, 0)
    train[1] = train[1].copy()
    train[1][:, 2] = 0.0  # in a training subject too: the reference stays positive definite
    test = _subjects(1, 5)[0].copy()
    test[:, 2] = 0.0
    transform = TangentConnectivity().fit(train)
    assert np.linalg.eigvalsh(transform.reference).min() > 0
    assert np.isfinite(transform([test])).all()
    np.testing.assert_allclose(np.diag(TangentConnectivity.covariance(test))[2], 0.0,
                               atol=0.2)  # shrinkage only: the ROI carries no signal


def test_tangent_errors_say_what_is_wrong():
    with pytest.raises(RuntimeError, match=r"must be fitted \(fit\) before it is used"):
        TangentConnectivity()(_subjects(1, 0))
    with pytest.raises(RuntimeError, match=r"must be fitted \(fit\) before it is used"):
        _ = TangentConnectivity().reference
    with pytest.raises(ValueError, match=r"needs at least one subject's series"):
        TangentConnectivity().fit([])
    fitted = TangentConnectivity().fit(_subjects(3, 0))
    with pytest.raises(ValueError, match=r"fitted on 6 ROIs, got series of 4"):
        fitted(_subjects(1, 0, n_rois=4))
    with pytest.raises(ValueError, match=r"expects \(n_volumes >= 2, n_rois\) series"):
        fitted([np.zeros(6)])
    with pytest.raises(ValueError, match=r"connectivity must be one of correlation, tangent, "
                                         r"got 'partial'"):
        RunSpec.for_task("abide", connectivity="partial")
    with pytest.raises(ValueError, match=r"does not combine with connectivity='tangent'"):
        RunSpec.for_task("abide", connectivity="tangent", windows=32)


def test_a_site_fits_its_reference_on_its_training_split_only(small_cohort):
    from fedbn_med.tasks.abide.build import _load_split, prepare_site_data, site_rows
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.tasks.abide.transforms import _site_series

    site = load_sites(["UCLA"])["UCLA"]
    spec = RunSpec.for_task("abide", sites=("UCLA",), data_dir=small_cohort,
                            connectivity="tangent", windows=0)
    data = prepare_site_data(site, spec)
    plain = prepare_site_data(site, spec.replace(connectivity="correlation"))
    assert data.train[0].shape == plain.train[0].shape  # same subjects, same width
    assert data.test[0].shape == plain.test[0].shape
    assert not np.allclose(data.train[0].numpy(), plain.train[0].numpy())
    # by hand: the reference fitted on the training subjects alone gives the same rows
    data_dir, feats, split = _load_split(site, spec)
    series = _site_series(str(data_dir), feats.site, tuple(sorted(set(
        feats.abide_site_ids))), feats.file_ids)
    expected = TangentConnectivity().fit([series[i] for i in split.train])(
        [series[i] for i in split.test])
    np.testing.assert_array_equal(data.test[0].numpy(), expected)
    # another fold: other training subjects, another reference, other test rows
    other = site_rows(site, spec.replace(fold=1))
    assert other["test"][0].shape[1] == expected.shape[1]
    assert not np.array_equal(other["train"][0][:3], data.train[0].numpy()[:3])


def test_a_given_split_is_what_the_feature_chain_fits_on(small_cohort):
    """A nested split (the nested defaults sweep): the reference from its training part."""
    from fedbn_med.tasks.abide.build import _load_split, prepare_site_data
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.tasks.abide.splits import nested_split, repetition_split_seed
    from fedbn_med.tasks.abide.transforms import _site_series

    site = load_sites(["UCLA"])["UCLA"]
    spec = RunSpec.for_task("abide", sites=("UCLA",), data_dir=small_cohort,
                            connectivity="tangent", windows=0)
    data_dir, feats, outer = _load_split(site, spec)
    inner = nested_split(feats.labels, fold=spec.fold, inner_folds=2, inner_fold=1,
                         seed=repetition_split_seed(site.split_seed, spec.seed))
    assert not set(inner.train) & set(outer.test) and not set(inner.test) & set(outer.test)
    data = prepare_site_data(site, spec, inner)
    series = _site_series(str(data_dir), feats.site, tuple(sorted(set(
        feats.abide_site_ids))), feats.file_ids)
    expected = TangentConnectivity().fit([series[i] for i in inner.train])(
        [series[i] for i in inner.test])
    np.testing.assert_array_equal(data.test[0].numpy(), expected)
    assert data.train[0].shape[0] == len(inner.train)
    plain = prepare_site_data(site, spec.replace(connectivity="correlation"), inner)
    np.testing.assert_array_equal(plain.test[0].numpy(),
                                  np.asarray(feats.features, dtype=np.float32)[inner.test])
    with pytest.raises(ValueError, match="ComBat fits on every site's training rows"):
        prepare_site_data(site, spec.replace(connectivity="correlation",
                                             harmonize="combat"), inner)
