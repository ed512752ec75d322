"""Tests of the ABIDE loader: selection, file checks, nilearn reading, features, cache."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from fedbn_med.tasks.abide.cohort import HO_LABELS, ZERO_ROI_INDEX, generate_cohort
from fedbn_med.tasks.abide.cohort.diagnostics import dx_pattern, site_lines
from fedbn_med.tasks.abide.data import (
    MIN_VOLUMES,
    PHENOTYPIC_FILENAME,
    DataFileError,
    SiteFeatures,
    check_abide_files,
    edge_index,
    load_abide,
    load_site_features,
    loader,
    read_phenotypic,
    read_roi_time_series,
    roi_file_path,
    select_subjects,
)
from tests.conftest import SMALL_COHORT_SEED

REFERENCE = Path("/work/shared/reference/abide_pcp")
SERIES = Path("ABIDE_pcp") / "cpac" / "filt_noglobal"
N_FEATURES = 111 * 110 // 2


@pytest.fixture
def ucla_dir(small_cohort: Path, tmp_path: Path) -> Path:
    """Return a private copy of the small cohort's table and its UCLA_1 files."""
    root = tmp_path / "data"
    (root / SERIES).mkdir(parents=True)
    shutil.copy2(small_cohort / "ABIDE_pcp" / PHENOTYPIC_FILENAME,
                 root / "ABIDE_pcp" / PHENOTYPIC_FILENAME)
    for path in (small_cohort / SERIES).glob("UCLA_1_*"):
        shutil.copy2(path, root / SERIES / path.name)
    return root


def _selected_paths(root: Path, site: str = "UCLA_1") -> list[Path]:
    return [Path(p) for p in check_abide_files(root, site)["path"]]


def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _edit_table(root: Path, edit: object) -> None:
    csv = root / "ABIDE_pcp" / PHENOTYPIC_FILENAME
    table = pd.read_csv(csv, index_col=0)
    table = edit(table)  # type: ignore[operator]
    table.to_csv(csv)


# ---------------------------------------------------------------- selection, files


def test_check_abide_files_selects_like_nilearn(small_cohort: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from nilearn.datasets import fetch_abide_pcp

    _no_network(monkeypatch)
    selected = check_abide_files(small_cohort, ["UCLA_1", "USM"])
    bunch = fetch_abide_pcp(data_dir=str(small_cohort), band_pass_filtering=True,
                            derivatives=["rois_ho"], SITE_ID=["UCLA_1", "USM"], verbose=0)
    assert list(bunch.phenotypic["FILE_ID"]) == list(selected["FILE_ID"])
    assert all(ts.shape[1] == 111 for ts in bunch.rois_ho)
    assert all(Path(p).is_file() for p in selected["path"])
    assert set(selected["qc_rater_1"]) == {"OK"}


def test_unknown_site(small_cohort: Path) -> None:
    with pytest.raises(ValueError, match=r"Unknown SITE_ID 'NYUU'\. Valid SITE_IDs in the "
                       r"phenotypic table: NYU, UCLA_1, UM_1, USM\."):
        check_abide_files(small_cohort, ["NYUU"])


def test_missing_phenotypic_table(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"ABIDE phenotypic table not found: .*"
                       r"Phenotypic_V1_0b_preprocessed1\.csv"):
        check_abide_files(tmp_path, "NYU")


@pytest.mark.parametrize(("content", "what"), [
    (b"", "is empty"),
    (b"\n\n", "is empty"),
    (b"\xff\xfe\x00garbage\x80\x81", r"is not a readable CSV file \(.*\)"),
])
def test_unreadable_phenotypic_table_names_file_and_format(tmp_path: Path, content: bytes,
                                                           what: str) -> None:
    csv = tmp_path / "ABIDE_pcp" / PHENOTYPIC_FILENAME
    csv.parent.mkdir()
    csv.write_bytes(content)
    with pytest.raises(ValueError, match=rf"The phenotypic table {re.escape(str(csv))} {what}\. "
                       r"Expected the PCP phenotypic CSV: a header line with at least SUB_ID, "
                       r"SITE_ID, FILE_ID, DX_GROUP \(and an unnamed index column first\), "
                       r"then one row per subject\."):
        read_phenotypic(tmp_path)


def test_missing_roi_file(ucla_dir: Path) -> None:
    path = _selected_paths(ucla_dir)[3]
    path.unlink()
    with pytest.raises(FileNotFoundError, match=rf"1 of \d+ ROI time-series file\(s\) selected "
                       rf"for SITE_ID UCLA_1 are missing .*\n  .*{path.name}"):
        load_site_features(ucla_dir, "UCLA_1")


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ("DX_GROUP", r"lacks required column\(s\): DX_GROUP\. Expected at least: SUB_ID"),
        ("qc_func_rater_3", r"lacks required column\(s\): qc_func_rater_3.*quality_checked=False"),
    ],
)
def test_table_missing_required_column(ucla_dir: Path, column: str, message: str) -> None:
    _edit_table(ucla_dir, lambda t: t.drop(columns=[column]))
    with pytest.raises(ValueError, match=message):
        check_abide_files(ucla_dir, "UCLA_1")


def test_site_without_qc_passing_subjects(ucla_dir: Path) -> None:
    def fail_ucla(table: pd.DataFrame) -> pd.DataFrame:
        table.loc[table["SITE_ID"] == "UCLA_1", "qc_rater_1"] = "fail"
        return table

    _edit_table(ucla_dir, fail_ucla)
    with pytest.raises(ValueError, match="Site UCLA has no usable subjects: no row of SITE_ID "
                       "UCLA_1 has a file and passes quality control"):
        load_site_features(ucla_dir, "UCLA_1", name="UCLA")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"zero_roi": "nan"}, r"Unknown zero_roi 'nan'\. Valid values: zero, impute, drop_subject"),
        ({"pipeline": "fsl"}, r"Unknown pipeline 'fsl'\. Valid values: ccs, cpac, dparsf, niak"),
        ({"derivative": "alff"}, r"Unknown derivative 'alff'\. Valid values: rois_aal"),
        ({"max_bad_fraction": 1.5}, r"max_bad_fraction must lie in \[0, 1\], got 1\.5"),
    ],
)
def test_invalid_options(small_cohort: Path, option: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_site_features(small_cohort, "UCLA_1", **option)  # type: ignore[arg-type]


def test_institution_sites_must_be_disjoint(small_cohort: Path) -> None:
    with pytest.raises(ValueError, match="SITE_ID 'NYU' is assigned to both 'A' and 'B'"):
        load_abide(small_cohort, {"A": ("NYU",), "B": ("NYU", "USM")})


# --------------------------------------------------------------- malformed .1D


def _corrupt(path: Path, kind: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], [r.split("\t") for r in lines[1:]]
    if kind == "empty":
        path.write_text("", encoding="utf-8")
        return
    if kind == "no_rows":
        rows = []
    elif kind == "columns":
        header, rows = "\t".join(header.split("\t")[:-1]), [r[:-1] for r in rows]
    elif kind == "ragged":
        rows[4] = rows[4][:-1]
    elif kind == "text":
        rows[2][5] = "abc"
    elif kind == "nan":
        rows[2][0] = "nan"
    path.write_text("\n".join([header, *("\t".join(r) for r in rows)]) + "\n", encoding="utf-8")


MALFORMED = [
    ("empty", r"the file is empty \(0 bytes\)"),
    ("no_rows", "no data rows after the header"),
    ("columns", r"rows have 110 values; expected 111 \(one per ROI\)"),
    ("ragged", "rows have unequal numbers of values"),
    # where, never what: the file may be a link to anything (issue 44)
    ("text", r"text where numbers belong \(row \d+, column \d+\)\.$"),
    ("nan", r"1 NaN/Inf value\(s\) \(first at volume 3, ROI column 0\)"),
]


@pytest.mark.parametrize(("kind", "message"), MALFORMED)
def test_read_roi_time_series_rejects(ucla_dir: Path, kind: str, message: str) -> None:
    path = _selected_paths(ucla_dir)[0]
    _corrupt(path, kind)
    with pytest.raises(DataFileError, match=message) as info:
        read_roi_time_series(path, n_rois=111)
    assert str(info.value).startswith(str(path)) and info.value.path == path


@pytest.mark.parametrize(("kind", "message"), MALFORMED)
def test_bad_file_skipped_with_one_warning(ucla_dir: Path, kind: str, message: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    paths = _selected_paths(ucla_dir)
    _corrupt(paths[1], kind)
    with caplog.at_level(logging.WARNING, logger="fedbn_med.tasks.abide.data"):
        site = load_site_features(ucla_dir, "UCLA_1", use_cache=False)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith(f"Skipping {paths[1]}: ")
    if kind == "columns":  # the header is checked against the atlas before rows are read
        message = r"the header names 110 ROIs; expected the 111 of the Harvard-Oxford atlas"
    assert re.search(message, warned[0])
    assert site.n_subjects == len(paths) - 1
    assert paths[1].name.split("_rois")[0] not in site.file_ids


def test_header_with_other_rois_skipped(ucla_dir: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    paths = _selected_paths(ucla_dir)
    lines = paths[2].read_text(encoding="utf-8").splitlines()
    labels = lines[0].split("\t")
    lines[0] = "\t".join([labels[1], labels[0], *labels[2:]])
    paths[2].write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="fedbn_med.tasks.abide.data"):
        site = load_site_features(ucla_dir, "UCLA_1", use_cache=False)
    assert site.n_subjects == len(paths) - 1
    assert f"Skipping {paths[2]}: its header names other ROIs (or another order) than " \
           f"the Harvard-Oxford atlas (rois_ho): column 0 is '{HO_LABELS[1]}', expected " \
           f"'{HO_LABELS[0]}'." in caplog.text


@pytest.mark.parametrize("header", [True, False])
def test_first_file_with_a_million_columns_spoils_no_other(
        ucla_dir: Path, header: bool, caplog: pytest.LogCaptureFixture) -> None:
    paths = _selected_paths(ucla_dir)
    n_columns = 10**6
    head = "\t".join(f"#{k}" for k in range(n_columns)) + "\n" if header else ""
    paths[0].write_text(head + ("\t".join(["1.5"] * n_columns) + "\n") * MIN_VOLUMES,
                        encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="fedbn_med.tasks.abide.data"):
        site = load_site_features(ucla_dir, "UCLA_1", use_cache=False)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith(f"Skipping {paths[0]}: "), warned
    reason = (r"the header line is longer than 1,048,576 characters; expected one "
              r"'#<label>' per ROI column" if header
              else r"rows have 1000000 values; expected 111 \(one per ROI\)")
    assert re.search(reason, warned[0])
    assert site.n_subjects == len(paths) - 1
    assert site.roi_labels == tuple(str(label) for label in HO_LABELS)


def test_too_many_bad_files(ucla_dir: Path) -> None:
    paths = _selected_paths(ucla_dir)
    for path in paths[:3]:
        _corrupt(path, "nan")
    with pytest.raises(ValueError, match=rf"3 of {len(paths)} ROI files of site UCLA_1 are "
                       r"unusable \(\d+%\), more than max_bad_fraction=0\.05"):
        load_site_features(ucla_dir, "UCLA_1", max_bad_fraction=0.05)


def test_site_with_no_usable_subjects(ucla_dir: Path) -> None:
    for path in _selected_paths(ucla_dir):
        _corrupt(path, "text")
    with pytest.raises(ValueError, match=r"Site UCLA_1 has no usable subjects: all \d+ ROI "
                       "files are unusable"):
        load_site_features(ucla_dir, "UCLA_1", max_bad_fraction=1.0)


# ------------------------------------------------------------------ features, cache


def test_load_abide_features(small_cohort: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_network(monkeypatch)
    data = load_abide(small_cohort)
    assert list(data) == ["NYU", "UM", "USM", "UCLA"]
    rows, cols = edge_index(111)
    zero_edges = (rows == ZERO_ROI_INDEX) | (cols == ZERO_ROI_INDEX)
    for name, site in data.items():
        assert isinstance(site, SiteFeatures) and site.site == name
        assert site.features.shape == (site.n_subjects, N_FEATURES)
        assert site.features.dtype == np.float32 and site.labels.dtype == np.int64
        assert np.isfinite(site.features).all()
        assert set(np.unique(site.labels)) == {0, 1}
        assert len(site.subject_ids) == len(site.file_ids) == len(site.mean_fd)
        assert site.roi_labels == tuple(str(label) for label in HO_LABELS)
        zeroed = (site.features[:, zero_edges] == 0).all(axis=1)
        assert zeroed.any(), name  # all-zero ROI subjects are present and kept
    assert data["UM"].abide_site_ids[0] == "UM_1"


def test_features_are_fisher_z_of_pearson(ucla_dir: Path) -> None:
    site = load_site_features(ucla_dir, "UCLA_1", use_cache=False)
    path = _selected_paths(ucla_dir)[0]
    data, _ = read_roi_time_series(path)
    rows, cols = edge_index(111)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.arctanh(np.corrcoef(data.T)[rows, cols])
    ok = np.isfinite(expected)
    np.testing.assert_allclose(site.features[0][ok], expected[ok], atol=1e-5)


@pytest.mark.parametrize("policy", ["impute", "drop_subject"])
def test_zero_roi_policies(ucla_dir: Path, policy: str, caplog: pytest.LogCaptureFixture) -> None:
    zero = load_site_features(ucla_dir, "UCLA_1")
    with caplog.at_level(logging.INFO, logger="fedbn_med.tasks.abide.data"):
        other = load_site_features(ucla_dir, "UCLA_1", zero_roi=policy)  # type: ignore[arg-type]
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert re.search(rf"UCLA_1: \d+ of {zero.n_subjects} subjects have a constant \(all-zero\) "
                     rf"ROI \(labels: 3455\); zero_roi='{policy}'", logged)
    rows, cols = edge_index(111)
    edges = (rows == ZERO_ROI_INDEX) | (cols == ZERO_ROI_INDEX)
    affected = (zero.features[:, edges] == 0).all(axis=1)
    assert affected.any() and np.isfinite(other.features).all()
    if policy == "drop_subject":
        assert other.n_subjects == zero.n_subjects - affected.sum()
    else:
        mean = zero.features[~affected][:, edges].mean(axis=0)
        np.testing.assert_allclose(other.features[affected][0][edges], mean, atol=1e-5)


def test_cache_skips_recomputation(ucla_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    compute = loader._compute_site_features

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return compute(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "_compute_site_features", counting)
    first = load_site_features(ucla_dir, "UCLA_1", name="UCLA")
    second = load_site_features(ucla_dir, "UCLA_1", name="UCLA")
    assert len(calls) == 1
    assert list((ucla_dir / "cache").glob("abide_UCLA_*.npz"))
    np.testing.assert_array_equal(first.features, second.features)
    assert first.file_ids == second.file_ids and first.roi_labels == second.roi_labels
    load_site_features(ucla_dir, "UCLA_1", name="UCLA", zero_roi="impute")
    assert len(calls) == 2  # another policy is another cache entry
    path = _selected_paths(ucla_dir)[0]
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    load_site_features(ucla_dir, "UCLA_1", name="UCLA")
    assert len(calls) == 3  # a changed input file invalidates the entry
    for cached in (ucla_dir / "cache").glob("abide_UCLA_*.npz"):
        cached.write_bytes(b"not a zip file")
    again = load_site_features(ucla_dir, "UCLA_1", name="UCLA")
    assert len(calls) == 4  # an unreadable cache is recomputed, not trusted
    np.testing.assert_array_equal(again.features, first.features)


def _site_accuracy(data: dict[str, SiteFeatures]) -> float:
    x = np.concatenate([s.features for s in data.values()])
    y = np.concatenate([[i] * s.n_subjects for i, s in enumerate(data.values())])
    model = make_pipeline(StandardScaler(), PCA(20, svd_solver="randomized", random_state=0),
                          LogisticRegression(max_iter=2000))
    with threadpool_limits(1, "blas"):  # threaded BLAS is many times slower on small data
        pred = cross_val_predict(model, x, y, cv=StratifiedKFold(5, shuffle=True, random_state=0))
    return float(balanced_accuracy_score(y, pred))


def test_sites_separable_and_diagnosis_present_but_hard(small_cohort: Path) -> None:
    data = load_abide(small_cohort)
    assert _site_accuracy(data) > 0.8  # chance: 0.25
    # What a classifier could do knowing the true pattern: well above chance, far from
    # perfect (cohort v1 scored 0.97 to 1.0 here). In cohort v3, as in the real sites,
    # each subject's global connectivity carries a third to a half of an edge's variance
    # and swamps the dense diagnosis effect, so the oracle first regresses it out within
    # the site (the raw projection scores 0.44 to 0.80 on this cohort).
    aucs = {}
    for name, site in data.items():
        pattern = dx_pattern(SMALL_COHORT_SEED, site.roi_labels)
        features = site.features - site.features.mean(0)
        level = features.mean(1, keepdims=True)
        slope = (features * level).sum(0) / float((level ** 2).sum())
        aucs[name] = roc_auc_score(site.labels, (features - level * slope) @ pattern)
    assert all(0.7 < auc < 0.995 for auc in aucs.values()), aucs
    assert np.mean(list(aucs.values())) < 0.96, aucs


def _site_gains(data: dict[str, SiteFeatures]) -> np.ndarray:
    """Return each site's slope of its mean features against the pooled mean."""
    lines = site_lines({name: s.features for name, s in data.items()})
    return np.array([gain for gain, _ in lines.values()])


def test_sites_differ_by_a_gain_on_connectivity(small_cohort: Path) -> None:
    # Each site's correlations are scaled by its own factor, so the site means are scaled
    # copies of the pooled mean. Cohort v3 takes the factor's spread from the shared real
    # sites (global scale sd 0.11, benchmarks/research/cohort_calibrate.py), v2 had +-20 %.
    gains = _site_gains(load_abide(small_cohort))
    assert gains.max() - gains.min() >= 0.1 * gains.mean(), gains
    assert gains.max() >= 1.04 * gains.mean() and gains.min() <= 0.96 * gains.mean(), gains


def test_no_site_effect_means_sites_look_alike(tmp_path: Path) -> None:
    root = generate_cohort(tmp_path, site_effect=0.0, n_subjects_scale=0.3)
    data = load_abide(root)
    assert _site_accuracy(data) < 0.45
    # No scanner gain; what is left comes from the sites' head motion, which differs
    # (published medians) and raises global connectivity (r = 0.46 on the real sites).
    gains = _site_gains(data)
    assert np.all(np.abs(gains / gains.mean() - 1.0) < 0.08), gains


# ------------------------------------------------------- the real phenotypic table


@pytest.fixture
def real_table_dir(tmp_path: Path) -> Path:
    """Return a data directory holding a copy of the real PCP phenotypic table only."""
    source = REFERENCE / PHENOTYPIC_FILENAME
    if not source.is_file():
        pytest.skip("the real ABIDE reference table is not available")
    (tmp_path / "ABIDE_pcp").mkdir()
    shutil.copy(source, tmp_path / "ABIDE_pcp" / PHENOTYPIC_FILENAME)
    return tmp_path


def test_real_table_selection_counts(real_table_dir: Path) -> None:
    table = read_phenotypic(real_table_dir)
    assert table.shape == (1112, 105)
    expected = {"NYU": (74, 98), "UM_1": (34, 52), "UM_2": (13, 21), "USM": (43, 24),
                "UCLA_1": (37, 27), "UCLA_2": (11, 10)}
    for site, (n_asd, n_control) in expected.items():
        selected = select_subjects(table, site)
        assert ((selected["DX_GROUP"] == 1).sum(), (selected["DX_GROUP"] == 2).sum()) == (
            n_asd, n_control), site
    assert len(select_subjects(table, "NYU", quality_checked=False)) == 175


def test_real_table_missing_files_reported(real_table_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"172 of 172 ROI time-series file\(s\) selected "
                       r"for SITE_ID NYU are missing \(cpac/filt_noglobal/\*_rois_ho\.1D\):\n"
                       r"  .*NYU_0050952_rois_ho\.1D\n(  .*\n){9}  \.\.\. and 162 more"):
        check_abide_files(real_table_dir, "NYU")
    with pytest.raises(ValueError, match=r"Unknown SITE_ID 'UCLA'\. Valid SITE_IDs in the "
                       r"phenotypic table: CALTECH, CMU, KKI"):
        check_abide_files(real_table_dir, "UCLA")


def test_real_table_read_through_nilearn(real_table_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _no_network(monkeypatch)
    rng = np.random.default_rng(0)
    selected = select_subjects(read_phenotypic(real_table_dir), "UCLA_2")
    paths = [roi_file_path(real_table_dir, f) for f in selected["FILE_ID"]]
    assert len(paths) == 21
    header = "\t".join(f"#{label}" for label in HO_LABELS)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = rng.standard_normal((120, 111))
        path.write_text(header + "\n" + "\n".join("\t".join(f"{v:.6f}" for v in r)
                                                  for r in rows) + "\n", encoding="utf-8")
    site = load_site_features(real_table_dir, "UCLA_2")
    assert site.n_subjects == 21 and int(site.labels.sum()) == 11
    assert site.file_ids[0] == "UCLA_2_0051291"


def test_an_unwritable_cache_folder_costs_only_the_cache(ucla_dir: Path, caplog) -> None:
    (ucla_dir / "cache").write_text("not a folder")  # where the feature cache would go
    with caplog.at_level("WARNING"):
        site = load_site_features(ucla_dir, "UCLA_1")
    assert "Not caching" in caplog.text and str(ucla_dir / "cache") in caplog.text
    fresh = load_site_features(ucla_dir, "UCLA_1", use_cache=False)
    np.testing.assert_array_equal(site.features, fresh.features)
    assert (ucla_dir / "cache").read_text() == "not a folder"  # nothing of the user's lost


def test_features_are_nilearns_correlations_to_the_bit() -> None:
    # connectivity_features computes nilearn's ConnectivityMeasure(kind="correlation") with
    # an empirical covariance itself (a tenth of the time per window): the same bits, a
    # constant ROI (NaN) included; non-finite or non-2-D input is refused
    from nilearn.connectome import ConnectivityMeasure
    from sklearn.covariance import EmpiricalCovariance

    from fedbn_med.tasks.abide.data.features import connectivity_features, edge_index

    rng = np.random.default_rng(7)
    series = [np.round(rng.standard_normal((n, 12)) * 40 + 500, 6) for n in (32, 90, 177)]
    series[1][:, 3] = 0.0
    measure = ConnectivityMeasure(kind="correlation", standardize="zscore_sample",
                                  cov_estimator=EmpiricalCovariance(store_precision=False))
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = measure.fit_transform(series)
    rows, cols = edge_index(12)
    z, constant = connectivity_features(series)
    reference = np.arctanh(np.clip(expected[:, rows, cols], -1 + 1e-7, 1 - 1e-7))
    reference[constant[:, rows] | constant[:, cols]] = np.nan
    assert np.array_equal(z, reference, equal_nan=True)
    assert constant.sum() == 1 and np.isnan(z[1]).sum() == 11 and not np.isnan(z[0]).any()
    series[2][5, 2] = np.nan
    with pytest.raises(ValueError, match="Subject 2's series holds NaN or Inf"):
        connectivity_features(series)
    with pytest.raises(ValueError, match=r"one \(n_volumes, n_rois\) array per subject"):
        connectivity_features([np.zeros(12)])


def test_a_file_the_site_read_just_now_is_taken_once_not_parsed_again(ucla_dir: Path) -> None:
    # the window features read the files the site's features read a moment before: each
    # is handed over once, as checked; a file changed since is parsed (and checked) anew
    from fedbn_med.tasks.abide.data import roi_files

    load_site_features(ucla_dir, ("UCLA_1",), name="UCLA", use_cache=False)
    paths = sorted(Path(key[0]) for key in roi_files._JUST_READ)
    assert len(paths) > 2 and all(p.is_relative_to(ucla_dir.resolve()) for p in paths)
    first, labels = roi_files.read_roi_time_series(paths[0])
    assert len(roi_files._JUST_READ) == len(paths) - 1
    again, again_labels = roi_files.read_roi_time_series(paths[0])  # parsed: no longer kept
    assert again is not first and np.array_equal(first, again) and labels == again_labels
    with paths[1].open("a", encoding="utf-8") as handle:
        handle.write("1 2\n")  # changed after the site's read: a bad row, found
    with pytest.raises(DataFileError, match="rows have unequal numbers of values"):
        roi_files.read_roi_time_series(paths[1])
    roi_files._JUST_READ.clear()
