"""Public dataset layouts and PACS exports, converted to MONAI datalists.

Each converter reads a dataset as it is distributed and returns one datalist per site
(``{"training": [...], "validation": [...], "test": [...]}``, items
``{"image": <absolute path>, "label": ..., ...}``), split by the dataset's own site or
hospital field where it has one; :func:`write_datalists` writes them as
``<out>/<site>.json``, which a site file's ``datalist`` then names.

- :mod:`.chexpert`: CheXpert (``train.csv``, ``valid.csv``), uncertain labels by policy;
- :mod:`.chestxray14`: NIH ChestX-ray14 (``Data_Entry_2017.csv``, PNG);
- :mod:`.mimic_cxr`: MIMIC-CXR-JPG (metadata, CheXpert-labeller and split CSVs);
- :mod:`.fed_ixi`: FLamby's Fed-IXI (IXI T1 and brain masks; hospital Guys, HH or IOP);
- :mod:`.pacs`: a hospital's own DICOM export (a folder or a DICOMDIR), one item a series.
"""

from __future__ import annotations

from fedbn_med.tasks.imaging.layouts.common import (
    CHEXPERT_FINDINGS,
    Datalists,
    binary_label,
    write_datalists,
)

__all__ = ["CHEXPERT_FINDINGS", "LAYOUTS", "Datalists", "binary_label", "convert",
           "write_datalists"]

#: The layouts :func:`convert` knows, by the name the command takes.
LAYOUTS = ("chexpert", "chestxray14", "mimic-cxr", "fed-ixi", "pacs")


def convert(layout: str, root: str, **options: object) -> Datalists:
    """Return the datalists of the dataset at ``root`` in ``layout`` (one of :data:`LAYOUTS`).

    Raises
    ------
    ValueError
        If ``layout`` is not one of :data:`LAYOUTS`.
    """
    from pathlib import Path

    from fedbn_med.tasks.imaging.layouts import chestxray14, chexpert, fed_ixi, mimic_cxr, pacs

    readers = {"chexpert": chexpert.read, "chestxray14": chestxray14.read,
               "mimic-cxr": mimic_cxr.read, "fed-ixi": fed_ixi.read, "pacs": pacs.read}
    if layout not in readers:
        raise ValueError(f"Unknown layout {layout!r}. Valid layouts: {', '.join(LAYOUTS)}.")
    return readers[layout](Path(root), **options)  # type: ignore[operator]
