"""ABIDE site configuration: one TOML file per institution in ``sites/``, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedbn_med.tasks.site_toml import read_site_file, site_path, site_seed_and_device, sites_dir

__all__ = ["SiteConfig", "available_sites", "load_site", "load_sites", "sites_dir"]

_KEYS = {"name", "institution", "abide_site_ids", "data_dir", "split_seed", "device"}


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
    """

    name: str
    abide_site_ids: tuple[str, ...]
    data_dir: Path | None = None
    split_seed: int = 0
    device: str = "auto"
    institution: str = ""
    source: Path | None = None


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
    return SiteConfig(
        name=name, abide_site_ids=tuple(ids), data_dir=site_path(raw, "data_dir", path),
        split_seed=seed, device=device, institution=str(raw.get("institution", "")),
        source=path,
    )


def load_site(name: str, directory: Path | None = None) -> SiteConfig:
    """Load and validate ``sites/<name>.toml``; an unknown name lists the valid ones."""
    directory = directory or sites_dir()
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
