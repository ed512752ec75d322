"""Generated H&E-like tiles, written as the MoNuSeg release is: TIFF, ImageScope XML, PNG.

Each site has its own stain (the haematoxylin and eosin colours and the background
brightness differ), as hospitals' staining protocols and scanners do; nuclei are
ellipses. The tests and the task's built-in sites use these files, never the real tiles.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["default_folder", "write_synthetic", "write_tile"]


def _ellipses(rng: np.random.Generator, size: int, n: int) -> list[list[tuple[float, float]]]:
    polygons = []
    for _ in range(n):
        cx, cy = rng.uniform(4, size - 4, 2)
        a, b = rng.uniform(2.5, 5.0, 2)
        angle = rng.uniform(0, math.pi)
        t = np.linspace(0, 2 * math.pi, 16, endpoint=False)
        x = cx + a * np.cos(t) * math.cos(angle) - b * np.sin(t) * math.sin(angle)
        y = cy + a * np.cos(t) * math.sin(angle) + b * np.sin(t) * math.cos(angle)
        polygons.append([(float(px), float(py)) for px, py in zip(x, y)])
    return polygons


def _xml(polygons: Sequence[Sequence[tuple[float, float]]]) -> str:
    regions = []
    for i, points in enumerate(polygons, start=1):
        vertices = "".join(f'<Vertex X="{x:.2f}" Y="{y:.2f}"/>' for x, y in points)
        regions.append(f'<Region Id="{i}" Type="0"><Attributes/><Vertices>{vertices}'
                       "</Vertices></Region>")
    return ('<Annotations MicronsPerPixel="0.2527"><Annotation Id="1"><Regions>'
            + "".join(regions) + "</Regions></Annotation></Annotations>\n")


def write_tile(folder: Path, tile_id: str, *, size: int, stain: int, seed: int,
               nuclei: int | None = None) -> tuple[Path, Path, Path]:
    """Write one tile's TIFF, XML and PNG mask in the MoNuSeg layout; return the three."""
    rng = np.random.default_rng(seed)
    polygons = _ellipses(rng, size, nuclei if nuclei is not None else max(3, size * size // 300))
    mask = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask)
    for points in polygons:
        draw.polygon(points, fill=255, outline=255)
    nucleus = np.asarray(mask) > 0
    srng = np.random.default_rng(1000 + stain)  # the site's stain, the same for its tiles
    eosin = np.array([230, 150, 190]) * srng.uniform(0.8, 1.0, 3)
    haem = np.array([90, 50, 140]) * srng.uniform(0.6, 1.3, 3)
    rgb = np.where(nucleus[..., None], haem, eosin) + rng.normal(0, 12, (size, size, 3))
    rgb = np.clip(rgb, 0, 255).astype(np.uint8)
    images, notes = folder / "Tissue Images", folder / "Annotations"
    masks = folder.parent / "masks"
    for path in (images, notes, masks):
        path.mkdir(parents=True, exist_ok=True)
    tif, xml, png = images / f"{tile_id}.tif", notes / f"{tile_id}.xml", masks / f"{tile_id}.png"
    Image.fromarray(rgb).save(tif, compression="tiff_lzw")
    xml.write_text(_xml(polygons), encoding="utf-8")
    mask.save(png)
    return tif, xml, png


def write_synthetic(root: Path, sites: Sequence[str], tiles: int, size: int,
                    seed: int = 0) -> Path:
    """Write ``tiles`` tiles per site under ``root`` and a datalist; return the datalist.

    The datalist (``root/datalist.json``) names each tile's site; odd tiles list their
    PNG mask, even ones their XML, so that both readers are used.
    """
    folder = root / "MoNuSeg Synthetic" / "train"
    items = []
    for s, site in enumerate(sites):
        for k in range(tiles):
            tile_id = f"SYNTH-{site}-{k:02d}"
            tif, xml, png = write_tile(folder, tile_id, size=size, stain=s,
                                       seed=seed * 7919 + s * 101 + k)
            label = png if k % 2 else xml
            items.append({"id": tile_id, "image": str(tif.relative_to(root)),
                          "label": str(label.relative_to(root)), "site": site})
    path = root / "datalist.json"
    path.write_text(json.dumps({"tiles": items}, indent=1), encoding="utf-8")
    return path


def default_folder(sites: Sequence[str], tiles: int, size: int, seed: int = 0) -> Path:
    """Return the built-in tiles' datalist, writing them once (atomically) on first use."""
    name = f"fedbn-med-histo-{'-'.join(sites)}-{tiles}x{size}-{seed}"
    root = Path(tempfile.gettempdir()) / name
    datalist = root / "datalist.json"
    if datalist.is_file():
        return datalist
    scratch = Path(tempfile.mkdtemp(prefix=name + ".", dir=root.parent))
    write_synthetic(scratch, sites, tiles, size, seed)
    try:
        os.replace(scratch, root)
    except OSError:  # another process wrote it first
        shutil.rmtree(scratch, ignore_errors=True)
    return datalist
