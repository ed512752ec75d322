"""Turn a public imaging dataset, or a hospital's DICOM export, into MONAI datalists.

One JSON datalist per site (<out>/<site>.json), split by the dataset's own site or
hospital field where it has one; point a site file's ``datalist`` at it:

    python pipelines/image_datalists.py chexpert ~/data/CheXpert-v1.0-small --out dl \
        --finding "Pleural Effusion" --uncertain ones
    python pipelines/image_datalists.py chestxray14 ~/data/ChestX-ray14 --out dl
    python pipelines/image_datalists.py mimic-cxr ~/data/mimic-cxr-jpg/2.0.0 --out dl
    python pipelines/image_datalists.py fed-ixi ~/data/fed_ixi --out dl
    python pipelines/image_datalists.py pacs /mnt/export/DICOMDIR --out dl --modality MR
"""

from __future__ import annotations

import argparse

from fedbn_med.cli.argtypes import absolute_path
from fedbn_med.tasks.imaging.layouts import LAYOUTS, convert, write_datalists

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, convert the layout and print what was written."""
    p = argparse.ArgumentParser(prog="image_datalists.py", description=__doc__.splitlines()[0])
    p.add_argument("layout", choices=LAYOUTS)
    p.add_argument("root", type=absolute_path, help="the dataset folder (or a DICOMDIR for pacs)")
    p.add_argument("--out", type=absolute_path, required=True, help="folder for <site>.json")
    p.add_argument("--finding", help="chest X-ray sets: the finding that is the label")
    p.add_argument("--uncertain", choices=("zeros", "ones", "ignore"),
                   help="CheXpert, MIMIC-CXR: policy for uncertain (-1) labels")
    p.add_argument("--site-field", help="chest X-ray sets: a column to split into sites")
    p.add_argument("--metadata", type=absolute_path, help="fed-ixi: FLamby's metadata_tiny.csv")
    p.add_argument("--modality", help="pacs: keep one Modality (MR, CT, CR, DX...)")
    args = p.parse_args(argv)
    names = {"finding": args.finding, "uncertain": args.uncertain,
             "site_field": args.site_field, "metadata": args.metadata,
             "modality": args.modality}
    options = {k: v for k, v in names.items() if v is not None}
    try:
        datalists = convert(args.layout, args.root, **options)
    except TypeError as err:  # an option this layout does not take
        p.error(f"{args.layout}: {err}")
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"image_datalists: {err}") from None
    for site, path in write_datalists(datalists, args.out).items():
        counts = ", ".join(f"{len(v)} {k}" for k, v in datalists[site].items())
        print(f"{site}: {path} ({counts})")

