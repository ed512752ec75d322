"""The on-disk feature cache: one ``.npz`` per site, keyed by everything it came from.

The key hashes the feature version, the loader's options, the built-in cohort's version
(for a generated cohort), and the size and modification time of the phenotypic table and
of every selected ROI file, so a changed input is never served from a stale cache.
Writes go through a temporary file and a rename.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fedbn_med.tasks.abide.data.features import SiteFeatures
from fedbn_med.tasks.abide.data.layout import (
    COHORT_MANIFEST_FILENAME,
    DATASET_DIRNAME,
    _phenotypic_path,
)

__all__ = ["FEATURES_VERSION", "load_arrays", "save_arrays", "window_cache_path"]

# Bump when the feature computation changes, so stale caches are not reused.
FEATURES_VERSION = "1"
_CACHE_DIRNAME = "cache"

logger = logging.getLogger(__name__)


def _stat(path: Path) -> list[object]:
    info = path.stat()
    return [str(path), info.st_size, info.st_mtime_ns]


def cohort_version(root: Path) -> str | None:
    """Return the version of the built-in cohort in ``root`` (None for other data)."""
    manifest = root / DATASET_DIRNAME / COHORT_MANIFEST_FILENAME
    try:
        return str(json.loads(manifest.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_key(root: Path, selected: pd.DataFrame, options: Mapping[str, object]) -> str:
    payload = {
        "version": FEATURES_VERSION,
        "cohort": cohort_version(root),
        "options": dict(options),
        "phenotypic": _stat(_phenotypic_path(root)),
        "files": [_stat(Path(p)) for p in selected["path"]],
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _cache_path(root: Path, site: str, selected: pd.DataFrame,
                options: Mapping[str, object]) -> Path:
    """Return where the features of ``site`` for these inputs are cached."""
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", site)
    return root / _CACHE_DIRNAME / f"abide_{safe}_{_cache_key(root, selected, options)}.npz"


def _save_cache(path: Path, result: SiteFeatures, skipped: Sequence[tuple[str, str]]) -> None:
    save_arrays(path, {
        "site": np.array(result.site),
        "features": result.features,
        "labels": result.labels,
        "subject_ids": np.asarray(result.subject_ids, dtype=np.int64),
        "file_ids": np.asarray(result.file_ids, dtype=str),
        "abide_site_ids": np.asarray(result.abide_site_ids, dtype=str),
        "mean_fd": result.mean_fd,
        "roi_labels": np.asarray(result.roi_labels, dtype=str),
        "skipped": np.asarray(skipped, dtype=str).reshape(-1, 2),
    })


def _load_cache(path: Path) -> tuple[SiteFeatures, list[tuple[str, str]]]:
    with np.load(path, allow_pickle=False) as data:
        result = SiteFeatures(
            site=str(data["site"]),
            features=data["features"],
            labels=data["labels"],
            subject_ids=tuple(int(s) for s in data["subject_ids"]),
            file_ids=tuple(str(s) for s in data["file_ids"]),
            abide_site_ids=tuple(str(s) for s in data["abide_site_ids"]),
            mean_fd=data["mean_fd"],
            roi_labels=tuple(str(s) for s in data["roi_labels"]),
        )
        skipped = [(str(a), str(b)) for a, b in data["skipped"]]
    return result, skipped


def window_cache_path(root: Path, site: str, selected: pd.DataFrame,
                      options: Mapping[str, object]) -> Path:
    """Return where a site's window rows for these inputs and options are cached.

    Keyed as the features are (every selected ROI file's size and modification time,
    the phenotypic table, the built-in cohort's version) and by ``options``.
    """
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", site)
    return root / _CACHE_DIRNAME / f"abide_windows_{safe}_{_cache_key(root, selected, options)}.npz"


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` (``.npz``) atomically; an unwritable cache is skipped.

    Written beside the target, then renamed: a reader never sees a half-written cache.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
    except OSError as exc:  # a read-only data folder: compute every time, as before
        logger.warning("Not caching %s (%s).", path, exc)
        return
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)  # type: ignore[arg-type]  # numpy's stub: allow_pickle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_arrays(path: Path, keys: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Return the ``keys`` arrays of a cache file; None when absent, unreadable or partial."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.array(data[k]) for k in keys}
    except (OSError, ValueError, KeyError, EOFError) as exc:
        logger.warning("Ignoring unreadable cache %s (%s); recomputing.", path, exc)
        return None
