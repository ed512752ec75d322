"""Settings shared by the imaging tasks (MRI, X-ray); light, no MONAI import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["ImagingSettings"]


@dataclass(frozen=True)
class ImagingSettings:
    """Imaging-only settings of a run.

    Attributes
    ----------
    image_size : int
        Edge of the network's input (and of the built-in sites' images), a multiple of 8.
    subjects : int
        Subjects (MRI volumes or radiographs) per built-in site.
    slices : int
        2D slices drawn from each training volume per epoch (MRI's 2D mode only).
    cache : bool
        Keep decoded, preprocessed images in memory (``CacheDataset``).
    cache_dir : str
        With ``cache`` off: a folder where MONAI's ``PersistentDataset`` keeps each
        preprocessed image on disk (empty: decode and preprocess at every epoch).
    data_seed : int
        Seed of the built-in sites' subjects and scanners. It is not the run's seed: the
        repetitions of a comparison (run seeds) re-draw each site's split and the initial
        weights over the same data.
    """

    task: ClassVar[str] = "imaging"
    image_size: int = 64
    subjects: int = 24
    slices: int = 8
    cache: bool = True
    cache_dir: str = ""
    data_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("image_size", "subjects", "slices"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.image_size % 8 or self.image_size < 16:
            raise ValueError(f"image_size must be a multiple of 8 and at least 16, "
                             f"got {self.image_size}.")
        if not isinstance(self.cache, bool):
            raise ValueError(f"cache must be true or false, got {self.cache!r}.")
        if not isinstance(self.cache_dir, str):
            raise ValueError(f"cache_dir must be a folder path (a string), got "
                             f"{self.cache_dir!r}.")
        if self.cache and self.cache_dir:
            raise ValueError(f"cache_dir={self.cache_dir!r} is the on-disk cache of "
                             "cache=false; with cache=true images are kept in memory. Give "
                             "one of the two.")
        if (not isinstance(self.data_seed, int) or isinstance(self.data_seed, bool)
                or self.data_seed < 0):
            raise ValueError(f"data_seed must be a non-negative integer, got "
                             f"{self.data_seed!r}.")

    @property
    def cache_mode(self) -> str:
        """Return where preprocessed images are kept: ``"memory"``, ``"disk"`` or ``"none"``."""
        return "memory" if self.cache else ("disk" if self.cache_dir else "none")

    def input_shape(self) -> tuple[int, ...]:
        """Return ``(1, size, size)``: one single-channel 2D image."""
        return (1, self.image_size, self.image_size)
