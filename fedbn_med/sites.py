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


def read_site_file(path: Path, valid_keys: set[str]) -> dict[str, object]:
    """Read a site TOML file, refusing broken TOML and unknown keys."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"Site file {path} is not valid TOML: {err}.") from err
    unknown = set(raw) - valid_keys
    if unknown:
        raise ValueError(
            f"Site file {path} has unknown keys {sorted(unknown)}. "
            f"Valid keys: {sorted(valid_keys)}."
        )
    return raw


def site_path(raw: dict[str, object], key: str, path: Path) -> Path | None:
    """Return a path entry resolved from the site file's folder (None when empty)."""
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"Site file {path}: '{key}' must be a string, got {value!r}.")
    if not value:
        return None
    resolved = Path(value).expanduser()
    return resolved if resolved.is_absolute() else (path.parent / resolved).resolve()


def site_seed_and_device(raw: dict[str, object], path: Path) -> tuple[int, str]:
    """Return the validated ``split_seed`` and ``device`` entries."""
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
    return seed, device


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
