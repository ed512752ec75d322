"""Read a site's images: NIfTI (MONAI ``LoadImage``), DICOM (pydicom, strict), PNG, datalists.

A file that cannot be read raises :class:`ImageReadError` naming the file and the reason;
:func:`decode_items` turns each such error into one warning line and keeps the rest of
the site's data. Corruption is caught where the libraries would hide it: nibabel reads
only the header on open (the data are decoded here, so a truncated file fails now, not in
round 7), pydicom runs in ``RAISE`` validation mode, and a DICOM series is checked for
missing slices and uneven spacing rather than stacked from whatever slices were readable.
"""

from __future__ import annotations

import json
import logging
import math
import zlib
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pydicom
from monai.config import KeysCollection
from monai.data import load_decathlon_datalist
from monai.data.image_reader import NibabelReader, PILReader
from monai.transforms import LoadImage, MapTransform
from nibabel.filebasedimages import ImageFileError
from PIL import Image
from pydicom.errors import InvalidDicomError

from fedbn_med.tasks.imaging.dicom_io import strict_reading

__all__ = [
    "MAX_VOXELS",
    "SPLIT_KEYS",
    "ImageReadError",
    "ReadImaged",
    "decode_items",
    "load_datalist",
    "read_dicom_file",
    "read_dicom_series",
    "read_image",
    "read_nifti",
]

logger = logging.getLogger(__name__)
# MONAI's optional GPU decoder plugin logs a warning on every pydicom decode when it is
# absent; the fallback (pydicom's own decoders) is what we want, so keep that quiet.
logging.getLogger("monai.data.nvimgcodec_pydicom_plugin").setLevel(logging.ERROR)

SPLIT_KEYS = ("training", "validation", "test")
_NIFTI = (".nii", ".nii.gz")
_SPACING_TOL = 0.01  # relative tolerance on the distance between neighbouring slices
# Largest image decoded (2**28 voxels: 1 GiB as float32), checked from the header before
# anything is allocated; far above one MRI volume or radiograph, far below a host's memory.
MAX_VOXELS = 2**28
# Deflate expands at most about 1032:1, so a .nii.gz of n bytes cannot hold more than this.
_DEFLATE_RATIO = 1032
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class ImageReadError(ValueError):
    """Raised when an image file or DICOM series cannot be used; says which and why."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


def _require_nonempty(path: Path) -> None:
    if not path.exists():
        raise ImageReadError(path, "file not found")
    if path.is_file() and path.stat().st_size == 0:
        raise ImageReadError(path, "empty file (0 bytes)")


def _check_nifti_size(path: Path, max_voxels: int) -> None:
    """Refuse a header that declares more voxels than the bound or than the file can hold."""
    try:
        header = nib.load(str(path)).header  # nibabel reads only the header here
        shape = tuple(int(n) for n in header.get_data_shape())
        dtype = header.get_data_dtype()
        offset = int(header.get_data_offset())
    except (ImageFileError, OSError, EOFError, zlib.error, ValueError, TypeError) as err:
        raise ImageReadError(path, f"unreadable NIfTI header ({type(err).__name__}: "
                                   f"{_first_line(err)})") from err
    n_voxels = math.prod(shape)
    if not shape or min(shape) <= 0:
        raise ImageReadError(path, f"unreadable NIfTI: the header declares shape {shape}; "
                                   "expected positive dimensions")
    if n_voxels > max_voxels:
        raise ImageReadError(path, f"NIfTI too large: the header declares shape {shape} "
                                   f"({n_voxels:,} voxels); at most {max_voxels:,} are read")
    size = path.stat().st_size
    capacity = size * _DEFLATE_RATIO if path.name.lower().endswith(".gz") else size
    needed = offset + n_voxels * dtype.itemsize
    if needed > capacity:
        raise ImageReadError(path, f"unreadable NIfTI: the header declares shape {shape} of "
                                   f"{dtype} ({needed:,} bytes) but a {size:,}-byte file holds "
                                   f"at most {capacity:,}; truncated file or forged header")


def read_nifti(path: str | Path, *, max_voxels: int = MAX_VOXELS) -> np.ndarray:
    """Decode a ``.nii`` or ``.nii.gz`` file fully with MONAI ``LoadImage`` (nibabel).

    The header is checked first: a shape above ``max_voxels``, or one that needs more
    bytes than the file can hold, is refused before any array is allocated.
    """
    path = Path(path)
    _require_nonempty(path)
    _check_nifti_size(path, max_voxels)
    loader = LoadImage(image_only=True, dtype=np.float32)
    try:
        # A reader given per call is the only one tried (no fallback to other formats).
        data = np.asarray(loader(str(path), reader=NibabelReader()))
    except (OSError, EOFError, zlib.error, ValueError, RuntimeError, MemoryError) as err:
        raise ImageReadError(path, f"unreadable NIfTI ({type(err).__name__}: "
                                   f"{_first_line(err)})") from err
    if not np.isfinite(data).all():
        raise ImageReadError(path, "NIfTI data contain NaN or Inf")
    return data


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[-1][:200] if text else "no message"


def _dcmread(path: Path) -> pydicom.Dataset:
    _require_nonempty(path)
    try:
        with strict_reading():
            ds = pydicom.dcmread(path)
            _check_dicom_size(path, ds)
            ds.pixel_array  # noqa: B018 - decode now so a truncated file fails here
    except InvalidDicomError as err:
        raise ImageReadError(path, f"not a DICOM file ({_first_line(err)})") from err
    except (OSError, EOFError, ValueError, AttributeError, KeyError, TypeError,
            MemoryError) as err:
        raise ImageReadError(path, f"invalid or truncated DICOM ({type(err).__name__}: "
                                   f"{_first_line(err)})") from err
    return ds


def _check_dicom_size(path: Path, ds: pydicom.Dataset) -> None:
    """Refuse, before decoding, pixel data whose declared size exceeds :data:`MAX_VOXELS`."""
    dims = (int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0),
            int(ds.get("NumberOfFrames", 1) or 1), int(ds.get("SamplesPerPixel", 1) or 1))
    if math.prod(dims) > MAX_VOXELS:
        raise ImageReadError(path, f"DICOM too large: Rows x Columns x frames x samples "
                                   f"{' x '.join(map(str, dims))} exceeds {MAX_VOXELS:,} voxels")


def _modality_values(ds: pydicom.Dataset) -> np.ndarray:
    pixels = ds.pixel_array.astype(np.float32)
    pixels = pixels * float(ds.get("RescaleSlope", 1) or 1) + float(
        ds.get("RescaleIntercept", 0) or 0)
    if ds.get("PhotometricInterpretation") == "MONOCHROME1":  # low values display bright
        pixels = pixels.max() + pixels.min() - pixels
    return pixels


def read_dicom_file(path: str | Path) -> np.ndarray:
    """Decode a single-frame DICOM image (rows, columns) in modality units.

    ``MONOCHROME1`` images are inverted so that bright always means high signal.
    """
    path = Path(path)
    ds = _dcmread(path)
    if int(ds.get("NumberOfFrames", 1) or 1) != 1:
        raise ImageReadError(path, "multi-frame DICOM is not supported; expected one frame")
    return _modality_values(ds)


def _slice_normal(ds: pydicom.Dataset) -> np.ndarray:
    orient = np.asarray([float(v) for v in ds.ImageOrientationPatient])
    return np.cross(orient[:3], orient[3:])


def read_dicom_series(folder: str | Path) -> np.ndarray:
    """Assemble a DICOM series folder into a volume (rows, columns, slices).

    Slices are ordered by their position along the slice normal (``ImagePositionPatient``
    and ``ImageOrientationPatient``), else by ``InstanceNumber``. The series is refused,
    with the reason, when a file is unreadable, the files mix series or image sizes, an
    ``InstanceNumber`` is missing, or the slice spacing is not uniform.
    """
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ImageReadError(folder, "empty DICOM series folder")
    slices = [(p, _dcmread(p)) for p in files]
    series = {str(ds.get("SeriesInstanceUID", "")) for _, ds in slices}
    if len(series) > 1:
        raise ImageReadError(folder, f"files of {len(series)} different series in one folder")
    shapes = {(int(ds.Rows), int(ds.Columns)) for _, ds in slices}
    if len(shapes) > 1:
        raise ImageReadError(folder, f"slices of different sizes {sorted(shapes)}")
    if all("ImagePositionPatient" in ds and "ImageOrientationPatient" in ds for _, ds in slices):
        normal = _slice_normal(slices[0][1])
        slices.sort(key=lambda s: float(np.dot(normal, [float(v) for v in
                                                         s[1].ImagePositionPatient])))
        positions = np.array([np.dot(normal, [float(v) for v in ds.ImagePositionPatient])
                              for _, ds in slices])
    else:
        slices.sort(key=lambda s: int(s[1].get("InstanceNumber", 0) or 0))
        positions = None
    _check_instances(folder, [ds for _, ds in slices])
    if positions is not None and len(positions) > 2:
        _check_spacing(folder, positions, [p for p, _ in slices])
    return np.stack([_modality_values(ds) for _, ds in slices], axis=-1)


def _check_instances(folder: Path, datasets: Sequence[pydicom.Dataset]) -> None:
    numbers = sorted(int(ds.InstanceNumber) for ds in datasets if "InstanceNumber" in ds)
    if len(numbers) < len(datasets):
        return  # no usable numbering; positions decide
    if len(set(numbers)) < len(numbers):
        raise ImageReadError(folder, "duplicate InstanceNumber in series")
    missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise ImageReadError(folder, f"missing slice(s): InstanceNumber {shown} absent "
                                     f"from {numbers[0]}..{numbers[-1]}")


def _check_spacing(folder: Path, positions: np.ndarray, files: Sequence[Path]) -> None:
    gaps = np.diff(positions)
    step = float(np.median(gaps))
    if step <= 0:
        raise ImageReadError(folder, "slices share the same position")
    bad = np.flatnonzero(np.abs(gaps - step) > _SPACING_TOL * step)
    if bad.size:
        k = int(bad[0])
        kind = "missing slice" if gaps[k] > 1.5 * step else "inconsistent slice spacing"
        raise ImageReadError(folder, f"{kind}: {gaps[k]:.3g} mm between {files[k].name} and "
                                     f"{files[k + 1].name}, expected {step:.3g} mm")


def read_image(path: str | Path) -> np.ndarray:
    """Decode any supported image by its name: NIfTI, DICOM file, DICOM series folder, PNG.

    Raises
    ------
    ImageReadError
        If the file cannot be decoded, or its type is not one of ``.nii``, ``.nii.gz``,
        ``.dcm``, ``.png`` or a folder holding one DICOM series.
    """
    path = Path(path)
    name = path.name.lower()
    if path.is_dir():
        return read_dicom_series(path)
    if name.endswith(_NIFTI):
        return read_nifti(path)
    if name.endswith(".dcm"):
        return read_dicom_file(path)
    if name.endswith(".png"):
        return _read_png(path)
    _require_nonempty(path)
    raise ImageReadError(path, "unsupported image type; expected .nii, .nii.gz, .dcm, .png "
                               "or a DICOM series folder")


def _read_png(path: Path) -> np.ndarray:
    _require_nonempty(path)
    with path.open("rb") as handle:
        signature = handle.read(len(_PNG_SIGNATURE))
    if signature != _PNG_SIGNATURE:
        raise ImageReadError(path, "not a PNG file: it lacks the 8-byte PNG signature "
                                   "(\\x89PNG\\r\\n\\x1a\\n) a .png file starts with")
    loader = LoadImage(image_only=True, dtype=np.float32)
    try:
        # Only PIL is tried: other readers would report a PNG's fault as theirs (DICOM...).
        return np.asarray(loader(str(path), reader=PILReader(reverse_indexing=False)))
    except (OSError, ValueError, RuntimeError, MemoryError, Image.DecompressionBombError) as err:
        raise ImageReadError(path, f"unreadable PNG ({type(err).__name__}: "
                                   f"{_first_line(err)})") from err


def load_datalist(path: str | Path, *, split_seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Load a MONAI-style JSON datalist into ``{"training", "validation", "test"}`` items.

    Relative paths in ``image``/``label`` are resolved from the datalist's folder. A
    datalist with only ``training`` is split 60/20/20 by ``split_seed``.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Datalist {path} does not exist. Expected a MONAI-style JSON file "
                         'such as {"training": [{"image": "a.nii.gz", "label": ...}]}.')
    try:
        keys = set(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"Datalist {path} is not a JSON object: {err}.") from err
    if "training" not in keys:
        raise ValueError(f"Datalist {path} has keys {sorted(keys)}; expected 'training' and "
                         f"optionally 'validation' and 'test'.")
    out = {key: load_decathlon_datalist(str(path), data_list_key=key, base_dir=path.parent)
           for key in SPLIT_KEYS if key in keys}
    if set(out) == {"training"}:
        items = out["training"]
        order = np.random.default_rng(split_seed).permutation(len(items))
        n_eval = max(1, len(items) // 5)
        out = {"validation": [items[i] for i in order[:n_eval]],
               "test": [items[i] for i in order[n_eval:2 * n_eval]],
               "training": [items[i] for i in order[2 * n_eval:]]}
    for key in SPLIT_KEYS:
        out.setdefault(key, [])
    return out


def decode_items(items: Iterable[Mapping[str, Any]], keys: Sequence[str], site: str = "",
                 *, decode: bool = True) -> list[dict[str, Any]]:
    """Decode the image files named under ``keys`` in each item; skip unreadable items.

    Each skipped item costs one warning naming the file and the reason. The others are
    returned with ``keys`` holding arrays (a leading channel axis added), or, with
    ``decode=False``, unchanged (the files were read only to check them).
    """
    usable = []
    for item in items:
        try:
            decoded = ReadImaged(keys)(dict(item))
        except ImageReadError as err:
            logger.warning("Site %s: skipping %s: %s", site or "?", err.path, err.reason)
            continue
        usable.append(decoded if decode else dict(item))
    return usable


class ReadImaged(MapTransform):
    """MONAI dictionary transform: replace file paths under ``keys`` by decoded arrays.

    Adds a leading channel axis, as ``EnsureChannelFirstd`` would; use it as the first
    transform of a chain so that :class:`monai.data.CacheDataset` keeps its output.
    """

    def __init__(self, keys: KeysCollection, allow_missing_keys: bool = False) -> None:
        super().__init__(keys, allow_missing_keys)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        """Decode every key's file."""
        out = dict(data)
        for key in self.key_iterator(out):
            value = out[key]
            if isinstance(value, (str, Path)):
                out[key] = read_image(value)[None]
        return out
