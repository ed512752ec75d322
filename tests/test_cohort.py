"""Tests of the built-in ABIDE-format cohort generator and of data-directory resolution."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedbn_med.paths import DATA_ENV_VAR, resolve_data_dir
from fedbn_med.tasks.abide.cohort import (
    DEFAULT_SITE_IDS,
    HO_CENTROIDS_MM,
    HO_LABELS,
    MANIFEST_FILENAME,
    SITE_FIGURES,
    ZERO_ROI_INDEX,
    ZERO_ROI_LABEL,
    cohort_key,
    ensure_cohort,
    generate_cohort,
)
from fedbn_med.tasks.abide.data import PHENOTYPIC_FILENAME, select_subjects

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


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sites": ("UCLA",)}, r"unknown: 'UCLA'\)\. Valid sites: NYU, UM_1"),
        ({"sites": ()}, "Expected one or more built-in sites"),
        ({"sites": ("NYU", "NYU")}, "Expected each site once"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"site_effect": -0.5}, "site_effect must be a finite number >= 0"),
        ({"n_subjects_scale": 0}, r"n_subjects_scale must lie in \(0, 5\]"),
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
