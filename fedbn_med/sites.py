"""Site configuration: one TOML file per institution in ``sites/``, validated once."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from fedbn_med.paths import repo_root

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

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


def sites_dir() -> Path:
    """Return the folder of site files: ``$FEDBN_MED_SITES``, else the repository's ``sites/``."""
    env = os.environ.get("FEDBN_MED_SITES")
    return Path(env) if env else repo_root() / "sites"


def available_sites(directory: Path | None = None) -> list[str]:
    """Return the names of the configured sites, sorted."""
    directory = directory or sites_dir()
    return sorted(p.stem for p in directory.glob("*.toml"))


def _parse(path: Path) -> SiteConfig:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"Site file {path} is not valid TOML: {err}.") from err
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(
            f"Site file {path} has unknown keys {sorted(unknown)}. Valid keys: {sorted(_KEYS)}."
        )
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
    data_dir = raw.get("data_dir", "")
    if not isinstance(data_dir, str):
        raise ValueError(f"Site file {path}: 'data_dir' must be a string, got {data_dir!r}.")
    resolved = None
    if data_dir:
        resolved = Path(data_dir).expanduser()
        if not resolved.is_absolute():
            resolved = (path.parent / resolved).resolve()
    seed = raw.get("split_seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(
            f"Site file {path}: 'split_seed' must be a non-negative integer, got {seed!r}."
        )
    device = raw.get("device", "auto")
    if not isinstance(device, str) or not (
        device in ("auto", "cpu", "cuda") or device.startswith("cuda:")
    ):
        raise ValueError(
            f"Site file {path}: 'device' must be 'auto', 'cpu', 'cuda' or 'cuda:N', "
            f"got {device!r}."
        )
    return SiteConfig(
        name=name, abide_site_ids=tuple(ids), data_dir=resolved, split_seed=seed,
        device=device, institution=str(raw.get("institution", "")), source=path,
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
