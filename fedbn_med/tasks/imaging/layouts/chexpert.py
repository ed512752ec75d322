"""CheXpert as Stanford distributes it: ``train.csv``, ``valid.csv`` and the JPEG tree.

``Path`` in the CSVs reads ``CheXpert-v1.0[-small]/train/patientNNNNN/studyN/viewN_frontal.jpg``,
relative to the folder holding the dataset folder. CheXpert comes from one hospital and
has no site field; ``site_field`` splits by another column (``Sex``, ``AP/PA``) if wanted.
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

_VIEWS = ("frontal", "lateral", "all")


def _image_path(root: Path, relative: str) -> Path:
    """Resolve ``Path``: from the folder above the dataset, else from the dataset itself."""
    for base in (root.parent, root):
        candidate = base / relative
        if candidate.is_file():
            return candidate
    return root / Path(*Path(relative).parts[1:])


def read(root: Path, *, finding: str = "Pleural Effusion", uncertain: UncertainPolicy = "zeros",
         view: str = "frontal", site_field: str | None = None) -> Datalists:
    """Return CheXpert's ``train.csv`` as training and ``valid.csv`` as validation items.

    Parameters
    ----------
    root : pathlib.Path
        The dataset folder (``CheXpert-v1.0-small``), holding the two CSVs.
    finding : str
        The observation that becomes the binary ``label`` (one of the 14).
    uncertain : {"zeros", "ones", "ignore"}
        Policy for ``-1`` (uncertain) labels: U-Zeros, U-Ones, or leave the image out.
    view : {"frontal", "lateral", "all"}
        Which radiographs to keep (``Frontal/Lateral`` column).
    site_field : str, optional
        A column to split into sites; default one site, ``CheXpert``.
    """
    check_finding(finding, CHEXPERT_FINDINGS, "CheXpert")
    if view not in _VIEWS:
        raise ValueError(f"Unknown view {view!r}. Valid views: {', '.join(_VIEWS)}.")
    out: Datalists = {}
    for split, name in (("training", "train.csv"), ("validation", "valid.csv")):
        path = root / name
        if split == "validation" and not path.is_file():
            continue
        table = read_table(path, "CheXpert's CSV (Path, Sex, Age, Frontal/Lateral, AP/PA, "
                                 "14 findings)")
        require_columns(table, path, ["Path", "Frontal/Lateral", finding,
                                      *([site_field] if site_field else [])])
        for row_no, row in enumerate(table.to_dict("records"), start=2):
            if view != "all" and row["Frontal/Lateral"].strip().lower() != view:
                continue
            label = binary_label(row[finding], uncertain, where=f"{path} line {row_no}")
            if label is None:
                continue
            item: dict[str, Any] = {"image": str(_image_path(root, row["Path"])),
                                    "label": label, "view": row.get("AP/PA", "")}
            site = str(row[site_field]) if site_field else "CheXpert"
            out.setdefault(site, {"training": [], "validation": [], "test": []})
            out[site][split].append(item)
    return out
