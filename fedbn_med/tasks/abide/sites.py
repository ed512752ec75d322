"""ABIDE site configuration: one TOML file per institution in ``sites/``, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedbn_med.federation.names import check_name
from fedbn_med.fl.privacy import SitePrivacy
from fedbn_med.tasks.site_toml import (
    DP_KEYS,
    read_site_file,
    site_path,
    site_privacy,
    site_seed_and_device,
    sites_dir,
)

__all__ = [
    "ABIDE_I_SITE_IDS", "BUILTIN_SCANS", "SiteConfig", "available_sites", "load_site",
    "load_sites", "sites_dir",
]

_KEYS = {"name", "institution", "abide_site_ids", "data_dir", "scans", "split_seed", "device",
         *DP_KEYS}

#: Every ``SITE_ID`` of the ABIDE I phenotypic table (the PCP release); ``sites/`` holds a
#: file for each, so that a federation can be formed from any of them.
ABIDE_I_SITE_IDS: tuple[str, ...] = (
    "CALTECH", "CMU", "KKI", "LEUVEN_1", "LEUVEN_2", "MAX_MUN", "NYU", "OHSU", "OLIN",
    "PITT", "SBL", "SDSU", "STANFORD", "TRINITY", "UCLA_1", "UCLA_2", "UM_1", "UM_2", "USM",
    "YALE",
)

#: The ``scans`` value of the built-in scan site (generated from the cohort model).
BUILTIN_SCANS = "builtin"


@dataclass(frozen=True)
class SiteConfig:
    """A validated site configuration.

    Attributes
    ----------
    name : str
        Short institution name used across the federation (``"UCLA"``).
    abide_site_ids : tuple of str
        ABIDE ``SITE_ID`` values this institution contributes (``("UCLA_1",)``).
    data_dir : pathlib.Path or None
        Folder holding ``ABIDE_pcp/``; None means the built-in cohort.
    split_seed : int
        Seed of the site's data split.
    device : str
        ``"auto"``, ``"cpu"`` or ``"cuda[:N]"``.
    privacy : SitePrivacy or None
        Client-level DP the site demands whatever the run asks (``dp_noise`` floor,
        ``dp_delta`` ceiling, ``dp_clip``).
    scans : pathlib.Path or "builtin" or None
        A folder of 4D BOLD images (fMRIPrep derivatives or ABIDE ``func_preproc``)
        whose ROI series are extracted on first use, ``"builtin"`` for the built-in scan
        site, or None: the site has ROI files already.
    """

    name: str
    abide_site_ids: tuple[str, ...]
    data_dir: Path | None = None
    split_seed: int = 0
    device: str = "auto"
    institution: str = ""
    source: Path | None = None
    scans: Path | Literal["builtin"] | None = None
    privacy: SitePrivacy | None = None


def available_sites(directory: Path | None = None) -> list[str]:
    """Return the names of the configured sites, sorted."""
    directory = directory or sites_dir()
    return sorted(p.stem for p in directory.glob("*.toml"))


def _parse(path: Path) -> SiteConfig:
    raw = read_site_file(path, _KEYS)
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ValueError(f"Site file {path}: 'name' must be a non-empty string, got {name!r}.")
    ids = raw.get("abide_site_ids")
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, str) and i for i in ids)):
        raise ValueError(
            f"Site file {path}: 'abide_site_ids' must be a non-empty list of ABIDE SITE_ID "
            f"strings such as [\"UCLA_1\"], got {ids!r}."
        )
    seed, device = site_seed_and_device(raw, path)
    # a site claims only its own subjects: another site's would be read as its own
    others = [i for i in ids if i != name and not i.startswith(f"{name}_")]
    if others:
        raise ValueError(
            f"Site file {path}: site '{name}' claims ABIDE site ids {others}, which are not "
            f"its own; a site claims only '{name}' or '{name}_<n>' (e.g. UM_1 and UM_2 "
            "for UM).")
    scans: Path | Literal["builtin"] | None = (
        "builtin" if raw.get("scans") == BUILTIN_SCANS else site_path(raw, "scans", path))
    return SiteConfig(
        name=name, abide_site_ids=tuple(ids), data_dir=site_path(raw, "data_dir", path),
        split_seed=seed, device=device, institution=str(raw.get("institution", "")),
        source=path, privacy=site_privacy(raw, path), scans=scans,
    )


def load_site(name: str, directory: Path | None = None) -> SiteConfig:
    """Load and validate ``sites/<name>.toml``; an unknown name lists the valid ones."""
    directory = directory or sites_dir()
    check_name(name, why=f"it names its file in {directory}")
    path = directory / f"{name}.toml"
    if not path.is_file():
        valid = available_sites(directory)
        raise ValueError(
            f"Unknown site '{name}'. Valid sites: {', '.join(valid) or '(none)'} "
            f"(one TOML file per site in {directory})."
        )
    return _parse(path)


def load_sites(names: list[str] | tuple[str, ...], directory: Path | None = None
               ) -> dict[str, SiteConfig]:
    """Load several sites, refusing duplicates."""
    if len(set(names)) != len(names):
        raise ValueError(f"Site list {list(names)} names a site twice.")
    if not names:
        raise ValueError("No site given; name at least one, e.g. --sites NYU,UM.")
    return {n: load_site(n, directory) for n in names}
