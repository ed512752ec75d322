"""Bad scan files are refused before allocation; stand-in ROI series are marked (issue 22).

Item 14: a 72-byte ``.nii.gz`` declaring 256x256x256x40 and a valid 2 MB ``.nii.gz`` of
2**28 float64 zeros are run through the real readers (imaging ``read_image`` and the
``fmri_to_rois`` command) in a child process whose peak RSS is measured. Item 15: without
``--atlas`` the command refuses; with the stand-in, every output says so.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from fedbn_med.tasks.abide.scans import Cleaning, extract_site
from tests.scan_data import bold_path, make_derivatives, roi_series

ROOT = Path(__file__).resolve().parents[1]


def _header_member(shape: tuple[int, ...], dtype: type) -> bytes:
    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(dtype)
    header.set_data_offset(352)
    return gzip.compress(header.binaryblock + b"\0" * 4, mtime=0)


def _forged(path: Path) -> Path:
    """A header alone, declaring 256 x 256 x 256 x 40 float32 (10 GiB), in ~72 bytes."""
    path.write_bytes(_header_member((256, 256, 256, 40), np.float32))
    return path


def _zeros(path: Path) -> Path:
    """A valid .nii.gz of 2**28 float64 zeros (2 GiB of data) in about 2 MB.

    Concatenated gzip members form one valid gzip stream, so one compressed 16 MiB block
    of zeros repeated gives the data without compressing 2 GiB here.
    """
    block = gzip.compress(b"\0" * 2**24, mtime=0)
    with path.open("wb") as handle:
        handle.write(_header_member((64, 64, 64, 1024), np.float64))
        for _ in range(2**31 // 2**24):
            handle.write(block)
    return path


_CHILD = r"""
import json, sys
from fedbn_med.tasks.imaging.readers import ImageReadError, read_image
out = {"imaging": []}
for path in sys.argv[2:]:
    try:
        read_image(path)
        out["imaging"].append("read")
    except ImageReadError as err:
        out["imaging"].append(str(err))
from pipelines.fmri_to_rois import main
try:
    main(["--bids", sys.argv[1], "--out", sys.argv[1] + "-out", "--site", "BIG",
          "--no-clean", "--stand-in-atlas"])
    out["cli"] = "ran"
except SystemExit as exc:
    out["cli"] = str(exc)
# VmHWM is this address space's peak RSS; ru_maxrss would carry the forking pytest
# process's size over exec.
with open("/proc/self/status") as status:
    hwm = next(ln for ln in status if ln.startswith("VmHWM:"))
out["peak_mib"] = int(hwm.split()[1]) / 1024
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def bad_scans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Run both bad files through the readers in one child; return what it reported."""
    root = tmp_path_factory.mktemp("big")
    bids = make_derivatives(root / "bids", [roi_series(np.random.default_rng(0), 30)] * 2)
    forged, zeros = bold_path(bids, "01"), bold_path(bids, "02")
    _forged(forged)
    _zeros(zeros)
    assert forged.stat().st_size < 100 and zeros.stat().st_size < 3 * 2**20
    done = subprocess.run([sys.executable, "-c", _CHILD, str(bids), str(forged), str(zeros)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    return {"forged": forged, "zeros": zeros, "stderr": done.stderr,
            **json.loads(line.removeprefix("RESULT "))}


def test_bad_scans_are_refused_before_allocation_with_one_line_each(
        bad_scans: dict[str, object]) -> None:
    forged, zeros = bad_scans["forged"], bad_scans["zeros"]
    imaging = bad_scans["imaging"]
    assert imaging[0].startswith(f"{forged}: NIfTI too large: the header declares shape "
                                 "(256, 256, 256, 40) (671,088,640 voxels)")
    assert imaging[1].startswith(f"{zeros}: NIfTI too large: the header declares shape "
                                 "(64, 64, 64, 1024) of 8-byte values")
    cli = str(bad_scans["cli"])
    assert cli.startswith("fmri_to_rois: 2 of 2 scans of site BIG are unusable"), cli
    skipped = [ln for ln in str(bad_scans["stderr"]).splitlines() if ln.startswith("Skipping")]
    assert len(skipped) == 2, bad_scans["stderr"]
    assert skipped[0].startswith(f"Skipping {forged}: NIfTI too large")
    assert skipped[1].startswith(f"Skipping {zeros}: NIfTI too large") and "MiB" in skipped[1]
    assert "Traceback" not in str(bad_scans["stderr"])
    # The 10 GiB and 2 GiB declared were never allocated: the child stays near its
    # import footprint (torch, MONAI, nilearn).
    assert bad_scans["peak_mib"] < 1200, bad_scans["peak_mib"]


def test_real_scans_without_an_atlas_are_refused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.fmri_to_rois import main

    with pytest.raises(SystemExit):
        main(["--bids", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "no --atlas: ROI series of real scans need the Harvard-Oxford image" in \
        capsys.readouterr().err


def test_stand_in_series_are_marked_everywhere(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    bids = make_derivatives(tmp_path / "bids", [roi_series(rng, 20) for _ in range(2)])
    report = extract_site(bids, tmp_path / "out", site="TRIAL", cleaning=Cleaning.off())
    manifest = json.loads((report.data_dir / "ABIDE_pcp/fedbn_med_scans.json").read_text())
    assert manifest["atlas_stand_in"] is True
    table = pd.read_csv(report.data_dir / "ABIDE_pcp/Phenotypic_V1_0b_preprocessed1.csv")
    assert table["rois_atlas"].eq("stand-in").all()
    assert "# STAND-IN ATLAS" in report.site_file.read_text()


def test_a_site_naming_real_scans_is_refused_without_the_atlas(tmp_path: Path) -> None:
    from fedbn_med.tasks.abide.scans.site import site_rois_dir
    from fedbn_med.tasks.abide.sites import load_site

    (tmp_path / "scans").mkdir()
    (tmp_path / "HOSP.toml").write_text('name = "HOSP"\nabide_site_ids = ["HOSP"]\n'
                                        'scans = "scans"\n')
    site = load_site("HOSP", directory=tmp_path)
    with pytest.raises(ValueError, match=r"Site 'HOSP' names scans at .*scans, but ROI series "
                                         "of real scans need the Harvard-Oxford atlas"):
        site_rois_dir(site)
