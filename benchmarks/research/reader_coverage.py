"""Which real test images the site reader reads, and why it refuses the others.

Walks every file with pixel data that pydicom (``pydicom.data``), the pydicom-data
package and nibabel (``nibabel/tests/data``, ``nibabel/nicom/tests/data``) ship, plus
each DICOMDIR they ship (followed to its series), and tries
:func:`fedbn_med.tasks.imaging.readers.read_image` on it. Prints one markdown row per
file (file | read/refused | shape or reason) and the counts; writes ``table.md`` and
``table.csv`` under ``benchmarks/results/reader_coverage/`` unless ``--out -``.

A file that raises anything but ``ImageReadError`` is counted as ``crashed``: the reader
must read or refuse, never fail otherwise. A refusal whose message spans lines counts as
``crashed`` too.

With ``--quick`` only the first three files of each source (sorted by path) and the
first three series of each DICOMDIR are tried: a check that the walk and the reader work, in
seconds, not the coverage figure.

    python benchmarks/research/reader_coverage.py [--quick] [--only pydicom|pydicom-data|nibabel]
                                         [--out DIR]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import io
import logging
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "reader_coverage"
_PIXEL_TAGS = ("PixelData", "FloatPixelData", "DoubleFloatPixelData")
#: --quick: files per source (a DICOMDIR source counts apart) and series per DICOMDIR.
QUICK = 3


def _dicom_with_pixels(path: Path) -> bool | None:
    """True/False for a DICOM with/without pixel data; None when not DICOM at all."""
    import pydicom

    try:
        ds = pydicom.dcmread(path, force=True, defer_size=1024)
    except Exception:  # noqa: BLE001 - any failure means "not a DICOM we can list"
        return None
    if "SOPClassUID" not in ds and "TransferSyntaxUID" not in getattr(ds, "file_meta", {}):
        return None
    return any(tag in ds for tag in _PIXEL_TAGS)


def _is_dicomdir(path: Path) -> bool:
    import pydicom

    try:
        ds = pydicom.dcmread(path, force=True, stop_before_pixels=True)
    except Exception:  # noqa: BLE001
        return False
    return "DirectoryRecordSequence" in ds


def _nibabel_image(path: Path) -> bool:
    import nibabel as nib

    try:
        image = nib.load(str(path))
    except Exception:  # noqa: BLE001 - not an image nibabel opens
        return False
    return hasattr(image, "dataobj") and len(image.shape) > 0


def collect(per_source: int | None = None) -> list[tuple[str, Path]]:
    """Return (source, path) for every shipped image file with pixel data, and DICOMDIRs.

    Parameters
    ----------
    per_source : int, optional
        Keep only the first files of each source (``pydicom DICOMDIR`` is a source of
        its own), in path order; None keeps every file.
    """
    import nibabel
    from pydicom.data import get_testdata_files

    out: list[tuple[str, Path]] = []
    found: Counter[str] = Counter()

    def full(source: str) -> bool:
        return per_source is not None and found[source] >= per_source

    def keep(source: str, path: Path) -> None:
        out.append((source, path))
        found[source] += 1

    for name in sorted(get_testdata_files()):
        path = Path(name)
        source = "pydicom-data" if "data_store" in path.parts else "pydicom"
        if not path.is_file() or (full(source) and full(f"{source} DICOMDIR")):
            continue
        if _is_dicomdir(path):
            if not full(f"{source} DICOMDIR"):
                keep(f"{source} DICOMDIR", path)
        elif not full(source) and _dicom_with_pixels(path):
            keep(source, path)
    root = Path(nibabel.__file__).parent
    for folder in (root / "tests" / "data", root / "nicom" / "tests" / "data"):
        for path in sorted(folder.iterdir()):
            if full("nibabel"):
                break
            if not path.is_file() or path.suffix in (".py", ".m", ".rst", ".pyc"):
                continue
            if path.suffix.lower() == ".dcm" or _dicom_with_pixels(path):
                if _dicom_with_pixels(path):
                    keep("nibabel", path)
            elif _nibabel_image(path):
                keep("nibabel", path)
    return out


def _label(path: Path) -> str:
    parts = path.parts
    for anchor in ("test_files", "data_store", "data"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[i + 1:])
    return path.name


def try_read(path: Path) -> tuple[str, str]:
    """Return ("read", shape) or ("refused", reason) or ("crashed", error)."""
    from fedbn_med.tasks.imaging.readers import ImageReadError, read_image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = read_image(path)
    except ImageReadError as err:
        if "\n" in err.reason:
            return "crashed", "multi-line refusal: " + err.reason.replace("\n", " | ")[:160]
        return "refused", err.reason
    except Exception as err:  # noqa: BLE001 - counted, not hidden
        first = str(err).splitlines()[0][:160] if str(err) else ""
        return "crashed", f"{type(err).__name__}: {first}"
    return "read", "x".join(str(n) for n in getattr(data, "shape", ()))


def _series_of(path: Path) -> list[tuple[str, int]]:
    """Return (SeriesInstanceUID, files) of each series a DICOMDIR lists; [] if unreadable."""
    from fedbn_med.tasks.imaging.dicom_read import ImageReadError
    from fedbn_med.tasks.imaging.dicom_series import find_series

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            series, _ = find_series(path)
    except (ImageReadError, AttributeError):  # AttributeError: the reader before DICOMDIRs
        return []
    return [(s.uid, len(s.files)) for s in series]


def try_series(path: Path, uid: str) -> tuple[str, str]:
    """Read one series of a DICOMDIR by its UID; same outcomes as :func:`try_read`."""
    from fedbn_med.tasks.imaging.readers import ImageReadError, read_image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = read_image(path, series=uid)
    except ImageReadError as err:
        return "refused", err.reason
    except Exception as err:  # noqa: BLE001
        return "crashed", f"{type(err).__name__}: {err}"
    return "read", "x".join(str(n) for n in data.shape)


def main(argv: list[str] | None = None) -> None:
    """Walk the files, try the reader, print the table and the counts."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help=f"the first {QUICK} files of each source and series of each DICOMDIR")
    p.add_argument("--only", choices=("pydicom", "pydicom-data", "nibabel"),
                   help="one source only")
    p.add_argument("--out", default=str(RESULTS),
                   help="folder for table.md/table.csv; '-' writes nothing")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    limit = QUICK if args.quick else None
    files = [(s, f) for s, f in collect(limit)
             if args.only is None or s.split()[0] == args.only]
    rows = []
    start = time.perf_counter()
    for source, path in files:
        outcome, detail = try_read(path)
        rows.append((source, _label(path), outcome, detail))
        if source.endswith("DICOMDIR"):
            rows.extend((f"{source} series", f"{_label(path)} -> {uid[-12:]} ({n} files)",
                         *try_series(path, uid)) for uid, n in _series_of(path)[:limit])
    counts = Counter(r[2] for r in rows)
    lines = ["| source | file | outcome | shape or reason |", "|---|---|---|---|"]
    lines += [f"| {s} | {f} | {o} | {d.replace('|', '/')} |" for s, f, o, d in rows]
    per_source = Counter((r[0], r[2]) for r in rows)
    summary = [f"{len(rows)} files: " + ", ".join(f"{counts[k]} {k}" for k in
                                                   ("read", "refused", "crashed")),
               *(f"  {src}: " + ", ".join(f"{per_source[(src, k)]} {k}" for k in
                                          ("read", "refused", "crashed"))
                 for src in sorted({r[0] for r in rows})),
               f"({time.perf_counter() - start:.1f} s)"]
    text = "\n".join(lines + [""] + summary)
    print(text)
    if args.out != "-":
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(text + "\n", encoding="utf-8")
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["source", "file", "outcome", "detail"])
        writer.writerows(rows)
        (out / "table.csv").write_text(buffer.getvalue(), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
