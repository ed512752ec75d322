"""FLamby's Fed-IXI: IXI T1 images with brain masks, one site per hospital.

The layout FLamby extracts (``IXI_sample/<subject>/T1/<subject>_image.nii.gz`` and
``IXI_sample/<subject>/label/<subject>_label.nii.gz``); the hospital is the second field
of the subject ID (``IXI002-Guys-0828``): Guys, HH (Hammersmith) or IOP. FLamby's
``metadata_tiny.csv`` (``Patient ID``, ``Split``), when given, sets train and test.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fedbn_med.tasks.imaging.layouts.common import Datalists, read_table, require_columns

__all__ = ["HOSPITALS", "read"]

HOSPITALS = ("Guys", "HH", "IOP")
_SUBJECT = re.compile(r"^IXI(?P<id>\d{3})-(?P<hospital>[A-Za-z]+)-\d+")


def _sample_dir(root: Path) -> Path:
    if root.name == "IXI_sample":
        return root
    found = sorted(root.rglob("IXI_sample"))
    if not found:
        raise FileNotFoundError(f"{root} holds no IXI_sample folder; expected FLamby's "
                                "Fed-IXI layout IXI_sample/IXI002-Guys-0828/T1/*.nii.gz.")
    return found[0]


def read(root: Path, *, metadata: Path | None = None) -> Datalists:
    """Return one datalist per hospital: ``{"image": T1, "label": brain mask}`` items.

    A subject folder whose name gives no known hospital, or that lacks its T1 or mask,
    raises ``ValueError`` naming it.
    """
    sample = _sample_dir(root)
    split_of: dict[int, str] = {}
    if metadata is not None:
        table = read_table(Path(metadata), "FLamby's metadata_tiny.csv (Patient ID, Split)")
        require_columns(table, Path(metadata), ["Patient ID", "Split"])
        split_of = {int(r["Patient ID"]): r["Split"].strip().lower()
                    for r in table.to_dict("records")}
    out: Datalists = {}
    for subject in sorted(p for p in sample.iterdir() if p.is_dir()):
        match = _SUBJECT.match(subject.name)
        if match is None or match["hospital"] not in HOSPITALS:
            raise ValueError(f"{subject}: expected a subject folder IXI<nnn>-<hospital>-<nnnn> "
                             f"with hospital one of {', '.join(HOSPITALS)}.")
        images = sorted((subject / "T1").glob("*.nii.gz"))
        masks = sorted((subject / "label").glob("*.nii.gz"))
        if len(images) != 1 or len(masks) != 1:
            raise ValueError(f"{subject}: expected one T1/*.nii.gz and one label/*.nii.gz, "
                             f"found {len(images)} and {len(masks)}.")
        split = split_of.get(int(match["id"]), "train")
        item: dict[str, Any] = {"image": str(images[0]), "label": str(masks[0]),
                                "subject": subject.name}
        splits = out.setdefault(match["hospital"], {"training": [], "validation": [],
                                                    "test": []})
        splits["test" if split == "test" else "training"].append(item)
    return out
