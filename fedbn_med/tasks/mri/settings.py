"""The MRI task's settings and defaults (light: no MONAI import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fedbn_med.tasks.imaging.settings import ImagingSettings

__all__ = ["COMPARE", "DEFAULTS", "ENGINE", "METRICS", "MODES", "SITES", "Settings"]

#: The built-in MRI sites, one scanner model each.
SITES = ("SiteA", "SiteB", "SiteC")

DEFAULTS: dict[str, Any] = {"sites": SITES, "rounds": 20, "batch_size": 4, "lr": 1e-3}


#: The strategies ``--compare`` runs when given no list, in table order: FedBN against
#: FedAvg, FedAvg scored with each site's own BN statistics, and SiloBN (BN affine shared).
COMPARE = ("singleset", "fedavg", "fedavg_localbn", "silobn", "fedprox", "fedbn")

#: The engine a pipeline uses unless ``--engine`` says otherwise.
ENGINE = "inprocess"

#: What ``--compare`` scores (the first also picks each run's best validation round).
METRICS = ("dice", "dice_csf", "dice_gm", "dice_wm")

#: How the network sees a subject: 3D patches, or 2D axial slices of a central slab.
MODES = ("3d", "2d")


@dataclass(frozen=True)
class Settings(ImagingSettings):
    """Brain MRI segmentation on the subjects' volumes.

    Attributes
    ----------
    mode : {"3d", "2d"}
        ``"3d"``: a 3D UNet trained on patches drawn around tissue and background
        (``RandCropByPosNegLabeld``) and scored on whole volumes by a sliding window;
        ``"2d"``: a 2D UNet trained on random axial slices (``slices`` per volume) and
        scored slice by slice on each subject's central slab.
    patch_size : int
        Edge of a 3D training patch and of the sliding window (a multiple of 8; at most
        ``image_size``, which it is cut down to).
    patches : int
        3D patches drawn from each training volume per epoch.
    """

    task: ClassVar[str] = "mri"
    image_size: int = 48
    subjects: int = 12
    slices: int = 8
    mode: str = "3d"
    patch_size: int = 32
    patches: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}.")
        for name in ("patch_size", "patches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.patch_size % 8 or self.patch_size < 16:
            raise ValueError(f"patch_size must be a multiple of 8 and at least 16, got "
                             f"{self.patch_size}.")

    @property
    def patch(self) -> int:
        """Return the 3D patch edge used: ``patch_size``, cut down to ``image_size``."""
        return min(self.patch_size, self.image_size)

    @property
    def spatial_dims(self) -> int:
        """Return 3 or 2: the dimensions the network convolves over."""
        return 3 if self.mode == "3d" else 2

    def input_shape(self) -> tuple[int, ...]:
        """Return one network input: ``(1, p, p, p)`` (3D patch) or ``(1, size, size)``."""
        if self.mode == "3d":
            return (1, self.patch, self.patch, self.patch)
        return (1, self.image_size, self.image_size)
