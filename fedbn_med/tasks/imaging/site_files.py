"""Imaging site files: one TOML file per site in ``sites/<task>/``, validated once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbn_med.fl.privacy import SitePrivacy, UpdatePrivacy, resolve_privacy
from fedbn_med.tasks.site_toml import (
    DP_KEYS,
    read_site_file,
    site_path,
    site_privacy,
    site_seed_and_device,
    sites_dir,
)

__all__ = ["ImagingSite", "available_imaging_sites", "check_imaging_sites",
           "load_imaging_site", "site_dp"]

_KEYS = {"name", "institution", "datalist", "split_seed", "device", "datalist_outside_root",
         *DP_KEYS}


@dataclass(frozen=True)
class ImagingSite:
    """A validated imaging site.

    Attributes
    ----------
    name : str
        Site name used across the federation (``"SiteA"``).
    datalist : pathlib.Path or None
        The site's MONAI-style JSON datalist; None means the built-in synthetic site.
    split_seed : int
        Seed of the split when the datalist has no validation/test lists.
    device : str
        ``"auto"``, ``"cpu"`` or ``"cuda[:N]"``.
    privacy : SitePrivacy or None
        Client-level DP the site demands whatever the run asks (``dp_noise`` floor,
        ``dp_delta`` ceiling, ``dp_clip``).
    datalist_outside_root : bool
        Whether the datalist may name files outside its own folder (default no).
    """

    name: str
    datalist: Path | None = None
    split_seed: int = 0
    device: str = "auto"
    institution: str = ""
    source: Path | None = None
    privacy: SitePrivacy | None = None
    datalist_outside_root: bool = False


def _folder(task: str, directory: Path | None) -> Path:
    return directory if directory is not None else sites_dir() / task


def available_imaging_sites(task: str, directory: Path | None = None) -> list[str]:
    """Return the configured site names of a task (``sites/<task>/*.toml``), sorted."""
    return sorted(p.stem for p in _folder(task, directory).glob("*.toml"))


def load_imaging_site(task: str, name: str, directory: Path | None = None) -> ImagingSite:
    """Load and validate ``sites/<task>/<name>.toml``; an unknown name lists the valid ones."""
    folder = _folder(task, directory)
    path = folder / f"{name}.toml"
    if not path.is_file():
        valid = available_imaging_sites(task, directory)
        raise ValueError(f"Unknown {task} site '{name}'. Valid sites: "
                         f"{', '.join(valid) or '(none)'} (one TOML file per site in {folder}).")
    raw = read_site_file(path, _KEYS)
    resolved = site_path(raw, "datalist", path)
    seed, device = site_seed_and_device(raw, path)
    outside = raw.get("datalist_outside_root", False)
    if not isinstance(outside, bool):
        raise ValueError(f"Site file {path}: 'datalist_outside_root' must be true or false, "
                         f"got {outside!r}.")
    return ImagingSite(name=str(raw.get("name", name)), datalist=resolved, split_seed=seed,
                       device=device, institution=str(raw.get("institution", "")),
                       source=path, privacy=site_privacy(raw, path),
                       datalist_outside_root=outside)


def site_dp(site: ImagingSite, config: Any) -> UpdatePrivacy | None:
    """Return the site's effective client-level DP: the run's, never below its file's.

    Raises ``ValueError`` when the result would spend an infinite epsilon.
    """
    privacy = resolve_privacy(config.privacy(), site.privacy, site.name)
    if privacy is not None:
        privacy.check(config.rounds, who=f"Site {site.name} ({config.rounds} rounds)")
    return privacy


def check_imaging_sites(task: str, names: Sequence[str], directory: Path | None = None) -> None:
    """Raise ``ValueError`` naming the valid sites when one of ``names`` has no site file."""
    for name in names:
        load_imaging_site(task, name, directory)
