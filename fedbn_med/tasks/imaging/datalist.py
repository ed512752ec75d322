"""A site's datalist: MONAI-style JSON naming its images, split into training/validation/test.

:func:`load_datalist` reads the JSON (paths relative to its folder) and splits a
training-only list 60/20/20. :class:`ReadImaged`, the MONAI transform that opens a
chain, decodes an item's files; :func:`decode_items` runs it over a site's items and
skips, with one warning each, those that cannot be read, so that one bad file costs one
item and not the site.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from monai.config import KeysCollection
from monai.data import load_decathlon_datalist
from monai.transforms import MapTransform

from fedbn_med.tasks.imaging.dicom_read import ValuesMode
from fedbn_med.tasks.imaging.readers import ImageReadError, read_image

__all__ = ["SPLIT_KEYS", "ReadImaged", "decode_items", "load_datalist"]

logger = logging.getLogger(__name__)

SPLIT_KEYS = ("training", "validation", "test")


def load_datalist(path: str | Path, *, split_seed: int = 0, outside_root: bool = True
                  ) -> dict[str, list[dict[str, Any]]]:
    """Load a MONAI-style JSON datalist into ``{"training", "validation", "test"}`` items.

    Relative paths in ``image``/``label`` are resolved from the datalist's folder. With
    ``outside_root=False`` (what a site does unless its site file says
    ``datalist_outside_root = true``) they must stay inside that folder, links followed:
    ``../``, absolute paths and links out of it are refused. A datalist with only
    ``training`` is split 60/20/20 by ``split_seed``.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Datalist {path} does not exist. Expected a MONAI-style JSON file "
                         'such as {"training": [{"image": "a.nii.gz", "label": ...}]}.')
    try:
        keys = set(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"Datalist {path} is not a JSON object: {err}.") from err
    if "training" not in keys:
        raise ValueError(f"Datalist {path} has keys {sorted(keys)}; expected 'training' and "
                         f"optionally 'validation' and 'test'.")
    out = {key: load_decathlon_datalist(str(path), data_list_key=key, base_dir=path.parent)
           for key in SPLIT_KEYS if key in keys}
    if set(out) == {"training"}:
        items = out["training"]
        order = np.random.default_rng(split_seed).permutation(len(items))
        n_eval = max(1, len(items) // 5)
        out = {"validation": [items[i] for i in order[:n_eval]],
               "test": [items[i] for i in order[n_eval:2 * n_eval]],
               "training": [items[i] for i in order[2 * n_eval:]]}
    for key in SPLIT_KEYS:
        out.setdefault(key, [])
    if not outside_root:
        _check_inside(path, out)
    return out


def _check_inside(path: Path, splits: Mapping[str, list[dict[str, Any]]]) -> None:
    root = path.parent.resolve()
    for items in splits.values():
        for item in items:
            for key in ("image", "label"):
                value = item.get(key)
                if isinstance(value, (str, Path)) and not Path(value).resolve().is_relative_to(
                        root):
                    raise ValueError(
                        f"Datalist {path}: its {key} {value} lies outside the datalist's "
                        f"folder {root} (links followed). Paths stay inside it unless the "
                        "site file says datalist_outside_root = true.")


def decode_items(items: Iterable[Mapping[str, Any]], keys: Sequence[str], site: str = "",
                 *, decode: bool = True) -> list[dict[str, Any]]:
    """Decode the image files named under ``keys`` in each item; skip unreadable items.

    Each skipped item costs one warning naming the file and the reason. The others are
    returned with ``keys`` holding arrays (a leading channel axis added), or, with
    ``decode=False``, unchanged (the files were read only to check them).
    """
    usable = []
    for item in items:
        try:
            decoded = dict(ReadImaged(keys)(cast(Mapping[Hashable, Any], dict(item))))
        except ImageReadError as err:
            logger.warning("Site %s: skipping %s: %s", site or "?", err.path, err.reason)
            continue
        usable.append(cast(dict[str, Any], decoded) if decode else dict(item))
    return usable


class ReadImaged(MapTransform):
    """MONAI dictionary transform: replace file paths under ``keys`` by decoded arrays.

    Adds a leading channel axis, as ``EnsureChannelFirstd`` would; use it as the first
    transform of a chain so that :class:`monai.data.CacheDataset` keeps its output. An
    item may name the series of a folder or DICOMDIR under ``"<key>_series"`` (a
    ``SeriesInstanceUID`` or ``SeriesDescription``); ``values`` is passed to
    :func:`read_image`.
    """

    def __init__(self, keys: KeysCollection, allow_missing_keys: bool = False,
                 values: ValuesMode = "modality") -> None:
        super().__init__(keys, allow_missing_keys)
        self.values: ValuesMode = values

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        """Decode every key's file."""
        out = dict(data)
        for key in self.key_iterator(out):
            value = out[key]
            if isinstance(value, (str, Path)):
                series = out.get(f"{key}_series")
                try:
                    out[key] = read_image(value, series=str(series) if series else None,
                                          values=self.values)[None]
                except ImageReadError:
                    raise
                except Exception as err:  # noqa: BLE001 - any reader's error names the file
                    # its type only: a library's message may quote the file's contents
                    raise ImageReadError(Path(value), f"unreadable file ({type(err).__name__})"
                                         ) from None
        return out
