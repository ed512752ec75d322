"""The site reader on real DICOM files (pydicom's and pydicom-data's), against pydicom's decoding.

Vendors (GE, Toshiba, Philips, Fuji, Siemens, Agfa), compressions (RLE, JPEG 2000, JPEG
baseline, deflate, big endian), multi-frame (enhanced) objects and a real DICOMDIR export
with extensionless names. Synthetic files only for bad input.
"""

from __future__ import annotations

import logging
import tracemalloc
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.pixels import apply_modality_lut, apply_voi_lut

from fedbn_med.tasks.imaging import dicom_io
from fedbn_med.tasks.imaging.readers import ImageReadError, read_image


def _file(name: str) -> Path:
    path = get_testdata_file(name, download=False)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install pydicom-data)")
    return Path(path)


def _pydicom_modality(path: Path) -> np.ndarray:
    ds = pydicom.dcmread(path)
    return np.asarray(apply_modality_lut(ds.pixel_array, ds), dtype=np.float32)


@pytest.mark.parametrize("name", [
    "CT_small.dcm",                   # GE CT, explicit little endian, rescale to HU
    "MR_small.dcm",                   # Toshiba MR
    "MR_small_RLE.dcm",               # RLE lossless
    "MR_small_jp2klossless.dcm",      # JPEG 2000 lossless (Pillow)
    "MR_small_bigendian.dcm",         # explicit big endian
    "MR_small_implicit.dcm",          # implicit VR
    "image_dfl.dcm",                  # deflated transfer syntax
    "examples_overlay.dcm",           # Siemens MR with overlays
    "mlut_18.dcm",                    # a Modality LUT Sequence instead of rescale
])
def test_single_frames_equal_pydicoms_modality_values(name: str) -> None:
    path = _file(name)
    read = read_image(path)
    expected = _pydicom_modality(path)
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    assert read.shape == (ds.Rows, ds.Columns)  # rows first, as stored: same orientation
    np.testing.assert_allclose(read, expected, rtol=1e-6)


def test_compressed_copies_read_as_the_uncompressed_file() -> None:
    reference = read_image(_file("MR_small.dcm"))
    for name in ("MR_small_RLE.dcm", "MR_small_jp2klossless.dcm", "MR_small_bigendian.dcm"):
        np.testing.assert_array_equal(read_image(_file(name)), reference)
    # Philips and Fuji CR, MONOCHROME1: JPEG 2000 lossless equals the uncompressed file.
    for vendor in ("RG1", "RG3"):
        np.testing.assert_array_equal(read_image(_file(f"{vendor}_J2KR.dcm")),
                                      read_image(_file(f"{vendor}_UNCR.dcm")))


def test_monochrome1_is_inverted_so_bright_means_high() -> None:
    path = _file("RG1_UNCR.dcm")
    ds = pydicom.dcmread(path)
    assert ds.PhotometricInterpretation == "MONOCHROME1"
    stored = ds.pixel_array.astype(np.float64)
    read = read_image(path).astype(np.float64)
    # Reflected over the 2**BitsStored range: an exact negative linear map of the stored.
    np.testing.assert_allclose(read, (2**ds.BitsStored - 1) - stored)
    display = read_image(path, values="display")
    windowed = np.asarray(apply_voi_lut(stored, ds), dtype=np.float64)
    expected = 1 - (windowed - windowed.min()) / (windowed.max() - windowed.min())
    np.testing.assert_allclose(display, expected, atol=1e-6)
    assert 0.0 <= display.min() and display.max() <= 1.0


def test_voi_window_applied_as_pydicom_does() -> None:
    path = _file("CT_small.dcm")
    ds = pydicom.dcmread(path)
    windowed = np.asarray(apply_voi_lut(_pydicom_modality(path), ds), dtype=np.float64)
    expected = (windowed - windowed.min()) / (windowed.max() - windowed.min())
    np.testing.assert_allclose(read_image(path, values="display"), expected, atol=1e-6)


def test_multi_frame_enhanced_mr_reads_as_a_volume() -> None:
    path = _file("emri_small.dcm")
    ds = pydicom.dcmread(path)
    volume = read_image(path)
    assert volume.shape == (ds.Rows, ds.Columns, ds.NumberOfFrames) == (64, 64, 10)
    np.testing.assert_array_equal(np.moveaxis(volume, 2, 0), ds.pixel_array)
    for name in ("emri_small_RLE.dcm", "emri_small_jpeg_2k_lossless.dcm",
                 "emri_small_big_endian.dcm"):
        np.testing.assert_array_equal(read_image(_file(name)), volume)


def test_enhanced_ct_uses_per_frame_geometry_and_rescale() -> None:
    path = _file("eCT_Supplemental.dcm")
    ds = pydicom.dcmread(path)
    shared = ds.SharedFunctionalGroupsSequence[0]
    rescale = shared.PixelValueTransformationSequence[0]
    orient = np.asarray(shared.PlaneOrientationSequence[0].ImageOrientationPatient, float)
    normal = np.cross(orient[:3], orient[3:])
    along = [float(np.dot(normal, g.PlanePositionSequence[0].ImagePositionPatient))
             for g in ds.PerFrameFunctionalGroupsSequence]
    hu = ds.pixel_array * float(rescale.RescaleSlope) + float(rescale.RescaleIntercept)
    volume = read_image(path)
    assert volume.shape == (512, 512, 2)
    np.testing.assert_allclose(np.moveaxis(volume, 2, 0), hu[np.argsort(along)])


def test_rt_dose_frames_follow_the_grid_offsets() -> None:
    path = _file("rtdose.dcm")
    ds = pydicom.dcmread(path)
    volume = read_image(path)
    assert volume.shape == (ds.Rows, ds.Columns, ds.NumberOfFrames)
    order = np.argsort([float(v) for v in ds.GridFrameOffsetVector])
    np.testing.assert_allclose(np.moveaxis(volume, 2, 0),
                               (ds.pixel_array * float(ds.DoseGridScaling))[order], rtol=1e-6)


def test_dicomdir_export_read_by_content_and_followed(caplog: pytest.LogCaptureFixture) -> None:
    dicomdir = _file("DICOMDIR")
    export = dicomdir.parent
    files = [p for p in export.rglob("*") if p.is_file() and p.name.isdigit()]
    assert len(files) == 31 and not any(p.suffix for p in files)  # PACS names
    for path in files:
        ds = pydicom.dcmread(path)
        assert read_image(path).shape == (ds.Rows, ds.Columns)
    volume = read_image(dicomdir, series="SmartScore - Gated 0.5 sec")
    folder = export / "98892001" / "CT5N"
    np.testing.assert_array_equal(volume, read_image(folder))
    slices = sorted(folder.iterdir(), key=lambda p: float(pydicom.dcmread(p)
                                                          .ImagePositionPatient[2]))
    np.testing.assert_allclose(volume[:, :, 0], _pydicom_modality(slices[0]))
    with caplog.at_level(logging.INFO, logger="fedbn_med.tasks.imaging.dicom_series"):
        assert read_image(export / "98892001").shape == (16, 16, 5)  # 2 series: the largest
    assert any("2 series; reading the largest" in r.getMessage() for r in caplog.records)
    with pytest.raises(ImageReadError, match=r"no series match 'T2 AX'.*SmartScore"):
        read_image(dicomdir, series="T2 AX")
    with pytest.raises(ImageReadError, match="holds slices of 7 orientations"):
        read_image(dicomdir)  # the largest series is a set of angiography projections


def test_missing_decoder_and_no_pixels_are_one_line_true_reasons() -> None:
    with pytest.raises(ImageReadError, match=r"compressed as JPEG-LS Lossless Image "
                                             r"Compression and no installed decoder handles "
                                             r"it \(install one of: .*pylibjpeg") as err:
        read_image(_file("MR_small_jpeg_ls_lossless.dcm"))
    assert "\n" not in str(err.value)
    with pytest.raises(ImageReadError, match="the DICOMDIR lists no instances"):
        read_image(_file("DICOMDIR-empty.dcm"))


def _slices(folder: Path, n: int = 5) -> None:
    volume = np.random.default_rng(0).uniform(0, 100, (6, 7, n))
    dicom_io.write_series(folder, volume, spacing=(1.0, 1.0, 2.0), patient_id="P", uid_seed="s")


def test_preamble_less_file_is_read_by_content(tmp_path: Path) -> None:
    _slices(tmp_path / "s", 1)
    ds = pydicom.dcmread(tmp_path / "s" / "IM0001.dcm")
    raw = tmp_path / "EXPORT0001"
    ds.preamble = None
    del ds.file_meta
    ds.save_as(raw, enforce_file_format=False, implicit_vr=True, little_endian=True)
    assert raw.read_bytes()[128:132] != b"DICM"
    np.testing.assert_array_equal(read_image(raw), read_image(tmp_path / "s" / "IM0001.dcm"))


def test_series_without_positions_refuses_an_instance_gap(tmp_path: Path) -> None:
    _slices(tmp_path / "s")
    for path in (tmp_path / "s").iterdir():
        ds = pydicom.dcmread(path)
        del ds.ImagePositionPatient
        ds.save_as(path)
    (tmp_path / "s" / "IM0003.dcm").unlink()
    with pytest.raises(ImageReadError, match=r"missing slice\(s\): InstanceNumber 3 absent "
                                             "from 1..5 and no slice positions"):
        read_image(tmp_path / "s")


def test_forged_dicom_size_is_refused_before_decoding(tmp_path: Path) -> None:
    _slices(tmp_path / "s", 1)
    path = tmp_path / "s" / "IM0001.dcm"
    ds = pydicom.dcmread(path)
    ds.Rows, ds.Columns, ds.NumberOfFrames = 65535, 65535, 100
    ds.save_as(path)
    tracemalloc.start()
    try:
        with pytest.raises(ImageReadError, match=r"DICOM too large: Rows x Columns x frames x "
                                                 r"samples 65535 x 65535 x 100 x 1"):
            read_image(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20
