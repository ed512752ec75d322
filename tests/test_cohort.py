"""Tests of the built-in ABIDE-format cohort generator and of data-directory resolution."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedbn_med.paths import DATA_ENV_VAR, resolve_data_dir
from fedbn_med.tasks.abide.cohort import (
    COHORT_SEED_ENV_VAR,
    COHORT_VERSION,
    DEFAULT_SITE_IDS,
    HO_CENTROIDS_MM,
    HO_LABELS,
    MANIFEST_FILENAME,
    SITE_FIGURES,
    ZERO_ROI_INDEX,
    ZERO_ROI_LABEL,
    cohort_key,
    cohort_seed,
    ensure_cohort,
    generate_cohort,
)
from fedbn_med.tasks.abide.cohort.calibration import SiteSample, measure
from fedbn_med.tasks.abide.cohort.figures_v3 import CALIBRATION_SITES, REAL_FIGURES
from fedbn_med.tasks.abide.data import PHENOTYPIC_FILENAME, select_subjects
from tests.fresh import modules_after

TINY = {"sites": ("UCLA_1",), "seed": 3, "n_subjects_scale": 0.2}
REQUIRED = ["Unnamed: 0", "SUB_ID", "X", "subject", "SITE_ID", "FILE_ID", "DX_GROUP",
            "DSM_IV_TR", "AGE_AT_SCAN", "SEX", "func_mean_fd", "qc_rater_1",
            "qc_anat_rater_2", "qc_func_rater_2", "qc_anat_rater_3", "qc_func_rater_3"]
NUMBER = re.compile(r"-?\d+\.\d{6}")


def _pcp(root: Path) -> Path:
    return root / "ABIDE_pcp"


def _files(root: Path) -> dict[str, bytes]:
    base = _pcp(root)
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*"))
            if p.is_file()}


def test_atlas_table() -> None:
    assert len(HO_LABELS) == 111 and HO_CENTROIDS_MM.shape == (111, 3)
    assert HO_LABELS[0] == 10 and HO_LABELS[-1] == 4802
    assert HO_LABELS[ZERO_ROI_INDEX] == ZERO_ROI_LABEL == 3455 and ZERO_ROI_INDEX == 82


def test_site_figures_match_abide_md() -> None:
    nyu, um = SITE_FIGURES["NYU"], SITE_FIGURES["UM_1"]
    assert (nyu.n_subjects, nyu.n_asd, nyu.n_asd_qc + nyu.n_control_qc) == (175, 75, 172)
    assert (um.n_asd_qc, um.n_control_qc, um.n_volumes) == (34, 52, 300)
    assert (SITE_FIGURES["PITT"].tr_s, SITE_FIGURES["YALE"].n_volumes) == (1.5, 196)
    after_qc = {s: (SITE_FIGURES[s].n_asd_qc, SITE_FIGURES[s].n_control_qc) for s in SITE_FIGURES}
    assert after_qc["USM"] == (43, 24) and after_qc["UCLA_1"] == (37, 27)
    assert after_qc["UM_2"] == (13, 21) and after_qc["UCLA_2"] == (11, 10)
    assert set(DEFAULT_SITE_IDS) <= set(SITE_FIGURES)


def test_layout_matches_pcp(small_cohort: Path) -> None:
    csv = _pcp(small_cohort) / PHENOTYPIC_FILENAME
    header = csv.read_text(encoding="utf-8").splitlines()[0].split(",")
    assert header[0] == ""  # the unnamed pandas index column
    table = pd.read_csv(csv, index_col=0)
    assert set(REQUIRED) <= set(table.columns)
    assert set(table["SITE_ID"]) == set(DEFAULT_SITE_IDS)
    assert (table["Unnamed: 0"] == np.arange(1, len(table) + 1)).all()
    assert (table["subject"] == table["SUB_ID"]).all()
    assert (table["FILE_ID"] == "no_filename").any()
    with_file = table[table["FILE_ID"] != "no_filename"]
    assert with_file["FILE_ID"].str.fullmatch(r"(NYU|UM_1|USM|UCLA_1)_00\d{5}").all()
    assert set(table["DX_GROUP"]) == {1, 2} and set(table["SEX"]) <= {1, 2}
    assert set(table["qc_rater_1"]) <= {"OK", "fail", "maybe"}
    assert (table.loc[table["DX_GROUP"] == 2, "DSM_IV_TR"] == 0).all()

    series_dir = _pcp(small_cohort) / "cpac" / "filt_noglobal"
    files = sorted(series_dir.glob("*_rois_ho.1D"))
    assert len(files) == len(with_file)
    lines = files[0].read_text(encoding="utf-8").splitlines()
    assert lines[0].split("\t") == [f"#{label}" for label in HO_LABELS]
    values = lines[1].split("\t")
    assert len(values) == 111 and all(NUMBER.fullmatch(v) for v in values)
    data = np.loadtxt(files[0])
    assert data.shape[1] == 111 and data.shape[0] >= 100


def test_volumes_and_zero_roi_per_site(small_cohort: Path) -> None:
    series_dir = _pcp(small_cohort) / "cpac" / "filt_noglobal"
    for site_id in DEFAULT_SITE_IDS:
        files = sorted(series_dir.glob(f"{site_id}_00*_rois_ho.1D"))
        rows = [f.read_text(encoding="utf-8").splitlines()[1:] for f in files]
        n_volumes = SITE_FIGURES[site_id].n_volumes
        assert all(n_volumes - 5 < len(r) <= n_volumes for r in rows), site_id
        zero = [all(line.split("\t")[ZERO_ROI_INDEX] == "0.000000" for line in r) for r in rows]
        assert 1 <= sum(zero) < len(files) / 4, site_id


def test_small_cohort_selection(small_cohort: Path) -> None:
    table = pd.read_csv(_pcp(small_cohort) / PHENOTYPIC_FILENAME, index_col=0)
    selected = select_subjects(table, "NYU")
    figures = SITE_FIGURES["NYU"]
    assert len(selected) == round(figures.n_asd_qc * 0.5) + round(figures.n_control_qc * 0.5)
    with_file = table[(table["SITE_ID"] == "NYU") & (table["FILE_ID"] != "no_filename")]
    assert len(with_file) > len(selected)  # some subjects fail QC


def test_deterministic_for_a_seed(tmp_path: Path) -> None:
    first = generate_cohort(tmp_path / "a", **TINY)
    second = generate_cohort(tmp_path / "b", **TINY)
    other = generate_cohort(tmp_path / "c", **{**TINY, "seed": 4})
    assert _files(first) == _files(second)
    assert _files(first) != _files(other)


def test_generate_is_idempotent_and_guards_parameters(tmp_path: Path) -> None:
    root = generate_cohort(tmp_path, **TINY)
    csv = _pcp(root) / PHENOTYPIC_FILENAME
    before = csv.stat().st_mtime_ns
    assert generate_cohort(tmp_path, **TINY) == root
    assert csv.stat().st_mtime_ns == before
    assert (_pcp(root) / MANIFEST_FILENAME).is_file()
    with pytest.raises(ValueError, match="generated with other parameters"):
        generate_cohort(tmp_path, **{**TINY, "seed": 9})


def test_refuses_foreign_abide_folder(tmp_path: Path) -> None:
    (tmp_path / "ABIDE_pcp").mkdir()
    with pytest.raises(ValueError, match="is not a fedbn_med cohort"):
        generate_cohort(tmp_path, **TINY)


def test_ensure_cohort_keys_directories(tmp_path: Path) -> None:
    root = ensure_cohort(tmp_path, **TINY)
    assert root == tmp_path / "builtin" / cohort_key(**TINY)
    assert (_pcp(root) / PHENOTYPIC_FILENAME).is_file()
    assert ensure_cohort(tmp_path, **{**TINY, "site_effect": 0.0}) != root


def test_finding_the_cohort_on_disk_imports_no_signal_processing(tmp_path: Path) -> None:
    # a site or the main job only finds the cohort made earlier: scipy.signal (about a
    # second to import, for the generator's AR(1) filter) stays out of that process
    root = ensure_cohort(tmp_path, **TINY)
    code = ("from fedbn_med.tasks.abide.cohort import ensure_cohort\n"
            f"root = ensure_cohort({str(tmp_path)!r}, **{TINY!r})\n"
            f"assert str(root) == {str(root)!r}, root")
    assert modules_after(code, ["scipy.signal"]) == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sites": ("UCLA",)}, r"unknown: 'UCLA'\)\. Valid sites: NYU, UM_1"),
        ({"sites": ()}, "Expected one or more built-in sites"),
        ({"sites": ("NYU", "NYU")}, "Expected each site once"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"site_effect": -0.5}, "site_effect must be a finite number >= 0"),
        ({"n_subjects_scale": 0}, r"n_subjects_scale must lie in \(0, 5\]"),
        ({"version": "1"}, r"Unknown cohort version '1'\. Valid versions: 2, 3\."),
    ],
)
def test_invalid_parameters(tmp_path: Path, params: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_cohort(tmp_path, **params)  # type: ignore[arg-type]


def test_resolve_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir() == tmp_path / "env"
    monkeypatch.delenv(DATA_ENV_VAR)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_data_dir() == tmp_path / "home" / "fedbn_med_data"
    with pytest.raises(ValueError, match="Expected a data directory path, got an empty"):
        resolve_data_dir("")
    with pytest.raises(TypeError, match=r"Expected data_dir as str, pathlib\.Path or None"):
        resolve_data_dir(3)  # type: ignore[arg-type]


def test_v3_is_built_in_and_v2_stays_reproducible(tmp_path: Path) -> None:
    assert COHORT_VERSION == "3"
    assert cohort_key(**TINY).startswith("v3-seed3-")
    assert cohort_key(**TINY, version="2").startswith("v2-seed3-")
    # the v2 key (and so its directory and feature cache) is what it was before v3
    assert cohort_key(sites=DEFAULT_SITE_IDS, version="2") == "v2-seed0-effect1-scale1-979a1d71"
    v2 = generate_cohort(tmp_path / "v2", **TINY, version="2")
    v3 = generate_cohort(tmp_path / "v3", **TINY)
    assert _files(v2).keys() == _files(v3).keys()
    assert _files(v2) != _files(v3)


def test_cohort_seed_from_argument_environment_or_zero(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.delenv(COHORT_SEED_ENV_VAR, raising=False)
    assert cohort_seed() == 0
    monkeypatch.setenv(COHORT_SEED_ENV_VAR, "7")
    assert cohort_seed() == 7 and cohort_seed(2) == 2
    params = {k: v for k, v in TINY.items() if k != "seed"}
    assert ensure_cohort(tmp_path, **params).name == cohort_key(**{**params, "seed": 7})
    monkeypatch.setenv(COHORT_SEED_ENV_VAR, "x1")
    with pytest.raises(ValueError, match="FEDBN_MED_COHORT_SEED must be a non-negative"):
        cohort_seed()


def test_real_figures_are_summaries_of_the_shared_sites() -> None:
    assert len(CALIBRATION_SITES) == 14
    assert not {"NYU", "UM_1", "USM", "UCLA_1"} & set(CALIBRATION_SITES)
    assert all(isinstance(v, float) for v in REAL_FIGURES.values())
    assert 0.5 < REAL_FIGURES["pooled_auc"] < 0.7


def _sample(rng: np.random.Generator, name: str, n: int, shift: float, effect: float
            ) -> SiteSample:
    y = np.arange(n) % 2
    x = rng.normal(shift, 1.0, (n, 40)) + effect * y[:, None] * np.linspace(-1, 1, 40)
    return SiteSample(name, x, y, np.exp(rng.normal(-2.3, 0.5, n)), rng.uniform(8, 30, n),
                      (rng.random(n) < 0.2).astype(np.int64))


def test_measure_finds_site_location_and_diagnosis() -> None:
    rng = np.random.default_rng(0)
    flat = [_sample(rng, f"s{i}", 60, 0.0, 0.0) for i in range(4)]
    shifted = [_sample(rng, f"s{i}", 60, 0.8 * i, 1.0) for i in range(4)]
    quiet, loud = measure(flat)["summary"], measure(shifted)["summary"]
    assert quiet["location"] < 0.1 < 0.5 < loud["location"]
    assert quiet["pooled_auc"] < 0.65 < 0.8 < loud["pooled_auc"]
    assert loud["dx_consistent_sd"] > 0.3 > quiet["dx_consistent_sd"]
    with pytest.raises(ValueError, match="Expected at least two sites"):
        measure(flat[:1])
    with pytest.raises(ValueError, match="each class needs at least 3"):
        SiteSample("tiny", np.zeros((4, 3)), np.array([1, 0, 0, 0]), np.ones(4), np.ones(4),
                   np.zeros(4))
