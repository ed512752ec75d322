"""A site's tiles as MONAI datasets: random patches to train on, whole tiles to score.

Training items are cut by MONAI transforms from each training tile: ``patches`` patches
a tile per epoch (``RandCropByPosNegLabeld``: half centred on a nucleus), flipped and
rotated by multiples of 90 degrees (tissue has no orientation), and their colour
perturbed channel by channel (``RandScaleIntensityd``, ``RandShiftIntensityd``:
another haematoxylin and eosin strength, as another stain batch gives) with some noise.
Validation and test items are whole tiles (or their central ``eval_crop`` square), with
the nuclei's instance mask for the AJI.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from monai.data import Dataset
from monai.transforms import (
    Compose,
    RandCropByPosNegLabeld,
    RandFlipd,
    RandGaussianNoised,
    RandRotate90d,
    RandScaleIntensityd,
    RandShiftIntensityd,
)

import fedbn_med as fb
from fedbn_med.tasks.histo import synth
from fedbn_med.tasks.histo.readers import TileFiles, find_tiles, read_instances, read_tile
from fedbn_med.tasks.histo.sites import assign_sites

__all__ = ["load_item", "site_data", "site_tiles", "split_tiles", "train_transform"]

_ITEMS: dict[tuple[Path, str, int, str], dict[str, Any]] = {}


def tiles_source(spec: Any) -> Path:
    """Return the run's tiles: ``spec.data_dir``, else the generated built-in tiles."""
    if spec.data_dir is not None:
        return Path(spec.data_dir)
    settings = spec.settings
    return synth.default_folder(spec.sites, settings.synthetic_tiles, settings.synthetic_size)


def site_tiles(spec: Any) -> dict[str, list[TileFiles]]:
    """Return every site's tiles under the run's site rule.

    Raises
    ------
    ValueError
        When the rule is ``datalist`` and a tile names no site.
    """
    tiles = find_tiles(tiles_source(spec))
    rule = spec.settings.site_rule if spec.data_dir is not None else "datalist"
    if rule == "datalist":
        missing = [t.tile_id for t in tiles if not t.site]
        if missing:
            raise ValueError(f"site_rule 'datalist' takes each tile's site from its datalist; "
                             f"tiles {', '.join(missing[:5])} name none.")
        out: dict[str, list[TileFiles]] = {}
        for tile in tiles:
            out.setdefault(str(tile.site), []).append(tile)
        return out
    by_id = {t.tile_id: t for t in tiles}
    return {name: [by_id[i] for i in ids]
            for name, ids in assign_sites(by_id, rule).items()}


def split_tiles(tiles: Sequence[TileFiles], site: str, *, seed: int, fold: int,
                n_folds: int) -> dict[str, list[TileFiles]]:
    """Split a site's tiles: fold ``fold`` of ``n_folds`` tests, the next one validates.

    The order is drawn from the run's seed and the site, so each repetition re-draws it.

    Raises
    ------
    ValueError
        When the site has fewer tiles than folds.
    """
    if len(tiles) < n_folds:
        raise ValueError(f"Site {site} has {len(tiles)} tiles, fewer than the {n_folds} folds; "
                         f"lower n_folds to at most {len(tiles)}.")
    rng = np.random.default_rng(zlib.crc32(f"{seed}:{site}:histo-split".encode()))
    chunks = np.array_split(rng.permutation(len(tiles)), n_folds)
    test, val = set(chunks[fold].tolist()), set(chunks[(fold + 1) % n_folds].tolist())
    ordered = sorted(tiles, key=lambda t: t.tile_id)
    return {"train": [t for i, t in enumerate(ordered) if i not in test | val],
            "val": [t for i, t in enumerate(ordered) if i in val],
            "test": [t for i, t in enumerate(ordered) if i in test]}


def load_item(tile: TileFiles, annotation: str, crop: int = 0, stain: str = "none"
              ) -> dict[str, Any]:
    """Return a tile's item: ``image`` (3, H, W) in [0, 1], ``label`` (1, H, W), ``inst``.

    ``stain="macenko"`` normalises the tile's stains first (MONAI's ``NormalizeHEStains``).
    """
    key = (tile.image, annotation, crop, stain)
    if key not in _ITEMS:
        rgb = read_tile(tile.image)
        if stain == "macenko":
            from monai.apps.pathology.transforms import NormalizeHEStains

            rgb = np.ascontiguousarray(
                NormalizeHEStains()(rgb.transpose(1, 2, 0)).transpose(2, 0, 1))
        inst = read_instances(tile, rgb.shape[1:], prefer=annotation)
        if crop and min(inst.shape) > crop:
            top, left = (inst.shape[0] - crop) // 2, (inst.shape[1] - crop) // 2
            rgb = rgb[:, top:top + crop, left:left + crop]
            inst = inst[top:top + crop, left:left + crop]
        _ITEMS[key] = {"image": (rgb.astype(np.float32) / 255.0),
                       "label": (inst > 0).astype(np.int64)[None],
                       "inst": inst[None], "id": tile.tile_id}
    return _ITEMS[key]


def train_transform(patch: int, patches: int) -> Compose:
    """Return the training patches' transform: crops, flips, rotations, stain jitter."""
    keys = ["image", "label"]
    return Compose([
        RandCropByPosNegLabeld(keys, label_key="label", spatial_size=(patch, patch), pos=1,
                               neg=1, num_samples=patches, allow_smaller=False),
        RandFlipd(keys, prob=0.5, spatial_axis=0),
        RandFlipd(keys, prob=0.5, spatial_axis=1),
        RandRotate90d(keys, prob=0.5, max_k=3),
        RandScaleIntensityd("image", factors=0.15, prob=0.8, channel_wise=True),
        RandShiftIntensityd("image", offsets=0.08, prob=0.8, channel_wise=True),
        RandGaussianNoised("image", prob=0.3, std=0.02),
    ])


def site_data(site: str, spec: Any) -> Any:
    """Return a site's training, validation and test datasets for the run's fold.

    Raises
    ------
    ValueError
        For a site the run's tiles and rule do not make, naming those they do.
    """
    settings = spec.settings
    if spec.data_dir is None and site not in spec.sites:
        # a built-in site outside the run (onboarding a new one): its tiles are generated
        # beside the run's, whose stains keep their order
        spec = spec.replace(sites=(*spec.sites, site))
    if settings.site_rule == "single" and spec.data_dir is not None:
        if site in spec.sites and len(spec.sites) > 1:
            raise ValueError(f"site_rule 'single' makes one site of every tile of "
                             f"{spec.data_dir} (a new hospital's folder, to onboard); a run of "
                             f"{len(spec.sites)} sites needs 'hospital', 'organ' or 'datalist'.")
        tiles = {site: find_tiles(spec.data_dir)}
    else:
        tiles = site_tiles(spec)
    if site not in tiles:
        raise ValueError(f"Unknown site '{site}' under site_rule '{settings.site_rule}'. "
                         f"Valid sites: {', '.join(sorted(tiles))}.")
    parts = split_tiles(tiles[site], site, seed=spec.seed, fold=spec.fold,
                        n_folds=spec.n_folds)

    def items(split: str, crop: int) -> list[dict[str, Any]]:
        return [{k: v for k, v in load_item(t, settings.annotation, crop,
                                            settings.stain).items()
                 if split != "train" or k in ("image", "label")} for t in parts[split]]

    train = Dataset(items("train", 0), train_transform(settings.patch_size, settings.patches))
    return fb.image_site(train, Dataset(items("val", settings.eval_crop)),
                         Dataset(items("test", settings.eval_crop)),
                         input_shape=settings.input_shape())
