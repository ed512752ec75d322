"""Read a site's images by their content: DICOM, NIfTI and other nibabel formats, PNG, JPEG.

:func:`read_image` looks at a file's first bytes, not its name: DICOM by its preamble (or
a leading group 0002/0008 element, for preamble-less files pydicom reads), PNG and JPEG
by their signatures, NIfTI by its magic (gzipped or not). A folder, or a ``DICOMDIR``,
is grouped into series by ``SeriesInstanceUID`` and one series is read (by UID or
description when the datalist names one, else the largest, logged). DICOM goes through
:mod:`.dicom_read` (pydicom, strict); NIfTI and the other formats nibabel opens go
through MONAI's ``NibabelReader``, PNG and JPEG through MONAI's ``PILReader``.

Every path checks the declared size (header shape and type) against :data:`MAX_VOXELS`
and :data:`MAX_BYTES` before any array is allocated. A file that cannot be read raises
:class:`ImageReadError` naming the file and the reason; :func:`decode_items` turns each
such error into one warning line and keeps the rest of the site's data.
"""

from __future__ import annotations

import gzip
import logging
import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import nibabel as nib
import numpy as np
from monai.data.image_reader import NibabelReader, PILReader
from monai.transforms import LoadImage
from nibabel.filebasedimages import ImageFileError
from PIL import Image

from fedbn_med.tasks.imaging import dicom_read
from fedbn_med.tasks.imaging.dicom_read import ImageReadError, ValuesMode, first_line
from fedbn_med.tasks.imaging.dicom_series import find_series, order_slices, select_series

__all__ = [
    "MAX_BYTES",
    "MAX_VOXELS",
    "ImageReadError",
    "check_declared_size",
    "check_nifti_header",
    "read_dicom_file",
    "read_dicom_series",
    "read_image",
    "read_nifti",
]

logger = logging.getLogger(__name__)
# MONAI's optional GPU decoder plugin logs a warning on every pydicom decode when it is
# absent; the fallback (pydicom's own decoders) is what we want, so keep that quiet.
logging.getLogger("monai.data.nvimgcodec_pydicom_plugin").setLevel(logging.ERROR)

# Largest image decoded (2**28 voxels: 1 GiB as float32), checked from the header before
# anything is allocated; far above one MRI volume or radiograph, far below a host's memory.
MAX_VOXELS = 2**28
# Bytes a decode may need: the stored values plus one float working copy (see
# check_declared_size); 3 GiB lets a 2**28-voxel float32 volume through, not a float64 one.
MAX_BYTES = 3 * 2**30
# Deflate expands at most about 1032:1, so a .nii.gz of n bytes cannot hold more than this.
_DEFLATE_RATIO = 1032
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"
# Formats nibabel opens by name (besides NIfTI, found by content).
_NIBABEL_SUFFIXES = (".mgz", ".mgh", ".mnc", ".hdr", ".img", ".par", ".rec", ".head",
                     ".brik", ".brik.gz", ".v")
_EXPECTED = ("expected .nii, .nii.gz, DICOM (any name), PNG, JPEG, a format nibabel opens "
             "(.mgz, .mnc, .hdr/.img, .PAR/.REC, .HEAD/.BRIK), a DICOMDIR or a folder of "
             "DICOM series")


def _require_nonempty(path: Path) -> None:
    if not path.exists():
        raise ImageReadError(path, "file not found")
    if path.is_file() and path.stat().st_size == 0:
        raise ImageReadError(path, "empty file (0 bytes)")


def check_declared_size(path: str | Path, shape: Sequence[int], itemsize: int, *,
                        what: str = "image", max_voxels: int = MAX_VOXELS,
                        max_bytes: int = MAX_BYTES, working_bytes: int = 8) -> None:
    """Refuse a declared shape above the voxel bound, or whose decode needs too many bytes.

    The bytes counted are ``voxels * (itemsize + working_bytes)``: the stored values as
    read, plus the working copies per voxel (``working_bytes``: a float32 or float64
    array). Called on a header, before any array is allocated.

    Raises
    ------
    ImageReadError
        Naming the file, the declared shape and the bound it exceeds.
    """
    shape = tuple(int(n) for n in shape)
    if not shape or min(shape) <= 0:
        raise ImageReadError(path, f"unreadable {what}: the header declares shape {shape}; "
                                   "expected positive dimensions")
    voxels = math.prod(shape)
    if voxels > max_voxels:
        raise ImageReadError(path, f"{what} too large: the header declares shape {shape} "
                                   f"({voxels:,} voxels); at most {max_voxels:,} are read")
    needed = voxels * (int(itemsize) + working_bytes)
    if needed > max_bytes:
        raise ImageReadError(path, f"{what} too large: the header declares shape {shape} of "
                                   f"{itemsize}-byte values, about {needed / 2**20:,.0f} MiB "
                                   f"to decode; at most {max_bytes / 2**20:,.0f} MiB are read")


def _nibabel_header(path: Path, what: str) -> tuple[Any, tuple[int, ...], np.dtype]:
    try:
        image = nib.load(str(path))  # nibabel reads only the header here
    except (ImageFileError, OSError, EOFError, zlib.error, ValueError, TypeError,
            KeyError, IndexError) as err:
        raise ImageReadError(path, f"unreadable {what} header ({type(err).__name__}: "
                                   f"{first_line(err)})") from err
    if isinstance(image, nib.Cifti2Image):
        raise ImageReadError(path, "a CIFTI-2 file (a matrix over brain models), not a volume "
                                   "image; expected a 2D/3D/4D image")
    if not hasattr(image, "dataobj"):
        raise ImageReadError(path, f"{type(image).__name__} holds no image data")
    spatial = cast(nib.spatialimages.SpatialImage, image)  # it has dataobj: a spatial image
    try:
        shape = tuple(int(n) for n in spatial.shape)
        dtype = np.dtype(spatial.get_data_dtype())
    except (ValueError, TypeError, AttributeError) as err:
        raise ImageReadError(path, f"unreadable {what} header ({type(err).__name__}: "
                                   f"{first_line(err)})") from err
    return image, shape, dtype


def check_nifti_header(path: str | Path, *, max_voxels: int = MAX_VOXELS,
                       max_bytes: int = MAX_BYTES, working_bytes: int = 8) -> tuple[int, ...]:
    """Refuse a NIfTI header that declares more than the bounds or than the file can hold.

    Reads the header only. Returns the declared shape. ``working_bytes`` is passed to
    :func:`check_declared_size`.

    Raises
    ------
    ImageReadError
        Naming the file and the bound exceeded, before any array is allocated.
    """
    path = Path(path)
    _require_nonempty(path)
    image, shape, dtype = _nibabel_header(path, "NIfTI")
    check_declared_size(path, shape, dtype.itemsize, what="NIfTI", max_voxels=max_voxels,
                        max_bytes=max_bytes, working_bytes=working_bytes)
    offset = int(image.header.get_data_offset())
    size = path.stat().st_size
    capacity = size * _DEFLATE_RATIO if path.name.lower().endswith(".gz") else size
    needed = offset + math.prod(shape) * dtype.itemsize
    if needed > capacity:
        raise ImageReadError(path, f"unreadable NIfTI: the header declares shape {shape} of "
                                   f"{dtype} ({needed:,} bytes) but a {size:,}-byte file holds "
                                   f"at most {capacity:,}; truncated file or forged header")
    return shape


def read_nifti(path: str | Path, *, max_voxels: int = MAX_VOXELS,
               max_bytes: int = MAX_BYTES) -> np.ndarray:
    """Decode a ``.nii`` or ``.nii.gz`` file fully with MONAI ``LoadImage`` (nibabel).

    The header is checked first: a shape above ``max_voxels``, a decode above
    ``max_bytes``, or one that needs more bytes than the file can hold, is refused
    before any array is allocated.
    """
    path = Path(path)
    check_nifti_header(path, max_voxels=max_voxels, max_bytes=max_bytes)
    return _load_nibabel(path, "NIfTI")


def _load_nibabel(path: Path, what: str) -> np.ndarray:
    loader = LoadImage(image_only=True, dtype=np.float32)
    try:
        # A reader given per call is the only one tried (no fallback to other formats).
        data = np.asarray(loader(str(path), reader=NibabelReader()))
    except (OSError, EOFError, zlib.error, ValueError, RuntimeError, MemoryError,
            KeyError, IndexError, TypeError, ImageFileError) as err:
        raise ImageReadError(path, f"unreadable {what} ({type(err).__name__}: "
                                   f"{first_line(err)})") from err
    if not np.isfinite(data).all():
        raise ImageReadError(path, f"{what} data contain NaN or Inf")
    return data


def _read_other_nibabel(path: Path) -> np.ndarray:
    """Read a format nibabel opens by name (MGH, MINC, Analyze, PAR/REC, AFNI, ECAT).

    nibabel decodes these directly: MONAI's ``NibabelReader`` reads NIfTI-style header
    fields that the other formats' headers do not have.
    """
    what = f"{path.suffix.lstrip('.') or 'image'} image"
    image, shape, dtype = _nibabel_header(path, what)
    check_declared_size(path, shape, dtype.itemsize, what=what)
    try:
        data = np.asarray(image.get_fdata(dtype=np.float32))
    except (OSError, EOFError, zlib.error, ValueError, RuntimeError, MemoryError,
            KeyError, IndexError, TypeError, AttributeError, ImageFileError) as err:
        raise ImageReadError(path, f"unreadable {what} ({type(err).__name__}: "
                                   f"{first_line(err)})") from err
    if not np.isfinite(data).all():
        raise ImageReadError(path, f"{what} data contain NaN or Inf")
    return data


def read_dicom_file(path: str | Path, *, values: ValuesMode = "modality") -> np.ndarray:
    """Decode one DICOM file, whatever its name: one frame, or a multi-frame volume.

    One frame gives ``(rows, columns)``; a multi-frame (enhanced) object gives
    ``(rows, columns, frames)``, frames ordered along the slice normal from the per-frame
    geometry and checked for even spacing. ``values`` selects modality units or the VOI
    window in [0, 1]; ``MONOCHROME1`` is inverted so that bright always means high.
    """
    path = Path(path)
    _require_nonempty(path)
    ds = dicom_read.read_dataset(path)
    if "DirectoryRecordSequence" in ds:
        return read_dicom_series(path, values=values)
    array, positions = dicom_read.decode_dataset(path, ds, values=values,
                                                 max_voxels=MAX_VOXELS, max_bytes=MAX_BYTES)
    return dicom_read.order_frames(path, array, positions)


def read_dicom_series(source: str | Path, *, series: str | None = None,
                      values: ValuesMode = "modality") -> np.ndarray:
    """Assemble one DICOM series of a folder (or a ``DICOMDIR``) into a volume.

    The files are grouped by ``SeriesInstanceUID``; ``series`` picks one by UID or
    ``SeriesDescription``, else the largest is read (and the choice logged). A series of
    one multi-frame file is that file's volume. Slices are ordered by their position
    along the slice normal, else by ``InstanceNumber``, and returned as
    ``(rows, columns, slices)``. The series is refused, with the reason, when a file is
    unreadable, slices differ in size or orientation, an ``InstanceNumber`` repeats or
    (without positions) is missing, or the slice spacing is not uniform.
    """
    source = Path(source)
    _require_nonempty(source)
    found, left_out = find_series(source)
    if not found:
        reason = f"; first file left out: {left_out[0][0].name}: {left_out[0][1]}" \
            if left_out else ""
        raise ImageReadError(source, "no DICOM series found" + (
            " (empty folder)" if not left_out else reason))
    chosen = select_series(source, found, series)
    datasets = [(p, dicom_read.read_dataset(p, pixels=False)) for p in chosen.files]
    if not any(tag in datasets[0][1] for tag in dicom_read.PIXEL_TAGS):
        raise ImageReadError(source, f"series {chosen.uid} '{chosen.description}' has no "
                                     f"pixel data ({chosen.files[0].name} is not an image)")
    if len(datasets) == 1:
        return read_dicom_file(datasets[0][0], values=values)
    shapes = {(int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0))
              for _, ds in datasets}
    if len(shapes) > 1:
        raise ImageReadError(source, f"slices of different sizes {sorted(shapes)} in series "
                                     f"{chosen.uid}")
    frames = [int(ds.get("NumberOfFrames", 1) or 1) for _, ds in datasets]
    if max(frames) > 1:
        raise ImageReadError(source, f"series {chosen.uid} mixes {len(datasets)} files, some "
                                     "multi-frame; expected one multi-frame file or "
                                     "single-frame slices")
    rows, cols = shapes.pop()
    bits = max(1, int(datasets[0][1].get("BitsAllocated", 16) or 16) // 8)
    check_declared_size(source, (rows, cols, len(datasets)), bits, what="DICOM series")
    datasets = order_slices(source, chosen.uid, datasets)
    planes = []
    for path, _ in datasets:
        ds = dicom_read.read_dataset(path)
        plane, _ = dicom_read.decode_dataset(path, ds, values=values, max_voxels=MAX_VOXELS,
                                             max_bytes=MAX_BYTES)
        planes.append(plane)
    return np.stack(planes, axis=2)


def _sniff(path: Path) -> str:
    """Return the format of ``path`` from its first bytes (and, for nibabel's, its name)."""
    with path.open("rb") as handle:
        head = handle.read(544)
    if head.startswith(_PNG_SIGNATURE):
        return "png"
    if head.startswith(_JPEG_SIGNATURE):
        return "jpeg"
    if len(head) >= 132 and head[128:132] == b"DICM":
        return "dicom"
    body = head
    if head.startswith(b"\x1f\x8b"):
        try:
            with gzip.open(path, "rb") as handle:
                body = handle.read(544)
        except (OSError, EOFError, zlib.error):
            body = b""
    if body[344:348] == b"n+1\0" or body[4:8] == b"n+2\0":
        return "nifti"
    if body[344:348] == b"ni1\0" or body[4:8] == b"ni2\0":
        return "nibabel"  # a NIfTI pair: header here, data in the .img next to it
    name = path.name.lower()
    if name.endswith(".nii") or name.endswith(".nii.gz"):
        return "nifti"  # damaged: let the NIfTI reader say what is wrong
    if name.endswith(_NIBABEL_SUFFIXES):
        return "nibabel"
    if dicom_read.is_dicom(path) or name.endswith(".dcm"):
        return "dicom"
    if name.endswith(".png"):
        return "png"
    return "unknown"


def read_image(path: str | Path, *, series: str | None = None,
               values: ValuesMode = "modality") -> np.ndarray:
    """Decode any supported image, recognised by its content rather than its name.

    Parameters
    ----------
    path : str or pathlib.Path
        A file (DICOM of any name, NIfTI, PNG, JPEG, a format nibabel opens), a DICOMDIR,
        or a folder of DICOM files.
    series : str, optional
        For a folder or DICOMDIR: the ``SeriesInstanceUID`` or ``SeriesDescription`` to
        read; default the largest series (logged).
    values : {"modality", "display"}
        DICOM only: modality units, or the VOI window mapped to [0, 1].

    Raises
    ------
    ImageReadError
        If the file cannot be decoded, or is none of the supported formats.
    """
    path = Path(path)
    if path.is_dir():
        return read_dicom_series(path, series=series, values=values)
    _require_nonempty(path)
    kind = _sniff(path)
    if kind == "dicom":
        if not dicom_read.is_dicom(path):
            raise ImageReadError(path, "not a DICOM file: no 'DICM' after the 128-byte "
                                       "preamble and no leading DICOM element")
        ds = dicom_read.read_dataset(path)
        if "DirectoryRecordSequence" in ds:
            return read_dicom_series(path, series=series, values=values)
        array, positions = dicom_read.decode_dataset(path, ds, values=values,
                                                     max_voxels=MAX_VOXELS, max_bytes=MAX_BYTES)
        return dicom_read.order_frames(path, array, positions)
    if kind == "nifti":
        return read_nifti(path)
    if kind == "nibabel":
        return _read_other_nibabel(path)
    if kind in ("png", "jpeg"):
        return _read_pil(path, kind)
    raise ImageReadError(path, f"unsupported image type; {_EXPECTED}")


def _read_pil(path: Path, kind: str) -> np.ndarray:
    signature = _PNG_SIGNATURE if kind == "png" else _JPEG_SIGNATURE
    with path.open("rb") as handle:
        head = handle.read(len(signature))
    if head != signature:
        shown = "8-byte PNG signature (\\x89PNG\\r\\n\\x1a\\n) a .png" if kind == "png" \
            else "JPEG start-of-image marker (\\xff\\xd8\\xff) a .jpg"
        raise ImageReadError(path, f"not a {kind.upper()} file: it lacks the {shown} file "
                                   "starts with")
    try:
        with Image.open(path) as img:  # reads the header only
            width, height, bands = img.width, img.height, len(img.getbands())
            itemsize = 2 if img.mode in ("I;16", "I;16B", "I;16L") else (
                4 if img.mode in ("I", "F") else 1)
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise ImageReadError(path, f"unreadable {kind.upper()} ({type(err).__name__}: "
                                   f"{first_line(err)})") from err
    shape = (height, width) + ((bands,) if bands > 1 else ())
    check_declared_size(path, shape, itemsize, what=kind.upper())
    loader = LoadImage(image_only=True, dtype=np.float32)
    try:
        # Only PIL is tried: other readers would report a PNG's fault as theirs (DICOM...).
        return np.asarray(loader(str(path), reader=PILReader(reverse_indexing=False)))
    except (OSError, ValueError, RuntimeError, MemoryError, Image.DecompressionBombError,
            SyntaxError) as err:
        raise ImageReadError(path, f"unreadable {kind.upper()} ({type(err).__name__}: "
                                   f"{first_line(err)})") from err
