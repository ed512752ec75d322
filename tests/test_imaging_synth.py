"""Built-in imaging sites: offline, deterministic, feature shift with shared label meaning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from scipy import stats

from fedbn_med.tasks.imaging import synth
from fedbn_med.tasks.imaging.datalist import decode_items, load_datalist
from fedbn_med.tasks.imaging.site_files import load_imaging_site

SIZE, SUBJECTS = 16, 6


@pytest.fixture(scope="module")
def mri_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mri")
    for site in synth.MRI_SCANNERS:
        synth.ensure_mri_site(site, size=SIZE, subjects=SUBJECTS, data_dir=root)
    return root


def _site_items(root: Path, site: str) -> list[dict]:
    path = synth.ensure_mri_site(site, size=SIZE, subjects=SUBJECTS, data_dir=root)
    splits = load_datalist(path)
    return decode_items([i for v in splits.values() for i in v], ["image", "label"], site)


def test_mri_sites_differ_in_intensity_not_in_label_meaning(mri_root: Path) -> None:
    gm_means: dict[str, list[float]] = {}
    fractions: dict[str, np.ndarray] = {}
    for site in synth.MRI_SCANNERS:
        items = _site_items(mri_root, site)
        assert len(items) == SUBJECTS
        gm_means[site], props = [], []
        for it in items:
            img, lab = it["image"][0], it["label"][0].astype(int)
            lo, hi = np.percentile(img, (0.5, 99.5))  # the pipeline's own normalisation
            norm = np.clip((img - lo) / (hi - lo), 0, 1)
            gm_means[site].append(float(norm[lab == 2].mean()))
            props.append(np.bincount(lab.ravel(), minlength=4) / lab.size)
        fractions[site] = np.mean(props, axis=0)
    sites = list(synth.MRI_SCANNERS)
    for i, a in enumerate(sites):
        for b in sites[i + 1:]:
            assert stats.ttest_ind(gm_means[a], gm_means[b]).pvalue < 0.01, (a, b, gm_means)
            np.testing.assert_allclose(fractions[a], fractions[b], atol=0.05)


def test_mri_storage_formats_and_determinism(mri_root: Path, tmp_path: Path) -> None:
    site_c = synth.ensure_mri_site("SiteC", size=SIZE, subjects=SUBJECTS,
                                   data_dir=mri_root).parent
    series = sorted(p for p in site_c.iterdir() if p.is_dir())
    assert len(series) == SUBJECTS
    first = pydicom.dcmread(next(series[0].iterdir()))
    assert first.file_meta.MediaStorageSOPClassUID == "1.2.840.10008.5.1.4.1.1.4"
    again = synth.ensure_mri_site("SiteA", size=SIZE, subjects=SUBJECTS, data_dir=tmp_path)
    orig = synth.ensure_mri_site("SiteA", size=SIZE, subjects=SUBJECTS,
                                 data_dir=mri_root).parent
    assert again.read_bytes() == (orig / "datalist.json").read_bytes()
    name = "SiteA-000_t1.nii.gz"
    assert np.array_equal(_read(again.parent / name), _read(orig / name))


def _read(path: Path) -> np.ndarray:
    import nibabel as nib

    return np.asarray(nib.load(str(path)).get_fdata())


def test_xray_sites_write_dicom_png_nifti_with_balanced_labels(tmp_path: Path) -> None:
    for site, suffix in (("HospitalA", ".dcm"), ("HospitalB", ".png"),
                         ("HospitalC", ".nii.gz")):
        path = synth.ensure_xray_site(site, size=32, subjects=SUBJECTS, data_dir=tmp_path)
        splits = load_datalist(path)
        items = [i for v in splits.values() for i in v]
        assert all(str(i["image"]).endswith(suffix) for i in items)
        assert sorted(i["label"] for i in items) == [0, 0, 0, 1, 1, 1]
        assert len(decode_items(items, ["image"], site)) == SUBJECTS
        if suffix == ".dcm":
            ds = pydicom.dcmread(items[0]["image"])
            assert ds.file_meta.MediaStorageSOPClassUID == ds.SOPClassUID


def test_unknown_builtin_site_lists_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unknown built-in MRI site 'SiteZ'. Valid sites: "
                                         "SiteA, SiteB, SiteC"):
        synth.ensure_mri_site("SiteZ", data_dir=tmp_path)
    with pytest.raises(ValueError, match="image size must be a multiple of 8"):
        synth.ensure_xray_site("HospitalA", size=30, data_dir=tmp_path)


def test_site_config_errors() -> None:
    assert load_imaging_site("mri", "SiteC").datalist is None
    with pytest.raises(ValueError, match="Unknown xray site 'HospitalZ'. Valid sites: "
                                         "HospitalA, HospitalB, HospitalC"):
        load_imaging_site("xray", "HospitalZ")
