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
        2D slices drawn from each training volume per epoch (MRI only).
    cache : bool
        Keep decoded, preprocessed images in memory (``CacheDataset``).
    """

    task: ClassVar[str] = "imaging"
    image_size: int = 64
    subjects: int = 24
    slices: int = 8
    cache: bool = True

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

    def input_shape(self) -> tuple[int, ...]:
        """Return ``(1, size, size)``: one single-channel 2D image."""
        return (1, self.image_size, self.image_size)
