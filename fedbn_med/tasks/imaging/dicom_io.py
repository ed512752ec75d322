"""DICOM writing for the built-in sites, and strict reading for every site.

The writer produces valid Part-10 files (preamble, file meta with the transfer syntax,
SOP class and instance UIDs), as a modality would; UIDs derive from a seed so that the
built-in sites are byte-for-byte reproducible. The reading side (:mod:`.dicom_read`)
runs pydicom inside :func:`strict_reading`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pydicom
import pydicom.config
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import UID, ExplicitVRLittleEndian, generate_uid

__all__ = ["DX_IMAGE", "MR_IMAGE", "strict_reading", "write_radiograph", "write_series"]

MR_IMAGE = "1.2.840.10008.5.1.4.1.1.4"
DX_IMAGE = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation
_MAX_STORED = 4095  # 12 bits stored in 16 allocated, as most modalities do


@contextmanager
def strict_reading() -> Iterator[None]:
    """Make pydicom raise on invalid values (not warn) inside the block, then restore.

    pydicom's default only warns and returns a partial dataset for a truncated or
    malformed file; a site's loader must see the error to skip the file.
    """
    settings = pydicom.config.settings
    previous = settings.reading_validation_mode
    settings.reading_validation_mode = pydicom.config.RAISE
    try:
        yield
    finally:
        settings.reading_validation_mode = previous


def _dataset(path: Path, sop_class: str, uid_seed: str, instance: int) -> FileDataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(sop_class)
    meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=[uid_seed, "sop", str(instance)])
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = generate_uid(entropy_srcs=[uid_seed, "study"])
    ds.SeriesInstanceUID = generate_uid(entropy_srcs=[uid_seed, "series"])
    ds.FrameOfReferenceUID = generate_uid(entropy_srcs=[uid_seed, "frame"])
    ds.SeriesNumber = 1
    ds.InstanceNumber = instance
    ds.SamplesPerPixel = 1
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    return ds


def _pixels(ds: FileDataset, image: np.ndarray, slope: float) -> None:
    stored = np.clip(np.round(image / slope), 0, _MAX_STORED).astype(np.uint16)
    ds.Rows, ds.Columns = (int(n) for n in stored.shape)
    ds.RescaleSlope = f"{slope:.6g}"
    ds.RescaleIntercept = "0"
    ds.PixelData = stored.tobytes()


def write_series(folder: Path, volume: np.ndarray, *, spacing: Sequence[float],
                 patient_id: str, uid_seed: str) -> Path:
    """Write a 3D volume (x, y, z) as an axial MR series, one file per z slice.

    Slices are stored as ``volume[:, :, k]`` (rows along x) at
    ``ImagePositionPatient = (0, 0, k * spacing[2])`` with ``InstanceNumber = k + 1``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    slope = max(float(volume.max()), 1e-6) / _MAX_STORED
    for k in range(volume.shape[2]):
        path = folder / f"IM{k + 1:04d}.dcm"
        ds = _dataset(path, MR_IMAGE, uid_seed, k + 1)
        ds.Modality = "MR"
        ds.PatientID = patient_id
        ds.PatientName = patient_id.replace("-", "^")
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [0.0, 0.0, round(k * float(spacing[2]), 4)]
        ds.PixelSpacing = [float(spacing[0]), float(spacing[1])]
        ds.SliceThickness = float(spacing[2])
        _pixels(ds, volume[:, :, k], slope)
        ds.save_as(path, enforce_file_format=True)
    return folder


def write_radiograph(path: Path, image: np.ndarray, *, patient_id: str, uid_seed: str) -> Path:
    """Write a [0, 1] radiograph (bright = attenuating) as an inverted DX image.

    The file stores ``MONOCHROME1`` (low values display bright), as many detectors do;
    readers must invert it.
    """
    ds = _dataset(path, DX_IMAGE, uid_seed, 1)
    ds.Modality = "DX"
    ds.PatientID = patient_id
    ds.PatientName = patient_id.replace("-", "^")
    ds.PhotometricInterpretation = "MONOCHROME1"
    ds.ImagerPixelSpacing = [0.5, 0.5]
    _pixels(ds, (1.0 - image) * _MAX_STORED, 1.0)
    ds.save_as(path, enforce_file_format=True)
    return path
