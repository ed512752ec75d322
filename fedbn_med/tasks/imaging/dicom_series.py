"""DICOM series of a folder or a DICOMDIR: find them, choose one, order its slices.

A PACS export holds several series (a localiser, the scan, a reformat) in one folder, or
lists them in a ``DICOMDIR``. :func:`find_series` groups the files by
``SeriesInstanceUID``; :func:`select_series` picks one by UID or description, else the
largest; :func:`order_slices` puts its slices in order and refuses a stack that is not
one (several orientations, repeated or missing instance numbers, uneven spacing).
Decoding the pixels is :mod:`.dicom_read`'s work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedbn_med.tasks.imaging.dicom_io import strict_reading
from fedbn_med.tasks.imaging.dicom_read import (
    ImageReadError,
    check_spacing,
    first_line,
    is_dicom,
    read_dataset,
    sop_name,
)

__all__ = ["DicomSeries", "find_series", "order_slices", "select_series"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DicomSeries:
    """The files of one series found in a folder or a DICOMDIR.

    Attributes
    ----------
    uid : str
        ``SeriesInstanceUID``.
    description : str
        ``SeriesDescription`` (may be empty).
    modality : str
        ``Modality``.
    files : tuple of pathlib.Path
        The series' files, in name order.
    """

    uid: str
    description: str
    modality: str
    files: tuple[Path, ...]


def find_series(source: Path) -> tuple[list[DicomSeries], list[tuple[Path, str]]]:
    """Group the DICOM files of a folder, or those a DICOMDIR lists, by series.

    A folder holding a ``DICOMDIR`` is read through it. Returns the series (largest
    first) and the files left out with the reason (not DICOM, unreadable, no pixels).
    """
    if source.is_dir() and (source / "DICOMDIR").is_file():
        source = source / "DICOMDIR"
    if source.is_file():
        files = _dicomdir_files(source)
    else:
        files = sorted(p for p in source.rglob("*") if p.is_file()
                       and not p.name.startswith("."))
    groups: dict[str, list[Path]] = {}
    info: dict[str, tuple[str, str]] = {}
    left_out: list[tuple[Path, str]] = []
    for path in files:
        if not is_dicom(path):
            left_out.append((path, "not a DICOM file"))
            continue
        try:
            ds = read_dataset(path, pixels=False)
        except ImageReadError as err:
            left_out.append((path, err.reason))
            continue
        if "DirectoryRecordSequence" in ds:
            continue  # the DICOMDIR itself, met while walking a folder
        uid = str(ds.get("SeriesInstanceUID", "") or "")
        groups.setdefault(uid, []).append(path)
        info.setdefault(uid, (str(ds.get("SeriesDescription", "") or ""),
                              str(ds.get("Modality", "") or "")))
    series = [DicomSeries(uid, *info[uid], tuple(sorted(paths)))
              for uid, paths in groups.items()]
    series.sort(key=lambda s: (-len(s.files), s.uid))
    return series, left_out


def _dicomdir_files(path: Path) -> list[Path]:
    from pydicom.fileset import FileSet

    ds = read_dataset(path, pixels=False)
    if "DirectoryRecordSequence" not in ds:
        raise ImageReadError(path, "expected a DICOMDIR (a Directory Record Sequence); this is a "
                               f"{sop_name(ds)} file")
    try:
        with strict_reading():
            fileset = FileSet(ds)
    except (ValueError, KeyError, AttributeError, TypeError, OSError) as err:
        raise ImageReadError(path, f"unreadable DICOMDIR ({type(err).__name__}: "
                               f"{first_line(err)})") from err
    files = [Path(instance.path) for instance in fileset]
    if not files:
        raise ImageReadError(path, "the DICOMDIR lists no instances")
    return files


def select_series(source: Path, series: Sequence[DicomSeries], choice: str | None
                  ) -> DicomSeries:
    """Pick one series: by UID or description when given, else the largest (logged).

    Raises
    ------
    ImageReadError
        If there is no series, or ``choice`` matches none (the valid ones are listed).
    """
    if not series:
        raise ImageReadError(source, "no DICOM series found (no readable DICOM file)")
    if choice:
        match = [s for s in series if choice in (s.uid, s.description)]
        if len(match) != 1:
            listed = "; ".join(f"{s.uid} '{s.description}' ({len(s.files)} files)"
                               for s in series[:6])
            what = "no" if not match else f"{len(match)}"
            raise ImageReadError(source, f"{what} series match '{choice}' (by SeriesInstanceUID or "
                                     f"SeriesDescription); series here: {listed}")
        return match[0]
    chosen = series[0]
    if len(series) > 1:
        logger.info("%s: %d series; reading the largest, %s '%s' (%d files); name another "
                    "with the datalist's image_series (UID or description): %s", source,
                    len(series), chosen.uid, chosen.description, len(chosen.files),
                    ", ".join(f"{s.uid} '{s.description}' ({len(s.files)})"
                              for s in series[1:6]))
    return chosen


def _geometry(ds: Any) -> tuple[np.ndarray, float] | None:
    if "ImagePositionPatient" not in ds or "ImageOrientationPatient" not in ds:
        return None
    orient = np.asarray([float(v) for v in ds.ImageOrientationPatient])
    normal = np.cross(orient[:3], orient[3:])
    return orient, float(np.dot(normal, [float(v) for v in ds.ImagePositionPatient]))


def order_slices(source: Path, uid: str, datasets: list[tuple[Path, Any]]
                 ) -> list[tuple[Path, Any]]:
    """Order a series' single-frame slices along the slice normal, else by InstanceNumber.

    Refuses, naming the series, slices of several orientations (a localiser), a repeated
    ``InstanceNumber``, a numbering gap without positions to explain it, and non-uniform
    spacing along the normal.
    """
    geometry = [_geometry(ds) for _, ds in datasets]
    if all(g is not None for g in geometry):
        orients = {tuple(np.round(g[0], 3)) for g in geometry}  # type: ignore[index]
        if len(orients) > 1:
            raise ImageReadError(source, f"series {uid} holds slices of {len(orients)} "
                                         "orientations (a localiser?); expected one stack")
        order = sorted(range(len(datasets)), key=lambda i: geometry[i][1])  # type: ignore[index]
        datasets = [datasets[i] for i in order]
        positions = np.array([geometry[i][1] for i in order])  # type: ignore[index]
        _check_instances(source, [ds for _, ds in datasets], require_contiguous=False)
        check_spacing(source, positions, [p.name for p, _ in datasets])
    else:
        datasets.sort(key=lambda s: int(s[1].get("InstanceNumber", 0) or 0))
        _check_instances(source, [ds for _, ds in datasets], require_contiguous=True)
    return datasets


def _check_instances(folder: Path, datasets: Sequence[Any], *, require_contiguous: bool
                     ) -> None:
    numbers = sorted(int(ds.InstanceNumber) for ds in datasets
                     if ds.get("InstanceNumber") not in (None, ""))
    if len(numbers) < len(datasets):
        return  # no usable numbering; positions decide
    if len(set(numbers)) < len(numbers):
        raise ImageReadError(folder, "duplicate InstanceNumber in series")
    missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
    if missing and require_contiguous:  # with positions, the spacing check decides
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise ImageReadError(folder, f"missing slice(s): InstanceNumber {shown} absent "
                                     f"from {numbers[0]}..{numbers[-1]} and no slice "
                                     "positions to tell a gap from a renumbering")
