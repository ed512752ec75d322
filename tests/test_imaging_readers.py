"""Readers: NIfTI, DICOM (file and series), datalists, and bad input skipped with one log line."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pydicom.config
import pytest

from fedbn_med.tasks.imaging import dicom_io
from fedbn_med.tasks.imaging.datalist import decode_items, load_datalist
from fedbn_med.tasks.imaging.readers import (
    ImageReadError,
    read_dicom_file,
    read_dicom_series,
    read_image,
    read_nifti,
)


def _nifti(path: Path, shape: tuple[int, ...] = (8, 8, 8)) -> Path:
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    nib.save(nib.Nifti1Image(data, np.eye(4)), str(path))
    return path


def _series(folder: Path, n: int = 6, spacing: float = 2.0) -> np.ndarray:
    volume = np.random.default_rng(0).uniform(0, 1000, (8, 10, n)).astype(np.float32)
    dicom_io.write_series(folder, volume, spacing=(1.0, 1.0, spacing), patient_id="P-1",
                          uid_seed="test")
    return volume


def test_decoded_items_carry_arrays_with_a_channel(site: Path) -> None:
    items = [{"image": str(site / "good.nii.gz"), "label": 1}]
    (decoded,) = decode_items(items, ["image"])
    assert decoded["image"].shape == (1, 8, 8, 8) and decoded["label"] == 1


def test_nifti_and_png_read_fully(tmp_path: Path) -> None:
    data = read_image(_nifti(tmp_path / "a.nii.gz"))
    assert data.shape == (8, 8, 8) and data[7, 7, 7] == 511
    from PIL import Image

    Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4)).save(tmp_path / "b.png")
    assert read_image(tmp_path / "b.png").shape == (3, 4)  # rows, columns as stored


def test_dicom_series_is_ordered_by_position_and_restores_validation(tmp_path: Path) -> None:
    volume = _series(tmp_path / "s")
    # Shuffle the names so that file order is not slice order.
    files = sorted((tmp_path / "s").iterdir())
    for i, f in enumerate(reversed(files)):
        f.rename(tmp_path / "s" / f"x{i:02d}.dcm")
    before = pydicom.config.settings.reading_validation_mode
    read = read_dicom_series(tmp_path / "s")
    assert pydicom.config.settings.reading_validation_mode == before
    assert read.shape == volume.shape
    np.testing.assert_allclose(read, volume, atol=volume.max() / 4095)


def test_radiograph_monochrome1_is_inverted(tmp_path: Path) -> None:
    img = np.linspace(0, 1, 20, dtype=np.float32).reshape(4, 5)
    path = dicom_io.write_radiograph(tmp_path / "x.dcm", img, patient_id="P-2", uid_seed="t")
    ds = pydicom.dcmread(path)
    assert ds.file_meta.TransferSyntaxUID == pydicom.uid.ExplicitVRLittleEndian
    assert ds.PhotometricInterpretation == "MONOCHROME1"
    read = read_dicom_file(path)
    assert np.argmax(read) == np.argmax(img)  # bright stays bright


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site folder with good NIfTI, DICOM files and a DICOM series, and a datalist."""
    _nifti(tmp_path / "good.nii.gz")
    _nifti(tmp_path / "good.nii")
    _series(tmp_path / "series_ok")
    dicom_io.write_radiograph(tmp_path / "good.dcm", np.eye(4, dtype=np.float32),
                              patient_id="P-3", uid_seed="g")
    return tmp_path


def _truncate(path: Path, keep: float = 0.5) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])


def test_bad_files_are_skipped_with_one_line_each(site: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    shutil.copy(site / "good.nii", site / "trunc.nii")
    _truncate(site / "trunc.nii")
    # A gzip stream cut short, as an interrupted copy leaves it.
    raw = gzip.compress(gzip.decompress((site / "good.nii.gz").read_bytes()))
    (site / "trunc.nii.gz").write_bytes(raw[: len(raw) // 2])
    (site / "empty.nii.gz").write_bytes(b"")
    (site / "notdicom.dcm").write_text("this is a report, not an image\n")
    _series(site / "series_gap")
    (site / "series_gap" / "IM0003.dcm").unlink()
    items = [{"image": str(site / n)} for n in
             ("good.nii.gz", "trunc.nii", "good.nii", "trunc.nii.gz", "empty.nii.gz",
              "notdicom.dcm", "good.dcm", "series_gap", "series_ok")]
    with caplog.at_level(logging.WARNING, logger="fedbn_med.tasks.imaging.datalist"):
        kept = decode_items(items, ["image"], site="S1", decode=False)
    assert sorted(Path(it["image"]).name for it in kept) == [
        "good.dcm", "good.nii", "good.nii.gz", "series_ok"]
    lines = [r.getMessage() for r in caplog.records if r.name == "fedbn_med.tasks.imaging.datalist"]
    expected = {"trunc.nii": "unreadable NIfTI", "trunc.nii.gz": "unreadable NIfTI",
                "empty.nii.gz": "empty file", "notdicom.dcm": "not a DICOM file",
                "series_gap": "missing slice"}
    assert len(lines) == len(expected), lines
    for name, reason in expected.items():
        match = [ln for ln in lines if f"{site / name}:" in ln]
        assert len(match) == 1 and reason in match[0], (name, lines)
        assert "\n" not in match[0]


def test_series_with_uneven_spacing_is_refused(tmp_path: Path) -> None:
    _series(tmp_path / "s", n=6)
    path = tmp_path / "s" / "IM0004.dcm"
    ds = pydicom.dcmread(path)
    ds.ImagePositionPatient = [0.0, 0.0, 6.7]  # 3 * 2.0 expected
    ds.save_as(path)
    with pytest.raises(ImageReadError, match="inconsistent slice spacing"):
        read_dicom_series(tmp_path / "s")


def test_unsupported_type_message(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"x")
    with pytest.raises(ImageReadError, match=r"unsupported image type; expected \.nii"):
        read_image(tmp_path / "a.jpg")


def test_datalist_resolves_paths_and_splits(tmp_path: Path) -> None:
    items = [{"image": f"img{i}.nii.gz", "label": i % 2} for i in range(10)]
    (tmp_path / "dl.json").write_text(json.dumps({"training": items}))
    splits = load_datalist(tmp_path / "dl.json", split_seed=3)
    assert {k: len(v) for k, v in splits.items()} == {"training": 6, "validation": 2,
                                                       "test": 2}
    assert splits["training"][0]["image"].startswith(str(tmp_path))
    assert splits == load_datalist(tmp_path / "dl.json", split_seed=3)


def test_datalist_errors_say_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist. Expected a MONAI-style JSON"):
        load_datalist(tmp_path / "missing.json")
    (tmp_path / "dl.json").write_text(json.dumps({"train": []}))
    with pytest.raises(ValueError, match=r"has keys \['train'\]; expected 'training'"):
        load_datalist(tmp_path / "dl.json")


def _forged_nifti(path: Path, shape: tuple[int, ...]) -> Path:
    """A header alone, gzipped to a few dozen bytes, declaring a volume of ``shape``."""
    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(np.float32)
    header.set_data_offset(352)
    path.write_bytes(gzip.compress(header.binaryblock + b"\0" * 4, mtime=0))
    return path


@pytest.mark.parametrize("shape", [(1024, 1024, 512), (20000, 20000, 20000)])
def test_tiny_nifti_declaring_a_huge_volume_is_refused_before_allocation(
        tmp_path: Path, shape: tuple[int, ...]) -> None:
    import tracemalloc

    path = _forged_nifti(tmp_path / "forged.nii.gz", shape)
    assert path.stat().st_size < 100
    tracemalloc.start()
    try:
        with pytest.raises(ImageReadError, match=r"NIfTI too large: the header declares shape "
                                                 rf"\({shape[0]}, .* at most 268,435,456") as err:
            read_image(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.path == path and str(err.value).startswith(f"{path}: ")
    assert peak < 20 * 2**20  # nothing near the declared size was allocated


def test_nifti_declaring_more_than_its_file_holds_is_refused(tmp_path: Path) -> None:
    path = _forged_nifti(tmp_path / "forged.nii.gz", (256, 256, 256))  # 64 MiB, under the bound
    with pytest.raises(ImageReadError, match=r"forged\.nii\.gz: unreadable NIfTI: the header "
                                             r"declares shape \(256, 256, 256\) of float32 "
                                             r".*truncated file or forged header"):
        read_image(path)
    with pytest.raises(ImageReadError, match=r"NIfTI too large: .*\(512 voxels\); at most 100"):
        read_nifti(_nifti(tmp_path / "ok.nii.gz"), max_voxels=100)


def test_random_bytes_png_is_refused_as_a_png(tmp_path: Path) -> None:
    path = tmp_path / "scan.png"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ImageReadError, match=r"scan\.png: not a PNG file: it lacks the 8-byte "
                                             "PNG signature") as err:
        read_image(path)
    assert "DICOM" not in str(err.value)
    # A real PNG signature with a corrupt body is still reported as a PNG fault.
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + np.random.default_rng(1).bytes(4096))
    with pytest.raises(ImageReadError, match=r"scan\.png: unreadable PNG") as err:
        read_image(path)
    assert "DICOM" not in str(err.value)
