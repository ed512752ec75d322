"""Read H&E tiles and their nuclei as distributed: TIFF tiles, ImageScope XML, PNG masks.

- :func:`read_tile`: an RGB tile (TIFF, PNG, ...) read with Pillow, ``(3, H, W)`` uint8;
- :func:`read_imagescope_xml`: the official annotation format (Aperio ImageScope XML,
  one ``<Region>`` per nucleus with its polygon of ``<Vertex X= Y=>``), rasterised to an
  instance mask (0 background, nucleus ``k`` filled with ``k``; where polygons overlap,
  the later region wins, as when drawn in file order);
- :func:`read_mask_png`: a binary mask (any channel non-zero), its instances taken as
  the connected components (touching nuclei merge: the PNG fallback knows no better);
- :func:`find_tiles`: the tiles of a folder in the MoNuSeg layout (``Tissue Images/``,
  ``Annotations/``, ``masks/``) or of a datalist JSON file.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage

__all__ = ["TileFiles", "find_tiles", "read_imagescope_xml", "read_instances",
           "read_mask_png", "read_tile"]

_TILE_SUFFIXES = (".tif", ".tiff", ".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class TileFiles:
    """One tile's files: its image, its XML annotation and its mask (either may be None)."""

    tile_id: str
    image: Path
    xml: Path | None = None
    mask: Path | None = None
    site: str | None = None


def read_tile(path: str | Path) -> np.ndarray:
    """Return an RGB tile as ``(3, H, W)`` uint8.

    Raises
    ------
    ValueError
        When the file cannot be read as an image.
    """
    try:
        with Image.open(path) as image:
            rgb = np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError, ValueError) as err:
        raise ValueError(f"Cannot read tile {path}: {err}. Expected an RGB image (TIFF, PNG)."
                         ) from err
    return np.ascontiguousarray(rgb.transpose(2, 0, 1))


def read_imagescope_xml(path: str | Path, shape: tuple[int, int]) -> np.ndarray:
    """Return the nuclei of an ImageScope XML file as an ``(H, W)`` int32 instance mask.

    Each ``Region``'s vertices (``X`` the column, ``Y`` the row, in pixels) are filled
    as a polygon; regions of fewer than 3 vertices are left out.

    Raises
    ------
    ValueError
        When the file is no XML, holds no ``Region``, or a vertex is not a number.
    """
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as err:
        raise ValueError(f"Cannot read ImageScope XML {path}: {err}.") from err
    regions = list(root.iter("Region"))
    if not regions:
        raise ValueError(f"ImageScope XML {path} holds no <Region>; expected one per "
                         "nucleus (<Region><Vertices><Vertex X= Y=/>...).")
    height, width = shape
    canvas = Image.new("I", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    label = 0
    for region in regions:
        try:
            points = [(float(v.attrib["X"]), float(v.attrib["Y"])) for v in region.iter("Vertex")]
        except (KeyError, ValueError) as err:
            raise ValueError(f"ImageScope XML {path}: region {region.attrib.get('Id', '?')} "
                             f"has a vertex without numeric X and Y ({err}).") from err
        if len(points) < 3:
            continue
        label += 1
        draw.polygon(points, fill=label, outline=label)
    return np.asarray(canvas, dtype=np.int32)


def read_mask_png(path: str | Path) -> np.ndarray:
    """Return a binary PNG mask's connected components as an ``(H, W)`` int32 mask.

    Raises
    ------
    ValueError
        When the file cannot be read as an image.
    """
    try:
        with Image.open(path) as image:
            values = np.asarray(image)
    except (OSError, SyntaxError, ValueError) as err:
        raise ValueError(f"Cannot read mask {path}: {err}. Expected a binary PNG.") from err
    foreground = values.any(axis=-1) if values.ndim == 3 else values > 0
    labels, _ = ndimage.label(foreground)
    return labels.astype(np.int32)


def read_instances(files: TileFiles, shape: tuple[int, int], prefer: str = "xml"
                   ) -> np.ndarray:
    """Return a tile's instance mask: from its XML (``prefer="xml"``) when it has one.

    Raises
    ------
    ValueError
        When the tile has neither file, or a mask's shape is not the tile's.
    """
    order = (files.xml, files.mask) if prefer == "xml" else (files.mask, files.xml)
    for path in order:
        if path is None:
            continue
        if path.suffix.lower() == ".xml":
            return read_imagescope_xml(path, shape)
        mask = read_mask_png(path)
        if mask.shape != tuple(shape):
            raise ValueError(f"Mask {path} is {mask.shape[0]} x {mask.shape[1]}, its tile "
                             f"{files.image} {shape[0]} x {shape[1]}.")
        return mask
    raise ValueError(f"Tile {files.image} has no annotation: expected an ImageScope XML or "
                     "a mask PNG beside it.")


def find_tiles(source: str | Path) -> list[TileFiles]:
    """Return the tiles of a MoNuSeg-layout folder or of a datalist JSON file.

    A folder: every image under a ``Tissue Images`` folder (else the folder itself),
    its XML in a sibling ``Annotations`` folder and its mask in a ``masks`` folder
    anywhere below ``source``, matched by file stem. A datalist: ``{"tiles": [{"image":
    ..., "label": ... (XML or PNG), "site": ... (optional)}]}``, paths relative to it.

    Raises
    ------
    FileNotFoundError
        When ``source`` does not exist.
    ValueError
        When it holds no tile, or a datalist is malformed or names a missing file.
    """
    source = Path(source).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"No tiles at {source}: expected a folder in the MoNuSeg "
                                "layout or a datalist JSON file.")
    if source.is_file():
        return _from_datalist(source)
    image_dirs = sorted(p for p in source.rglob("Tissue Images") if p.is_dir()) or [source]
    masks = {p.stem: p for p in source.rglob("*.png") if p.parent.name == "masks"}
    tiles = []
    for folder in image_dirs:
        for image in sorted(folder.iterdir()):
            if image.suffix.lower() not in _TILE_SUFFIXES or image.parent.name == "masks":
                continue
            xml = folder.parent / "Annotations" / f"{image.stem}.xml"
            tiles.append(TileFiles(image.stem, image, xml if xml.is_file() else None,
                                   masks.get(image.stem)))
    if not tiles:
        raise ValueError(f"No tile under {source}: expected images ({', '.join(_TILE_SUFFIXES)}) "
                         "in a 'Tissue Images' folder or in the folder itself.")
    return tiles


def _from_datalist(path: Path) -> list[TileFiles]:
    try:
        listed = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"Cannot read datalist {path}: {err}.") from err
    items = listed.get("tiles") if isinstance(listed, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"Datalist {path} has no 'tiles' list; expected {{\"tiles\": "
                         "[{\"image\": ..., \"label\": ...}, ...]}.")
    tiles = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "image" not in item or "label" not in item:
            raise ValueError(f"Datalist {path}, tile {i}: expected 'image' and 'label', got "
                             f"{item!r}.")
        image, label = path.parent / item["image"], path.parent / item["label"]
        for file in (image, label):
            if not file.is_file():
                raise ValueError(f"Datalist {path}, tile {i}: no file {file}.")
        xml = label if label.suffix.lower() == ".xml" else None
        tiles.append(TileFiles(str(item.get("id", image.stem)), image, xml,
                               None if xml else label, item.get("site")))
    return tiles
