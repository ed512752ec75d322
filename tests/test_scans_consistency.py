"""Known ROI series painted into the atlas come back from the scan pipeline unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from fedbn_med.tasks.abide.data import load_site_features, read_roi_time_series
from fedbn_med.tasks.abide.scans import Cleaning, extract_site, write_site
from tests.scan_data import make_derivatives, roi_series

N_SUBJECTS, N_VOLUMES = 4, 60


@pytest.fixture(scope="module")
def painted(tmp_path_factory):
    """Return truth series, and the .1D folder and scan folder made from them."""
    root = tmp_path_factory.mktemp("consistency")
    rng = np.random.default_rng(0)
    truth = [roi_series(rng, N_VOLUMES) for _ in range(N_SUBJECTS)]
    bids = make_derivatives(root / "bids", truth)
    rows = [{"SUB_ID": i + 1, "FILE_ID": f"PAINT_{i + 1:02d}", "DX_GROUP": 2 - i % 2}
            for i in range(N_SUBJECTS)]
    write_site(root / "direct", "PAINT", rows, truth, skipped=[], cleaning=Cleaning.off(),
               source=root, atlas="shipped", layout="test")
    return truth, root / "direct", bids, root


def test_painted_series_come_back_per_roi(painted):
    truth, _, bids, root = painted
    report = extract_site(bids, root / "scans", site="PAINT", cleaning=Cleaning.off())
    assert report.skipped == [] and len(report.written) == N_SUBJECTS
    for i, ts in enumerate(truth):
        got, labels = read_roi_time_series(
            report.data_dir / "ABIDE_pcp/cpac/filt_noglobal" / f"PAINT_{i + 1:02d}_rois_ho.1D",
            n_rois=111)
        assert got.shape == ts.shape and len(labels) == 111
        r = [np.corrcoef(got[:, j], ts[:, j])[0, 1] for j in range(111)]
        assert min(r) >= 0.99, f"subject {i}: lowest ROI correlation {min(r):.4f}"


def test_same_6105_features_as_the_1d_path(painted):
    _, direct, bids, root = painted
    report = extract_site(bids, root / "scans2", site="PAINT", cleaning=Cleaning.off())
    a = load_site_features(direct, "PAINT", use_cache=False)
    b = load_site_features(report.data_dir, "PAINT", use_cache=False)
    assert a.features.shape == b.features.shape == (N_SUBJECTS, 6105)
    assert a.file_ids == b.file_ids and np.array_equal(a.labels, b.labels)
    np.testing.assert_allclose(b.features, a.features, atol=1e-3)


def test_voxel_noise_still_gives_correlated_rois(tmp_path):
    rng = np.random.default_rng(3)
    truth = [roi_series(rng, N_VOLUMES)]
    bids = make_derivatives(tmp_path / "bids", truth, noise=1.0)
    report = extract_site(bids, tmp_path / "out", site="NOISY", cleaning=Cleaning.off())
    got, _ = read_roi_time_series(
        report.data_dir / "ABIDE_pcp/cpac/filt_noglobal/NOISY_01_rois_ho.1D")
    r = np.array([np.corrcoef(got[:, j], truth[0][:, j])[0, 1] for j in range(111)])
    assert r.min() >= 0.99, f"lowest ROI correlation {r.min():.4f}"
