"""The histopathology task's settings and defaults (light: no torch, no MONAI)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["COMPARE", "DEFAULTS", "ENGINE", "METRICS", "SITES", "SITE_RULES", "STAINS",
           "Settings"]

#: The rules that make sites of tiles (:mod:`fedbn_med.tasks.histo.sites`); ``datalist``
#: takes each tile's ``site`` from its datalist; ``single`` makes one site of every tile
#: (a new hospital's own folder, onboarded from a federation's weights).
SITE_RULES = ("hospital", "organ", "datalist", "single")

#: Stain normalisations a run may apply to every tile.
STAINS = ("none", "macenko")

#: The built-in (generated) tiles' sites, and the hospital rule's on the MoNuSeg tiles.
SITES = ("H1", "H2", "H3", "H4")

DEFAULTS: dict[str, Any] = {"sites": SITES, "rounds": 10, "batch_size": 8, "lr": 1e-3,
                            "n_folds": 5}

#: The strategies ``--compare`` runs when given no list, in table order.
COMPARE = ("singleset", "centralized", "fedavg", "fedavg_localbn", "silobn", "fedprox",
           "fedbn")

#: The engine a pipeline uses unless ``--engine`` says otherwise.
ENGINE = "inprocess"

#: What ``--compare`` scores (the first is the headline).
METRICS = ("dice", "aji")


@dataclass(frozen=True)
class Settings:
    """Nuclei segmentation of H&E tiles.

    Attributes
    ----------
    site_rule : {"hospital", "organ", "datalist", "single"}
        How tiles become sites (``RunSpec.data_dir`` holds the tiles: a MoNuSeg-layout
        folder or a datalist JSON); ``single``: every tile is the one site asked for (a
        new hospital's folder, for onboarding; never a federation of several sites).
        Without ``data_dir``, generated tiles are used (``synthetic_tiles`` per site,
        ``synthetic_size`` pixels a side).
    patch_size : int
        Edge of a training patch cut from a tile (a multiple of 8).
    patches : int
        Patches cut from each training tile per epoch (half centred on a nucleus).
    eval_crop : int
        Score on the central ``eval_crop`` square of each validation/test tile (0: the
        whole tile), predicted by a sliding window of training patches.
    channels : str
        The U-Net's channels per level, comma-separated (``"16,32,64"``).
    annotation : {"xml", "png"}
        Which annotation a tile's nuclei come from when it has both.
    stain : {"none", "macenko"}
        Stain normalisation of every tile before anything else: ``"macenko"`` maps each
        tile's haematoxylin and eosin onto one reference (MONAI's ``NormalizeHEStains``,
        Macenko et al. 2009), the classic alternative to keeping BN per site.
    """

    task: ClassVar[str] = "histo"
    site_rule: str = "hospital"
    patch_size: int = 64
    patches: int = 4
    eval_crop: int = 0
    channels: str = "16,32,64"
    annotation: str = "xml"
    stain: str = "none"
    synthetic_tiles: int = 5
    synthetic_size: int = 96

    def __post_init__(self) -> None:
        if self.site_rule not in SITE_RULES:
            raise ValueError(f"site_rule must be one of {', '.join(SITE_RULES)}, got "
                             f"{self.site_rule!r}.")
        if self.stain not in STAINS:
            raise ValueError(f"stain must be one of {', '.join(STAINS)}, got {self.stain!r}.")
        if self.annotation not in ("xml", "png"):
            raise ValueError(f"annotation must be 'xml' or 'png', got {self.annotation!r}.")
        for name in ("patch_size", "patches", "synthetic_tiles", "synthetic_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.patch_size % 8 or self.patch_size < 16:
            raise ValueError(f"patch_size must be a multiple of 8 and at least 16, got "
                             f"{self.patch_size}.")
        if not isinstance(self.eval_crop, int) or self.eval_crop < 0:
            raise ValueError(f"eval_crop must be 0 (whole tile) or a positive integer, got "
                             f"{self.eval_crop!r}.")
        try:
            levels = self.levels
        except (TypeError, ValueError, AttributeError):
            levels = ()
        if len(levels) < 2 or min(levels) < 1:
            raise ValueError(f"channels must name at least two positive channel counts, "
                             f"comma-separated ('16,32,64'), got {self.channels!r}.")

    @property
    def levels(self) -> tuple[int, ...]:
        """Return the U-Net's channels per level as integers."""
        return tuple(int(c) for c in self.channels.split(","))

    def input_shape(self) -> tuple[int, ...]:
        """Return ``(3, patch, patch)``: one RGB training patch."""
        return (3, self.patch_size, self.patch_size)
