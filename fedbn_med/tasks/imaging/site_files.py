"""Imaging site files: one TOML file per site in ``sites/<task>/``, validated once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedbn_med.tasks.abide.sites import read_site_file, site_path, site_seed_and_device, sites_dir

__all__ = ["ImagingSite", "available_imaging_sites", "check_imaging_sites",
           "load_imaging_site"]

_KEYS = {"name", "institution", "datalist", "split_seed", "device"}


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
    """

    name: str
    datalist: Path | None = None
    split_seed: int = 0
    device: str = "auto"
    institution: str = ""
    source: Path | None = None


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
    return ImagingSite(name=str(raw.get("name", name)), datalist=resolved, split_seed=seed,
                       device=device, institution=str(raw.get("institution", "")),
                       source=path)


def check_imaging_sites(task: str, names: Sequence[str], directory: Path | None = None) -> None:
    """Raise ``ValueError`` naming the valid sites when one of ``names`` has no site file."""
    for name in names:
        load_imaging_site(task, name, directory)
