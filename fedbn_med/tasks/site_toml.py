"""Read one site's TOML file, the part every task's site configuration shares.

Each task parses its own keys (``fedbn_med.tasks.<task>.sites`` or ``site_files``); the
folder of site files, the TOML reading with its refusal of unknown keys, path entries
resolved from the file's own folder, and the ``split_seed`` and ``device`` entries are
the same for all, and live here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fedbn_med.paths import repo_root

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["read_site_file", "site_path", "site_seed_and_device", "sites_dir"]


def sites_dir() -> Path:
    """Return the folder of site files: ``$FEDBN_MED_SITES``, else the repository's ``sites/``."""
    env = os.environ.get("FEDBN_MED_SITES")
    return Path(env) if env else repo_root() / "sites"


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
