"""MIMIC-CXR-JPG: metadata, CheXpert-labeller and split CSVs, and ``files/pNN/p.../s.../*.jpg``.

Reads ``mimic-cxr-2.0.0-metadata.csv[.gz]`` (``dicom_id``, ``subject_id``, ``study_id``,
``ViewPosition``), ``mimic-cxr-2.0.0-chexpert.csv[.gz]`` (the 14 labeller columns per
study) and, when present, ``mimic-cxr-2.0.0-split.csv[.gz]`` (``train``/``validate``/
``test``). The set comes from one hospital (Beth Israel Deaconess) and has no site field;
``site_field`` splits by a metadata column if wanted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedbn_med.tasks.imaging.layouts.common import (
    CHEXPERT_FINDINGS,
    Datalists,
    UncertainPolicy,
    binary_label,
    check_finding,
    read_table,
    require_columns,
)

__all__ = ["read"]

_SPLITS = {"train": "training", "validate": "validation", "test": "test"}


def _csv(root: Path, stem: str) -> Path:
    for name in (f"{stem}.csv", f"{stem}.csv.gz"):
        if (root / name).is_file():
            return root / name
    return root / f"{stem}.csv.gz"


def read(root: Path, *, finding: str = "Pleural Effusion", uncertain: UncertainPolicy = "zeros",
         views: tuple[str, ...] = ("PA", "AP"), site_field: str | None = None) -> Datalists:
    """Return MIMIC-CXR-JPG images labelled by their study's CheXpert-labeller ``finding``.

    ``views`` keeps these ``ViewPosition`` values (empty: all). Images whose study has no
    labeller row, or whose JPEG is absent, are left out.
    """
    check_finding(finding, CHEXPERT_FINDINGS, "MIMIC-CXR-JPG")
    meta_path = _csv(root, "mimic-cxr-2.0.0-metadata")
    meta = read_table(meta_path, "MIMIC-CXR-JPG's metadata CSV")
    require_columns(meta, meta_path, ["dicom_id", "subject_id", "study_id", "ViewPosition",
                                      *([site_field] if site_field else [])])
    label_path = _csv(root, "mimic-cxr-2.0.0-chexpert")
    labels = read_table(label_path, "the CheXpert-labeller CSV of MIMIC-CXR-JPG")
    require_columns(labels, label_path, ["subject_id", "study_id", finding])
    by_study = {(r["subject_id"], r["study_id"]): r[finding] for r in labels.to_dict("records")}
    split_path = _csv(root, "mimic-cxr-2.0.0-split")
    split_of: dict[str, str] = {}
    if split_path.is_file():
        split_of = {r["dicom_id"]: r["split"] for r in read_table(split_path, "").to_dict(
            "records")}
    out: Datalists = {}
    for row in meta.to_dict("records"):
        if views and row["ViewPosition"] not in views:
            continue
        key = (row["subject_id"], row["study_id"])
        if key not in by_study:
            continue
        label = binary_label(by_study[key], uncertain, where=f"{label_path} study {key[1]}")
        subject = row["subject_id"]
        image = (root / "files" / f"p{subject[:2]}" / f"p{subject}" / f"s{row['study_id']}"
                 / f"{row['dicom_id']}.jpg")
        if label is None or not image.is_file():
            continue
        item: dict[str, Any] = {"image": str(image), "label": label,
                                "view": row["ViewPosition"]}
        site = str(row[site_field]) if site_field else "MIMIC-CXR"
        splits = out.setdefault(site, {"training": [], "validation": [], "test": []})
        splits[_SPLITS.get(split_of.get(row["dicom_id"], "train"), "training")].append(item)
    return out
