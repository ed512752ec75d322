"""The scan pipeline: bad input named and skipped, the 20 % threshold, layouts, the CLI."""

from __future__ import annotations

import json
import re
import shutil

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from fedbn_med.tasks.abide.data import load_site_features
from fedbn_med.tasks.abide.scans import Cleaning, extract_site, find_scans, min_volumes
from fedbn_med.tasks.abide.scans.builtin import ensure_scan_site, generate_scan_site
from fedbn_med.tasks.abide.sites import load_site
from tests.scan_data import bold_path, make_derivatives, paint, roi_series

N_SUBJECTS, N_VOLUMES, TR = 6, 60, 2.0


@pytest.fixture(scope="module")
def clean_site(tmp_path_factory):
    """Return a derivatives folder of six good subjects (copy it before changing it)."""
    rng = np.random.default_rng(0)
    return make_derivatives(tmp_path_factory.mktemp("scans") / "bids",
                            [roi_series(rng, N_VOLUMES) for _ in range(N_SUBJECTS)], tr=TR)


def _image(bids):
    return nib.load(str(bold_path(bids, "02")))


def _save(bids, data, affine=None):
    path = bold_path(bids, "02")
    nib.save(nib.Nifti1Image(data, _image(bids).affine if affine is None else affine),
             str(path))


def _three_d(bids):
    _save(bids, np.asarray(_image(bids).dataobj)[..., 0])
    return bold_path(bids, "02"), r"a 3D image of shape \(33, 39, 32\); expected a 4D BOLD"


def _few_volumes(bids):
    _save(bids, np.asarray(_image(bids).dataobj)[..., :30])
    return bold_path(bids, "02"), r"only 30 volumes; at least 50 are needed .* TR 2 s"


def _far_grid(bids):
    affine = _image(bids).affine.copy()
    affine[:3, 3] += 300.0
    _save(bids, np.asarray(_image(bids).dataobj), affine)
    return bold_path(bids, "02"), r"its grid covers 0% of the atlas's labelled voxels"


def _singular_affine(bids):
    image = nib.Nifti1Image(np.asarray(_image(bids).dataobj), None)
    image.set_sform(np.diag([6.0, 6.0, 0.0, 1.0]), code=2)  # a qform could not hold it
    nib.save(image, str(bold_path(bids, "02")))
    return bold_path(bids, "02"), r"its affine is singular or not finite|its grid covers [0-9]%"


def _nan_voxels(bids):
    data = np.asarray(_image(bids).dataobj).copy()
    data[10:12, 20, 15, :] = np.nan
    _save(bids, data)
    return bold_path(bids, "02"), r"\d+ NaN/Inf voxel value\(s\)"


def _missing_participant(bids):
    table = pd.read_csv(bids / "participants.tsv", sep="\t")
    table[table.participant_id != "sub-02"].to_csv(bids / "participants.tsv", sep="\t",
                                                   index=False)
    return bold_path(bids, "02"), r"sub-02 is not in .*participants.tsv"


def _no_tr(bids):
    sidecar = bold_path(bids, "02").with_name(
        bold_path(bids, "02").name.replace(".nii.gz", ".json"))
    sidecar.unlink()
    image = _image(bids)
    image.header.set_zooms((*image.header.get_zooms()[:3], 0.0))
    nib.save(nib.Nifti1Image(np.asarray(image.dataobj), image.affine, image.header),
             str(bold_path(bids, "02")))
    return bold_path(bids, "02"), r"no TR anywhere: no RepetitionTime .* no --tr was given"


def _short_confounds(bids):
    path = bids / "sub-02/func/sub-02_task-rest_desc-confounds_timeseries.tsv"
    pd.read_csv(path, sep="\t").iloc[:20].to_csv(path, sep="\t", index=False, na_rep="n/a")
    return path, r"has 20 rows; the image has 60 volumes"


def _not_mni(bids):
    path = bold_path(bids, "02")
    path.rename(path.with_name(path.name.replace("space-MNI152NLin2009cAsym", "space-T1w")))
    return path.with_name(path.name.replace("space-MNI152NLin2009cAsym", "space-T1w")), \
        r"not in MNI space"


BAD_INPUTS = [_three_d, _few_volumes, _far_grid, _singular_affine, _nan_voxels,
              _missing_participant, _no_tr, _short_confounds, _not_mni]


@pytest.mark.parametrize("corrupt", BAD_INPUTS, ids=[f.__name__[1:] for f in BAD_INPUTS])
def test_bad_input_is_named_and_the_site_goes_on(clean_site, tmp_path, corrupt, caplog):
    bids = shutil.copytree(clean_site, tmp_path / "bids")
    bad_file, reason = corrupt(bids)
    report = extract_site(bids, tmp_path / "out", site="HOSP")
    assert len(report.written) == N_SUBJECTS - 1 and "HOSP_02" not in report.written
    [(path, message)] = report.skipped
    assert path == str(bad_file) and re.search(reason, message), message
    assert f"Skipping {bad_file}" in caplog.text
    features = load_site_features(report.data_dir, "HOSP", use_cache=False)
    assert features.n_subjects == N_SUBJECTS - 1 and features.n_features == 6105


def test_more_than_a_fifth_bad_refuses_the_site(clean_site, tmp_path):
    bids = shutil.copytree(clean_site, tmp_path / "bids")
    for label in ("02", "04"):
        bold_path(bids, label).write_bytes(b"not a nifti")
    with pytest.raises(ValueError, match=r"2 of 6 scans of site HOSP are unusable \(33%\), "
                                         r"more than max_bad_fraction=0.2"):
        extract_site(bids, tmp_path / "out", site="HOSP")


def test_volume_bound_follows_cleaning():
    assert min_volumes(Cleaning.off(), 2.0, 0) == 10
    assert min_volumes(Cleaning(band_pass=None, detrend=False), 2.0, 8) == 18
    assert min_volumes(Cleaning(), 2.0, 8) == 50
    assert min_volumes(Cleaning(), 3.0, 8) == 34


def test_cleaning_changes_series_and_writes_the_site_file(clean_site, tmp_path):
    report = extract_site(clean_site, tmp_path / "out", site="HOSP")
    manifest = json.loads((report.data_dir / "ABIDE_pcp/fedbn_med_scans.json").read_text())
    assert manifest["cleaning"]["band_pass"] == [0.01, 0.1]
    assert manifest["global_signal_regression"] is False
    site = load_site("HOSP", directory=report.site_file.parent)
    assert site.data_dir == report.data_dir and site.abide_site_ids == ("HOSP",)
    table = pd.read_csv(report.data_dir / "ABIDE_pcp/Phenotypic_V1_0b_preprocessed1.csv",
                        index_col=0)
    assert list(table.DX_GROUP) == [2, 1, 2, 1, 2, 1] and table.SITE_ID.eq("HOSP").all()
    assert table.func_mean_fd.between(0.05, 0.2).all()


def test_abide_func_preproc_layout_through_the_cli(tmp_path, capsys):
    from pipelines.fmri_to_rois import main

    rng = np.random.default_rng(5)
    folder = tmp_path / "abide"
    folder.mkdir()
    rows = []
    for i in range(4):
        image = paint(roi_series(rng, 40))
        image.header.set_zooms((6.0, 6.0, 6.0, 2.0))
        nib.save(image, str(folder / f"OLIN_00{i + 51461}_func_preproc.nii.gz"))
        rows.append({"SUB_ID": 51461 + i, "FILE_ID": f"OLIN_00{i + 51461}",
                     "DX_GROUP": 1 + i % 2, "SITE_ID": "OLIN"})
    pd.DataFrame(rows).to_csv(folder / "Phenotypic_V1_0b_preprocessed1.csv")
    assert find_scans(folder, "OLIN")[0] == "abide"
    main(["--bids", str(folder), "--out", str(tmp_path / "out"), "--site", "OLIN",
          "--no-clean", "--stand-in-atlas"])
    assert "OLIN: 4 of 4 subjects written" in capsys.readouterr().out
    features = load_site_features(tmp_path / "out", "OLIN", use_cache=False)
    assert features.subject_ids == (51461, 51462, 51463, 51464)


def test_builtin_scan_site_is_generated_once_and_extracted(tmp_path, monkeypatch):
    bids = generate_scan_site(tmp_path / "bids", n_subjects=4, n_volumes=60)
    assert len(find_scans(bids, "CITY")[1]) == 4
    with pytest.raises(ValueError, match="holds something else"):
        generate_scan_site(tmp_path / "bids", n_subjects=6, n_volumes=60)
    monkeypatch.setattr("fedbn_med.tasks.abide.scans.builtin.generate_scan_site",
                        lambda out, **kw: generate_scan_site(out, n_subjects=4, n_volumes=60,
                                                             **kw))
    rois = ensure_scan_site("CITY", tmp_path / "data")
    features = load_site_features(rois, "CITY", use_cache=False)
    assert features.n_subjects == 4 and np.isfinite(features.features).all()
    assert ensure_scan_site("CITY", tmp_path / "data") == rois  # no second extraction
