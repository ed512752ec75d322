"""A site's imaging datasets: MONAI datasets over its datalist, built once per process.

:func:`make_dataset` decodes a split's files (unreadable ones left out, with a warning)
and caches the deterministic head of the transform chain; :class:`ImageSiteData` holds a
site's three splits; :func:`site_data` builds them on first use and reuses them for every
strategy of a comparison, so decoding happens once, not per strategy or per round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monai.data import CacheDataset, Dataset
from monai.transforms import Compose
from torch.utils.data import ConcatDataset

from fedbn_med.tasks.imaging.readers import decode_items
from fedbn_med.tasks.imaging.site_files import ImagingSite

__all__ = ["ImageSiteData", "make_dataset", "site_data"]

logger = logging.getLogger(__name__)


def make_dataset(items: Sequence[Mapping[str, Any]], keys: Sequence[str], transform: Compose,
                 *, cache: bool = True, site: str = "") -> Dataset:
    """Return a MONAI dataset over a split's datalist items, unreadable items left out.

    With ``cache`` each file is decoded once and the deterministic head of ``transform``
    (up to the first random transform) is kept in memory by ``CacheDataset``, so rounds
    only pay for augmentation; without it every epoch decodes and preprocesses again.
    """
    usable = decode_items(items, keys, site, decode=cache)
    if cache:
        return CacheDataset(usable, transform=transform, cache_rate=1.0, num_workers=0,
                            progress=False, copy_cache=False)
    return Dataset(usable, transform=transform)


@dataclass(frozen=True)
class ImageSiteData:
    """A site's training, validation and test MONAI datasets.

    Attributes
    ----------
    input_shape : tuple of int
        Shape of one network input, channel first (``(1, 64, 64)``).
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
              data_dir: Path | None, build: Callable[[], ImageSiteData]) -> ImageSiteData:
    """Return a site's datasets, building them on the first call of this process.

    ``settings`` (the task's frozen imaging settings) is part of the cache key with the
    task, the site, its datalist, the seed and the data folder.
    """
    key = (task, site.name, site.datalist, settings, seed, data_dir)
    if key not in _DATA:
        _DATA[key] = build()
        logger.info("Site %s: %d training, %d validation, %d test items", site.name,
                    len(_DATA[key].train), len(_DATA[key].val), len(_DATA[key].test))
    return _DATA[key]
