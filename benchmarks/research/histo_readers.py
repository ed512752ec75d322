"""The ImageScope XML reader against the release's own masks, tile by tile.

For every MoNuSeg tile that has both the official XML annotation and the rasterised PNG
mask, the XML is read by :func:`fedbn_med.tasks.histo.readers.read_imagescope_xml` and
compared with the mask: pixel Dice (target: at least 0.95 on each tile) and, for
reference, the AJI of the PNG's connected components against the XML's nuclei (what the
PNG fallback loses: touching nuclei merge).

    python benchmarks/research/histo_readers.py --data-dir /path/to/monuseg [--out table.csv]

The data folder is ``--data-dir``, else ``$FEDBN_MED_MONUSEG``.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import os
import sys
import time
from pathlib import Path

from fedbn_med.tasks.histo.metrics import aggregated_jaccard, dice
from fedbn_med.tasks.histo.readers import find_tiles, read_imagescope_xml, read_mask_png, read_tile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("FEDBN_MED_MONUSEG"),
                        help="the MoNuSeg folder (default: $FEDBN_MED_MONUSEG)")
    parser.add_argument("--out", type=Path, default=None, help="write the table as CSV here")
    args = parser.parse_args(argv)
    if args.data_dir is None:
        parser.error("give --data-dir (or set FEDBN_MED_MONUSEG): the MoNuSeg folder")
    tiles = [t for t in find_tiles(args.data_dir) if t.xml is not None and t.mask is not None]
    if not tiles:
        print(f"No tile under {args.data_dir} has both an XML and a PNG mask.", file=sys.stderr)
        return 1
    rows = []
    for tile in tiles:
        started = time.perf_counter()
        shape = read_tile(tile.image).shape[1:]
        nuclei = read_imagescope_xml(tile.xml, shape)
        mask = read_mask_png(tile.mask)
        rows.append({"tile": tile.tile_id, "nuclei_xml": int(nuclei.max()),
                     "components_png": int(mask.max()),
                     "dice": dice(nuclei > 0, mask > 0),
                     "aji_png_components": aggregated_jaccard(nuclei, mask),
                     "seconds": time.perf_counter() - started})
    print("| tile | nuclei (XML) | components (PNG) | Dice XML vs PNG | AJI PNG components |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tile']} | {r['nuclei_xml']} | {r['components_png']} | {r['dice']:.6f} | "
              f"{r['aji_png_components']:.3f} |")
    worst = min(r["dice"] for r in rows)
    print(f"\n{len(rows)} tiles; lowest Dice {worst:.6f} (target >= 0.95: "
          f"{'met' if worst >= 0.95 else 'NOT met'})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0 if worst >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
