"""Read DICOM as a PACS exports it: by content, by series, multi-frame, DICOMDIR.

pydicom decodes (its native, RLE and Pillow decoders, and pylibjpeg or GDCM when they are
installed) inside :func:`~.dicom_io.strict_reading`; pydicom's own Part 3 transforms map
stored values to modality units (``apply_modality_lut``: Rescale Slope/Intercept or a
Modality LUT), to display values (``apply_voi_lut``: Window Center/Width with the VOI LUT
Function, or a VOI LUT) and palette colour to RGB (``apply_color_lut``). MONAI's
``PydicomReader`` is not used for DICOM: it orders a series by ``InstanceNumber`` alone,
stacks slices of different sizes or spacings with only a warning and ignores
``MONOCHROME1``, which are the faults a site's reader must catch.

Layout of what is returned: one frame ``(rows, columns)``; a series or a multi-frame
object ``(rows, columns, frames)``, frames ordered along the slice normal when the
geometry is given; colour images carry a trailing RGB axis.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pydicom
from pydicom.errors import InvalidDicomError
from pydicom.pixels import apply_color_lut, apply_modality_lut, apply_voi_lut, get_decoder
from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian, ImplicitVRLittleEndian

from fedbn_med.tasks.imaging.dicom_io import strict_reading

__all__ = ["PIXEL_TAGS", "ImageReadError", "ValuesMode", "check_dicom_size", "check_spacing",
           "decode_dataset", "first_line", "is_dicom", "order_frames", "read_dataset",
           "sop_name"]

logger = logging.getLogger(__name__)

ValuesMode = Literal["modality", "display"]
PIXEL_TAGS = ("PixelData", "FloatPixelData", "DoubleFloatPixelData")
_SPACING_TOL = 0.01  # relative tolerance on the distance between neighbouring slices


class ImageReadError(ValueError):
    """Raised when an image file or DICOM series cannot be used; says which and why."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


def first_line(err: BaseException) -> str:
    """Return the last non-empty line of an error's message (at most 200 characters)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else type(err).__name__


def is_dicom(path: Path) -> bool:
    """Return True when ``path`` starts like a DICOM file, with or without the preamble.

    A Part-10 file has 128 bytes of preamble then ``DICM``. Older and some exported files
    have neither; they start with a data element of group 0x0002 or 0x0008 (either byte
    order), which is what pydicom can then read with ``force=True``.
    """
    try:
        with path.open("rb") as handle:
            head = handle.read(132)
    except OSError:
        return False
    if len(head) >= 132 and head[128:132] == b"DICM":
        return True
    if len(head) < 8:
        return False
    group_le = int.from_bytes(head[:2], "little")
    group_be = int.from_bytes(head[:2], "big")
    return group_le in (0x0002, 0x0008) or group_be in (0x0002, 0x0008)


def read_dataset(path: Path, *, pixels: bool = True) -> pydicom.Dataset:
    """Read a DICOM file strictly (pydicom ``RAISE`` mode), by content not by name.

    With ``pixels=False`` values above 4 KiB (the pixel data) are left on disk.
    """
    force = not _has_preamble(path)
    try:
        with strict_reading():
            # Without pixels, large values are deferred (read on access), not dropped:
            # the tags stay visible, so a file without pixel data is told apart.
            ds = pydicom.dcmread(path, force=force, defer_size=None if pixels else 4096)
            if force:
                _set_raw_syntax(ds)
            return ds
    except InvalidDicomError as err:
        what = "invalid DICOM" if not force else "not a DICOM file"
        raise ImageReadError(path, f"{what} ({first_line(err)})") from err
    except (OSError, EOFError, ValueError, AttributeError, KeyError, TypeError,
            IndexError, MemoryError) as err:
        raise ImageReadError(path, f"invalid or truncated DICOM ({type(err).__name__}: "
                               f"{first_line(err)})") from err


def _set_raw_syntax(ds: pydicom.Dataset) -> None:
    """Give a file without file meta the (uncompressed) transfer syntax it was read in.

    Such files predate Part 10 or were exported raw; their encoding is what pydicom found
    when reading them, and their pixel data are not encapsulated.
    """
    meta = ds.file_meta if hasattr(ds, "file_meta") else None
    if meta is not None and "TransferSyntaxUID" in meta:
        return
    implicit, little = ds.original_encoding
    if implicit is None:
        return
    syntax = ImplicitVRLittleEndian if implicit else (
        ExplicitVRLittleEndian if little else ExplicitVRBigEndian)
    if meta is None:
        ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = syntax


def _has_preamble(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(132)
    return len(head) == 132 and head[128:132] == b"DICM"


def _n_frames(ds: pydicom.Dataset) -> int:
    try:
        return max(1, int(ds.get("NumberOfFrames", 1) or 1))
    except (TypeError, ValueError):
        return 1


def check_dicom_size(path: Path, ds: pydicom.Dataset, max_voxels: int, max_bytes: int) -> None:
    """Refuse, before decoding, pixel data whose declared size exceeds the bounds.

    The bytes counted are the decoded stored values plus the float32 copy returned.
    """
    dims = (int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0), _n_frames(ds),
            int(ds.get("SamplesPerPixel", 1) or 1))
    voxels = math.prod(dims)
    stored = max(1, int(ds.get("BitsAllocated", 16) or 16) // 8)
    needed = voxels * (stored + 4)
    if voxels > max_voxels or needed > max_bytes:
        raise ImageReadError(path, f"DICOM too large: Rows x Columns x frames x samples "
                               f"{' x '.join(map(str, dims))} = {voxels:,} voxels "
                               f"(about {needed / 2**20:,.0f} MiB decoded); at most "
                               f"{max_voxels:,} voxels and {max_bytes / 2**20:,.0f} MiB are read")


def _check_decodable(path: Path, ds: pydicom.Dataset) -> None:
    if not any(tag in ds for tag in PIXEL_TAGS):
        raise ImageReadError(path, f"no pixel data (a {sop_name(ds)} object, not an image)")
    if "PixelData" not in ds:
        return  # float pixel data are never compressed
    syntax = ds.file_meta.get("TransferSyntaxUID") if hasattr(ds, "file_meta") else None
    if syntax is None or not syntax.is_compressed:
        return
    try:
        decoder = get_decoder(syntax)
    except NotImplementedError:
        raise ImageReadError(path, f"pixel data in transfer syntax {syntax} ({syntax.name}), "
                               "which pydicom cannot decode") from None
    if not decoder.is_available:
        needs = "; ".join(decoder.missing_dependencies) or "a decoder plugin"
        raise ImageReadError(path, f"pixel data compressed as {syntax.name} and no installed "
                               f"decoder handles it (install one of: {needs})")


def sop_name(ds: pydicom.Dataset) -> str:
    """Return the name of a dataset's SOP class (e.g. 'CT Image Storage'), for messages."""
    uid = ds.get("SOPClassUID") or ds.get("MediaStorageSOPClassUID")
    if uid is None and hasattr(ds, "file_meta"):
        uid = ds.file_meta.get("MediaStorageSOPClassUID")
    name = getattr(uid, "name", "") if uid is not None else ""
    return name or ("DICOMDIR" if "DirectoryRecordSequence" in ds else "DICOM")


def _frame_groups(ds: pydicom.Dataset, index: int, keyword: str) -> pydicom.Dataset | None:
    """Return the functional group item ``keyword`` for frame ``index``: per-frame, else shared."""
    for seq_name, pick in (("PerFrameFunctionalGroupsSequence", index),
                           ("SharedFunctionalGroupsSequence", 0)):
        seq = ds.get(seq_name)
        if seq and pick < len(seq) and keyword in seq[pick] and seq[pick][keyword].value:
            return seq[pick][keyword].value[0]
    return None


def _pixels(path: Path, ds: pydicom.Dataset) -> np.ndarray:
    try:
        with strict_reading():
            raw = ds.pixel_array
    except (OSError, EOFError, ValueError, AttributeError, KeyError, TypeError, IndexError,
            RuntimeError, NotImplementedError, MemoryError) as err:
        raise ImageReadError(path, f"pixel data cannot be decoded ({type(err).__name__}: "
                               f"{first_line(err)})") from err
    return raw


def _modality(raw: np.ndarray, ds: pydicom.Dataset, multi: bool) -> np.ndarray:
    """Convert stored values to modality units, per frame for an enhanced multi-frame object."""
    transforms = [_frame_groups(ds, i, "PixelValueTransformationSequence")
                  for i in range(_n_frames(ds))] if multi else []
    if any(t is not None for t in transforms):
        out = raw.astype(np.float32)
        for i, item in enumerate(transforms):
            if item is not None:
                out[i] = out[i] * float(item.get("RescaleSlope", 1) or 1) + float(
                    item.get("RescaleIntercept", 0) or 0)
        return out
    values = np.asarray(apply_modality_lut(raw, ds), dtype=np.float32)
    if "DoseGridScaling" in ds and "RescaleSlope" not in ds:  # RT Dose: stored x scaling = Gy
        values = values * float(ds.DoseGridScaling)
    return values


def _stored_range(ds: pydicom.Dataset) -> tuple[float, float]:
    bits = int(ds.get("BitsStored", ds.get("BitsAllocated", 16)) or 16)
    if int(ds.get("PixelRepresentation", 0) or 0):
        return float(-(2 ** (bits - 1))), float(2 ** (bits - 1) - 1)
    return 0.0, float(2**bits - 1)


def _display(values: np.ndarray, ds: pydicom.Dataset, multi: bool) -> np.ndarray:
    """Modality values through the VOI LUT or window to [0, 1], as a viewer shows them."""
    frame_voi = [_frame_groups(ds, i, "FrameVOILUTSequence")
                 for i in range(_n_frames(ds))] if multi else []
    if any(v is not None for v in frame_voi):
        out = np.empty_like(values, dtype=np.float32)
        for i, item in enumerate(frame_voi):
            view = pydicom.Dataset()
            if item is not None:
                for key in ("WindowCenter", "WindowWidth", "VOILUTFunction"):
                    if key in item:
                        setattr(view, key, item[key].value)
            view.PhotometricInterpretation = ds.PhotometricInterpretation
            out[i] = _unit(apply_voi_lut(values[i], view), values[i])
        return out
    if "WindowCenter" in ds or "VOILUTSequence" in ds:
        return _unit(apply_voi_lut(values, ds), values)
    return _unit(values, values)


def _unit(windowed: np.ndarray, values: np.ndarray) -> np.ndarray:
    windowed = np.asarray(windowed, dtype=np.float32)
    lo, hi = float(windowed.min()), float(windowed.max())
    return (windowed - lo) / (hi - lo) if hi > lo else np.zeros_like(windowed)


def decode_dataset(path: Path, ds: pydicom.Dataset, *, values: ValuesMode = "modality",
                   max_voxels: int, max_bytes: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Decode one DICOM object: return its array and, for multi-frame, frame positions.

    ``values="modality"`` gives modality units (HU for CT); ``"display"`` gives the VOI
    window mapped to [0, 1]. ``MONOCHROME1`` (low values shown bright) is turned into
    the ``MONOCHROME2`` sense, so that bright always means high: modality values are
    reflected over the range the stored bits can hold, display values become ``1 - v``.
    """
    _check_decodable(path, ds)
    check_dicom_size(path, ds, max_voxels, max_bytes)
    raw = _pixels(path, ds)
    multi = _n_frames(ds) > 1
    photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2"))
    if photometric == "PALETTE COLOR":
        array = np.asarray(apply_color_lut(raw, ds), dtype=np.float32)
    elif int(ds.get("SamplesPerPixel", 1) or 1) > 1:
        array = raw.astype(np.float32)  # pydicom returns YBR as RGB already
    else:
        array = _modality(raw, ds, multi)
        if values == "display":
            array = _display(array, ds, multi)
        if photometric == "MONOCHROME1":
            if values == "display":
                array = 1.0 - array
            else:
                lo, hi = (float(v) for v in apply_modality_lut(
                    np.asarray(_stored_range(ds)), ds))
                array = lo + hi - array
    if not np.isfinite(array).all():
        raise ImageReadError(path, "pixel values contain NaN or Inf")
    positions = _frame_positions(ds) if multi else None
    if multi:  # frames first from pydicom; frames last here, as for a series
        array = np.moveaxis(array, 0, 2)
    return array, positions


def _normal(orientation: Sequence[float]) -> np.ndarray:
    o = np.asarray([float(v) for v in orientation])
    return np.cross(o[:3], o[3:])


def _frame_positions(ds: pydicom.Dataset) -> np.ndarray | None:
    """Return each frame's position along the slice normal, or None when not given."""
    n = _n_frames(ds)
    if "PerFrameFunctionalGroupsSequence" in ds:
        orient = _frame_groups(ds, 0, "PlaneOrientationSequence")
        points = [_frame_groups(ds, i, "PlanePositionSequence") for i in range(n)]
        if orient is None or any(p is None or "ImagePositionPatient" not in p for p in points):
            return None
        normal = _normal(orient.ImageOrientationPatient)
        return np.array([np.dot(normal, [float(v) for v in p.ImagePositionPatient])
                         for p in points if p is not None])
    offsets = ds.get("GridFrameOffsetVector")
    if offsets is not None and len(offsets) == n:  # RT Dose: offsets along the normal
        return np.asarray([float(v) for v in offsets])
    return None


def order_frames(path: Path, array: np.ndarray, positions: np.ndarray | None) -> np.ndarray:
    """Sort a multi-frame volume's frames along the normal and check their spacing."""
    if positions is None or len(positions) < 2:
        return array
    if len(np.unique(np.round(positions, 4))) < len(positions):
        logger.debug("%s: frames share positions (several stacks or phases); stored order "
                     "kept", path)
        return array
    order = np.argsort(positions)
    check_spacing(path, positions[order], [f"frame {i + 1}" for i in order])
    return array[:, :, order]


def check_spacing(where: Path, positions: np.ndarray, names: Sequence[str]) -> None:
    """Refuse slices whose spacing along the normal is not uniform, naming the pair."""
    if len(positions) < 3:
        return
    gaps = np.diff(positions)
    step = float(np.median(gaps))
    if step <= 0:
        raise ImageReadError(where, "slices share the same position")
    bad = np.flatnonzero(np.abs(gaps - step) > _SPACING_TOL * step)
    if bad.size:
        k = int(bad[0])
        kind = "missing slice" if gaps[k] > 1.5 * step else "inconsistent slice spacing"
        raise ImageReadError(where, f"{kind}: {gaps[k]:.3g} mm between {names[k]} and "
                                f"{names[k + 1]}, expected {step:.3g} mm")
