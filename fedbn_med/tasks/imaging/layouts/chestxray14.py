"""NIH ChestX-ray14: ``Data_Entry_2017.csv`` and the PNG files (``images*/``).

``Finding Labels`` lists findings joined by ``|`` (or ``No Finding``); the official
``train_val_list.txt`` / ``test_list.txt``, when present, give the training and test
images. The set comes from one hospital (NIH Clinical Center) and has no site field;
``site_field`` splits by a column (``View Position``, ``Patient Gender``) if wanted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedbn_med.tasks.imaging.layouts.common import (
    Datalists,
    check_finding,
    read_table,
    require_columns,
)

__all__ = ["NIH_FINDINGS", "read"]

NIH_FINDINGS = ("Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule",
                "Pneumonia", "Pneumothorax", "Consolidation", "Edema", "Emphysema",
                "Fibrosis", "Pleural_Thickening", "Hernia", "No Finding")


def read(root: Path, *, finding: str = "Effusion", site_field: str | None = None) -> Datalists:
    """Return ChestX-ray14's images with ``label`` 1 when ``finding`` is among their findings.

    Images named in the CSV but absent on disk are left out (a partial download); the
    official lists split training from test when present, else all is training.
    """
    check_finding(finding, NIH_FINDINGS, "NIH ChestX-ray14")
    path = root / "Data_Entry_2017.csv"
    table = read_table(path, "Data_Entry_2017.csv (Image Index, Finding Labels, Patient ID, "
                             "View Position, ...)")
    require_columns(table, path, ["Image Index", "Finding Labels",
                                  *([site_field] if site_field else [])])
    files = {p.name: p for p in root.rglob("*.png")}
    if not files:
        raise FileNotFoundError(f"{root} holds no PNG image; expected images*/NNNNNNNN_NNN.png "
                                "next to Data_Entry_2017.csv.")
    test_list = root / "test_list.txt"
    test = set(test_list.read_text().split()) if test_list.is_file() else set()
    out: Datalists = {}
    for row in table.to_dict("records"):
        image = files.get(row["Image Index"])
        if image is None:
            continue
        findings = {f.strip() for f in row["Finding Labels"].split("|")}
        item: dict[str, Any] = {"image": str(image), "label": int(finding in findings),
                                "view": row.get("View Position", "")}
        site = str(row[site_field]) if site_field else "ChestX-ray14"
        splits = out.setdefault(site, {"training": [], "validation": [], "test": []})
        splits["test" if row["Image Index"] in test else "training"].append(item)
    return out
