"""A hospital's own DICOM export: every series of a folder or DICOMDIR, one datalist item each.

Items read ``{"image": <folder or DICOMDIR>, "image_series": <SeriesInstanceUID>,
"description": ..., "modality": ...}``: the reader then opens exactly that series.
Labels are the hospital's to add (a ``label`` per item, or a label image path).
"""

from __future__ import annotations

from pathlib import Path

from fedbn_med.tasks.imaging.dicom_series import DicomSeries, find_series
from fedbn_med.tasks.imaging.layouts.common import Datalists

__all__ = ["read"]


def read(root: Path, *, site: str = "PACS", modality: str | None = None,
         min_files: int = 1) -> Datalists:
    """Return one item per series found under ``root`` (a folder or a DICOMDIR).

    ``modality`` keeps only that ``Modality`` (``MR``, ``CT``, ``CR``...); ``min_files``
    leaves out smaller series (localisers). Files that are not DICOM are ignored.
    """
    series, _ = find_series(root)
    # A series alone in its folder is named by that folder, so reading it walks only it.
    uids_in: dict[Path, set[str]] = {}
    for s in series:
        for f in s.files:
            uids_in.setdefault(f.parent, set()).add(s.uid)

    def where(s: DicomSeries) -> Path:
        parents = {f.parent for f in s.files}
        alone = len(parents) == 1 and uids_in[next(iter(parents))] == {s.uid}
        return next(iter(parents)) if alone and root.is_dir() else root

    items = [{"image": str(where(s).absolute()), "image_series": s.uid,
              "description": s.description, "modality": s.modality, "files": len(s.files)}
             for s in series if len(s.files) >= min_files
             and (modality is None or s.modality == modality)]
    if not items:
        raise ValueError(f"{root}: no DICOM series{f' of modality {modality}' if modality else ''}"
                         f" with at least {min_files} file(s).")
    return {site: {"training": items, "validation": [], "test": []}}
