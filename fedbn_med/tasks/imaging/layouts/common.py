"""What the layout converters share: the datalist type, label policies, the writer."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pandas as pd

__all__ = ["CHEXPERT_FINDINGS", "Datalists", "UncertainPolicy", "binary_label",
           "read_table", "require_columns", "write_datalists"]

#: Per site: {"training": [...], "validation": [...], "test": [...]}.
Datalists = dict[str, dict[str, list[dict[str, Any]]]]
UncertainPolicy = Literal["zeros", "ones", "ignore"]

#: The 14 observations of the CheXpert labeller (CheXpert and MIMIC-CXR-JPG columns).
CHEXPERT_FINDINGS = (
    "No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity",
    "Lung Lesion", "Edema", "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax",
    "Pleural Effusion", "Pleural Other", "Fracture", "Support Devices")


def read_table(path: Path, what: str) -> pd.DataFrame:
    """Read a CSV (plain or ``.gz``); a missing file names what was expected."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; expected {what}.")
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def require_columns(table: pd.DataFrame, path: Path, columns: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the file and the missing columns."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{path} lacks column(s) {', '.join(missing)}; it has "
                         f"{', '.join(map(str, table.columns[:20]))}.")


def binary_label(value: str, policy: UncertainPolicy, *, where: str) -> int | None:
    """Map a CheXpert-labeller value to 1/0; None drops the item (``ignore``).

    ``1``: positive; ``0`` and blank (not mentioned): negative; ``-1``: uncertain, mapped
    by ``policy`` (U-Zeros, U-Ones, or U-Ignore, which leaves the image out).
    """
    text = str(value).strip()
    if text in ("", "nan"):
        return 0
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{where}: label value {value!r}; expected 1, 0, -1 or blank.") from None
    if math.isclose(number, 1.0):
        return 1
    if math.isclose(number, 0.0):
        return 0
    if math.isclose(number, -1.0):
        return {"zeros": 0, "ones": 1, "ignore": None}[policy]
    raise ValueError(f"{where}: label value {value!r}; expected 1, 0, -1 or blank.")


def check_finding(finding: str, valid: Sequence[str], source: str) -> None:
    """Raise ``ValueError`` listing the valid findings of ``source``."""
    if finding not in valid:
        raise ValueError(f"Unknown finding {finding!r} for {source}. Valid findings: "
                         f"{', '.join(valid)}.")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "site"


def write_datalists(datalists: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
                    out: str | Path) -> dict[str, Path]:
    """Write one ``<out>/<site>.json`` per site (atomically); return each site's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for site, splits in sorted(datalists.items()):
        path = out / f"{_safe(site)}.json"
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        body = {split: list(items) for split, items in splits.items() if items or
                split == "training"}
        tmp.write_text(json.dumps(body, indent=1), encoding="utf-8")
        tmp.replace(path)
        written[site] = path
    return written
