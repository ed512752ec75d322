"""A site's imaging datasets: MONAI datasets over its datalist, built once per process.

:func:`site_split` gives a run its site's training, validation and test items: a
built-in site, or a datalist that lists only ``training``, is cross-validated (the run's
fold is the test part, the next fold its validation part, each repetition re-draws the
folds); a datalist with its own ``validation``/``test`` lists keeps them.
:func:`make_dataset` decodes a split's files (unreadable ones left out, with a warning)
and keeps the deterministic head of the transform chain in memory (``CacheDataset``), on
disk (``PersistentDataset``) or nowhere; :class:`ImageSiteData` holds a site's three
splits; :func:`site_data` builds them on first use and reuses them for every strategy of
a comparison, so decoding happens once per site and process, not per strategy or round.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from monai.data import CacheDataset, Dataset, PersistentDataset
from monai.transforms import Compose
from torch.utils.data import ConcatDataset

from fedbn_med.tasks.imaging.datalist import SPLIT_KEYS, decode_items, load_datalist
from fedbn_med.tasks.imaging.site_files import ImagingSite
from fedbn_med.training.trainer import derive_seed

__all__ = ["ImageSiteData", "cross_validation_split", "make_dataset", "site_data",
           "site_split"]

logger = logging.getLogger(__name__)

Items = list[dict[str, Any]]


def cross_validation_split(items: Sequence[Mapping[str, Any]], *, fold: int, n_folds: int,
                           seed: int, stratify: str | None = None) -> dict[str, Items]:
    """Split items into ``training``, ``validation`` and ``test`` for one fold.

    The items are shuffled by ``seed`` and dealt into ``n_folds`` folds (class by class
    when ``stratify`` names an item key, so that every fold holds each class in
    proportion). Fold ``fold`` is the test part and fold ``fold + 1`` (modulo
    ``n_folds``) the validation part: validation is carved from the training part only,
    and the test folds of one seed are a partition of the items.

    Raises
    ------
    ValueError
        If there are fewer items than folds, or ``fold`` is not in ``0..n_folds - 1``.
    """
    if n_folds < 3:
        raise ValueError(f"A cross-validation split needs n_folds >= 3 (test, validation "
                         f"and training folds), got {n_folds}.")
    if not 0 <= fold < n_folds:
        raise ValueError(f"fold must be in 0..{n_folds - 1}, got {fold}.")
    if len(items) < n_folds:
        raise ValueError(f"{len(items)} items cannot fill {n_folds} folds; expected at "
                         f"least {n_folds} (lower n_folds or add subjects).")
    order = np.random.default_rng(seed).permutation(len(items))
    if stratify is not None:  # class by class, each class shuffled: a stratified deal
        classes = [str(items[i][stratify]) for i in order]
        order = order[np.argsort(classes, kind="stable")]
    assigned = np.empty(len(items), dtype=int)
    assigned[order] = np.arange(len(items)) % n_folds
    val_fold = (fold + 1) % n_folds
    out: dict[str, Items] = {key: [] for key in SPLIT_KEYS}
    for i, item in enumerate(items):
        key = ("test" if assigned[i] == fold else
               "validation" if assigned[i] == val_fold else "training")
        out[key].append(dict(item))
    return out


def site_split(datalist: Path, site: ImagingSite, *, builtin: bool, seed: int, fold: int,
               n_folds: int, stratify: str | None = None) -> dict[str, Items]:
    """Return a site's split for a run of seed ``seed`` on test fold ``fold``.

    A built-in site (``builtin``) or a datalist with only ``training`` is cross-validated
    by :func:`cross_validation_split` over all its items; the split's seed derives from
    the site file's ``split_seed`` and the run's seed, so that each repetition of a
    comparison re-draws it. A datalist with its own ``validation`` or ``test`` list is
    used as it is: a hospital's fixed test set stays fixed, whatever the fold.
    """
    splits = load_datalist(datalist, split_seed=site.split_seed,
                           outside_root=site.datalist_outside_root)
    listed = set(json.loads(Path(datalist).read_text(encoding="utf-8")))
    if not builtin and listed & {"validation", "test"}:
        logger.info("Site %s: datalist %s lists its own %s; the run's fold (%d) does not "
                    "change it", site.name, datalist,
                    " and ".join(sorted(listed & {"validation", "test"})), fold)
        return splits
    items = [item for key in SPLIT_KEYS for item in splits[key]]
    try:
        return cross_validation_split(
            items, fold=fold, n_folds=n_folds, stratify=stratify,
            seed=derive_seed(site.split_seed, "imaging-split", site.name, seed))
    except ValueError as err:
        raise ValueError(f"Site {site.name} ({datalist}): {err}") from None


def make_dataset(items: Sequence[Mapping[str, Any]], keys: Sequence[str], transform: Compose,
                 *, cache: bool | Literal["memory", "disk", "none"] = True,
                 cache_dir: Path | None = None, site: str = "") -> Dataset:
    """Return a MONAI dataset over a split's datalist items, unreadable items left out.

    ``cache`` (``True`` is ``"memory"``, ``False`` ``"none"``) says where the
    deterministic head of ``transform`` (up to its first random transform) is kept:

    - ``"memory"``: each file decoded once, kept by ``CacheDataset``, so rounds only pay
      for augmentation;
    - ``"disk"``: kept as files under ``cache_dir`` by ``PersistentDataset`` (survives
      the process; items already decoded are read back from disk);
    - ``"none"``: every epoch decodes and preprocesses again.
    """
    mode = ("memory" if cache else "none") if isinstance(cache, bool) else cache
    if mode not in ("memory", "disk", "none"):
        raise ValueError(f"cache must be 'memory', 'disk' or 'none', got {cache!r}.")
    usable = decode_items(items, keys, site, decode=mode == "memory")
    if mode == "memory":
        return CacheDataset(usable, transform=transform, cache_rate=1.0, num_workers=0,
                            progress=False, copy_cache=False)
    if mode == "disk":
        if cache_dir is None:
            raise ValueError("cache 'disk' needs cache_dir, the folder of PersistentDataset.")
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        return PersistentDataset(usable, transform=transform, cache_dir=Path(cache_dir))
    return Dataset(usable, transform=transform)


@dataclass(frozen=True)
class ImageSiteData:
    """A site's training, validation and test MONAI datasets.

    Attributes
    ----------
    input_shape : tuple of int
        Shape of one network input, channel first (``(1, 64, 64)``, ``(1, 32, 32, 32)``
        for 3D patches).
    """

    train: Dataset | ConcatDataset
    val: Dataset
    test: Dataset
    input_shape: tuple[int, ...]

    @property
    def num_train(self) -> int:
        """Return the number of training items (volumes or radiographs)."""
        return len(self.train)

    @staticmethod
    def pooled(datas: Sequence[ImageSiteData]) -> ImageSiteData:
        """Return every site's training data together (no validation/test: sites score)."""
        empty = Dataset([])
        return ImageSiteData(ConcatDataset([d.train for d in datas]), empty, empty,
                             datas[0].input_shape)


_DATA: dict[tuple[object, ...], ImageSiteData] = {}


def site_data(task: str, site: ImagingSite, settings: Hashable, seed: int,
              data_dir: Path | None, build: Callable[[], ImageSiteData],
              fold: tuple[int, int] = (0, 5)) -> ImageSiteData:
    """Return a site's datasets, building them on the first call of this process.

    ``settings`` (the task's frozen imaging settings) is part of the cache key with the
    task, the site, its datalist, the seed, the ``(fold, n_folds)`` and the data folder.
    """
    key = (task, site.name, site.datalist, settings, seed, fold, data_dir)
    if key not in _DATA:
        _DATA[key] = build()
        logger.info("Site %s: %d training, %d validation, %d test items", site.name,
                    len(_DATA[key].train), len(_DATA[key].val), len(_DATA[key].test))
    return _DATA[key]
