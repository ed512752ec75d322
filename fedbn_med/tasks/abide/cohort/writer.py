"""Write a built-in, seeded ABIDE-format cohort; find it again by its parameters.

The cohort is written in the exact ABIDE Preprocessed (PCP) layout that
:func:`nilearn.datasets.fetch_abide_pcp` reads offline::

    <data_dir>/ABIDE_pcp/Phenotypic_V1_0b_preprocessed1.csv
    <data_dir>/ABIDE_pcp/cpac/filt_noglobal/<FILE_ID>_rois_ho.1D

so the whole pipeline (selection, QC filter, nilearn reader, features) runs on it as on
the real release. Subject counts, diagnosis split, quality-control failures, files
without data (``no_filename``), age, sex, head motion, volumes and TR follow the real
per-site figures in :data:`SITE_FIGURES` (computed from the real phenotypic table).

How each subject's signal is drawn: :mod:`.signal`; the phenotypes: :mod:`.phenotypes`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from fedbn_med.paths import resolve_data_dir
from fedbn_med.tasks.abide.cohort.figures import DEFAULT_SITE_IDS, SITE_FIGURES
from fedbn_med.tasks.abide.cohort.phenotypes import _site_rows
from fedbn_med.tasks.abide.cohort.signal import (
    _build_scanner,
    _build_template,
    _site_seed,
    _subject_series,
)
from fedbn_med.tasks.abide.cohort.signal_v3 import (
    build_scanner_v3,
    build_template_v3,
    subject_series_v3,
)
from fedbn_med.tasks.abide.data.atlas import HO_LABELS, ZERO_ROI_INDEX
from fedbn_med.tasks.abide.data.layout import (
    COHORT_MANIFEST_FILENAME,
    DATASET_DIRNAME,
    NO_FILENAME,
    PHENOTYPIC_FILENAME,
)
from fedbn_med.tasks.abide.settings import COHORT_VERSION, MAX_COHORT_SCALE

__all__ = [
    "COHORT_VERSION",
    "COHORT_VERSIONS",
    "MANIFEST_FILENAME",
    "MAX_SUBJECTS_SCALE",
    "COHORT_SEED_ENV_VAR",
    "cohort_key",
    "cohort_seed",
    "ensure_cohort",
    "generate_cohort",
]

logger = logging.getLogger(__name__)

MANIFEST_FILENAME = COHORT_MANIFEST_FILENAME
_PIPELINE, _STRATEGY, _DERIVATIVE = "cpac", "filt_noglobal", "rois_ho"
MAX_SUBJECTS_SCALE = MAX_COHORT_SCALE
#: Generator versions this module can still write (2 stays reproducible for old results).
COHORT_VERSIONS = ("2", "3")
#: Environment variable holding the built-in cohort's seed when none is given.
COHORT_SEED_ENV_VAR = "FEDBN_MED_COHORT_SEED"

# The manifest and the cohort key name the generator by its first module path; kept as
# it was so that cohorts generated before the move stay valid and keep their directory.
_GENERATOR = "fedbn_med.data.cohort"


def _write_1d(path: Path, series: np.ndarray) -> None:
    header = "\t".join(f"#{label}" for label in HO_LABELS)
    row = "\t".join(["%.6f"] * series.shape[1]) + "\n"
    body = (row * series.shape[0]) % tuple(series.ravel())
    path.write_text(header + "\n" + body, encoding="utf-8")


def _write_phenotypic(path: Path, rows: list[dict[str, object]]) -> None:
    table = pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    table = table.sort_values("SUB_ID", kind="stable").reset_index(drop=True)
    n = len(table)
    table.insert(0, "Unnamed: 0", np.arange(1, n + 1))
    table.insert(2, "X", np.arange(1, n + 1))
    table.insert(3, "subject", table["SUB_ID"])
    table.to_csv(path, index=True, float_format="%.10g")


def _validate_parameters(sites: Sequence[str], seed: int, site_effect: float,
                         n_subjects_scale: float, version: str = COHORT_VERSION
                         ) -> tuple[str, ...]:
    ids = (sites,) if isinstance(sites, str) else tuple(sites)
    unknown = [s for s in ids if s not in SITE_FIGURES]
    if not ids or unknown:
        raise ValueError(
            f"Expected one or more built-in sites, got {list(ids)!r}"
            + (f" (unknown: {', '.join(map(repr, unknown))})" if unknown else "")
            + f". Valid sites: {', '.join(SITE_FIGURES)}."
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"Expected each site once, got {list(ids)!r}.")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
    if not (isinstance(site_effect, (int, float)) and math.isfinite(site_effect)
            and site_effect >= 0):
        raise ValueError(f"site_effect must be a finite number >= 0, got {site_effect!r}.")
    if not (isinstance(n_subjects_scale, (int, float))
            and 0 < n_subjects_scale <= MAX_SUBJECTS_SCALE):
        raise ValueError(f"n_subjects_scale must lie in (0, {MAX_SUBJECTS_SCALE:g}], "
                         f"got {n_subjects_scale!r}.")
    if version not in COHORT_VERSIONS:
        raise ValueError(f"Unknown cohort version {version!r}. Valid versions: "
                         f"{', '.join(COHORT_VERSIONS)}.")
    return ids


def _parameters(ids: tuple[str, ...], seed: int, site_effect: float,
                n_subjects_scale: float, version: str) -> dict[str, object]:
    return {
        "generator": _GENERATOR,
        "version": version,
        "sites": list(ids),
        "seed": int(seed),
        "site_effect": float(site_effect),
        "n_subjects_scale": float(n_subjects_scale),
    }


def cohort_key(
    *,
    sites: Sequence[str] = DEFAULT_SITE_IDS,
    seed: int = 0,
    site_effect: float = 1.0,
    n_subjects_scale: float = 1.0,
    version: str = COHORT_VERSION,
) -> str:
    """Return the directory name that identifies a built-in cohort's parameters.

    Parameters
    ----------
    sites, seed, site_effect, n_subjects_scale, version
        As in :func:`generate_cohort`.

    Returns
    -------
    str
        E.g. ``"seed0-effect1-scale1-3f2a9c1e"`` (the suffix hashes sites and version).
    """
    ids = _validate_parameters(sites, seed, site_effect, n_subjects_scale, version)
    digest = hashlib.sha256(json.dumps(
        _parameters(ids, seed, site_effect, n_subjects_scale, version),
        sort_keys=True).encode()).hexdigest()[:8]
    return f"v{version}-seed{seed}-effect{site_effect:g}-scale{n_subjects_scale:g}-{digest}"


def generate_cohort(
    data_dir: str | Path,
    *,
    sites: Sequence[str] = DEFAULT_SITE_IDS,
    seed: int = 0,
    site_effect: float = 1.0,
    n_subjects_scale: float = 1.0,
    version: str = COHORT_VERSION,
) -> Path:
    """Write a seeded ABIDE-format cohort into ``data_dir/ABIDE_pcp``, unless it is there.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Directory that will contain ``ABIDE_pcp/``.
    sites : sequence of str, default=DEFAULT_SITE_IDS
        ABIDE SITE_IDs among :data:`SITE_FIGURES`.
    seed : int, default=0
        Seed of the whole simulated world (template, scanners, subjects).
    site_effect : float, default=1.0
        Strength of every site effect; 0 gives sites identical feature distributions.
    n_subjects_scale : float, default=1.0
        Multiplies every per-site count (at least two QC-passing subjects per class).
    version : str, default=COHORT_VERSION
        Generator version, one of :data:`COHORT_VERSIONS` (3: drawn from the figures
        measured on the real shared sites, :mod:`.signal_v3`; 2: :mod:`.signal`).

    Returns
    -------
    pathlib.Path
        ``data_dir``, ready for :func:`fedbn_med.tasks.abide.data.load_site_features`.

    Raises
    ------
    ValueError
        For invalid parameters, if ``data_dir`` holds a cohort made with other
        parameters, or an ``ABIDE_pcp`` folder this module did not write.
    """
    ids = _validate_parameters(sites, seed, site_effect, n_subjects_scale, version)
    params = _parameters(ids, seed, site_effect, n_subjects_scale, version)
    root = Path(data_dir).expanduser().absolute()
    target = root / DATASET_DIRNAME
    if _existing_matches(target, params):
        logger.debug("Cohort already present in %s", target)
        return root
    started = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{DATASET_DIRNAME}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        # Threaded BLAS only slows the many small per-subject products down.
        with threadpool_limits(1, "blas"):
            counts = _write_cohort(staging, ids, seed, site_effect, n_subjects_scale, version)
        (staging / MANIFEST_FILENAME).write_text(
            json.dumps({**params, "subjects": counts}, indent=2), encoding="utf-8")
        try:
            staging.rename(target)
        except OSError:
            # Another process finished first: accept its result if it matches.
            if not _existing_matches(target, params):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("Generated ABIDE-format cohort %s (%s) in %s in %.1f s",
                ", ".join(f"{s}={n}" for s, n in counts.items()), ", ".join(ids), target,
                time.perf_counter() - started)
    return root


def _existing_matches(target: Path, params: dict[str, object]) -> bool:
    manifest = target / MANIFEST_FILENAME
    if manifest.is_file():
        found = json.loads(manifest.read_text(encoding="utf-8"))
        found_params = {k: found.get(k) for k in params}
        if found_params == params:
            return True
        raise ValueError(
            f"{target} holds a cohort generated with other parameters: {found_params}; "
            f"requested {params}. Use another data_dir, or ensure_cohort(), which keeps one "
            "directory per parameter set."
        )
    if target.exists():
        raise ValueError(
            f"{target} exists but is not a fedbn_med cohort (no {MANIFEST_FILENAME}); "
            "refusing to write into it. Use an empty data_dir for the built-in cohort."
        )
    return False


def _write_cohort(staging: Path, ids: tuple[str, ...], seed: int, site_effect: float,
                  scale: float, version: str) -> dict[str, int]:
    v3 = version == "3"
    template = build_template_v3(seed) if v3 else _build_template(seed)
    series_dir = staging / _PIPELINE / _STRATEGY
    series_dir.mkdir(parents=True)
    rows: list[dict[str, object]] = []
    counts: dict[str, int] = {}
    for site_id in sorted(ids, key=list(SITE_FIGURES).index):
        figures = SITE_FIGURES[site_id]
        scanner = (build_scanner_v3(template, figures, seed, site_effect) if v3  # type: ignore[arg-type]
                   else _build_scanner(template, figures, seed, site_effect))  # type: ignore[arg-type]
        # Real SUB_ID ranges are disjoint; larger cohorts move to their own blocks.
        first = (figures.first_sub_id if scale <= 1.0
                 else 60000 + 1000 * list(SITE_FIGURES).index(site_id))
        # v3's scanner has v2's fields that _site_rows reads (the motion level).
        site_rows: list[dict[str, Any]] = _site_rows(
            figures, scanner, seed, scale, first)  # type: ignore[arg-type]
        for row in site_rows:
            if row["FILE_ID"] == NO_FILENAME:
                continue
            rng = np.random.default_rng([seed, _site_seed(site_id), 3, int(row["_index"])])
            kwargs = {"asd": row["DX_GROUP"] == 1, "mean_fd": float(row["func_mean_fd"]),
                      "n_volumes": int(row["_n_volumes"])}
            series = (subject_series_v3(template, scanner, rng, female=row["SEX"] == 2,  # type: ignore[arg-type]
                                        **kwargs) if v3
                      else _subject_series(template, scanner, rng, **kwargs))  # type: ignore[arg-type]
            if row["_zero_roi"]:
                series[:, ZERO_ROI_INDEX] = 0.0
            _write_1d(series_dir / f"{row['FILE_ID']}_{_DERIVATIVE}.1D", series)
        counts[site_id] = sum(r["FILE_ID"] != NO_FILENAME for r in site_rows)
        rows.extend(site_rows)
    _write_phenotypic(staging / PHENOTYPIC_FILENAME, rows)
    return counts


def cohort_seed(seed: int | None = None) -> int:
    """Return the built-in cohort's seed: the argument, else ``$FEDBN_MED_COHORT_SEED``, else 0.

    Raises
    ------
    ValueError
        If the environment variable is not a non-negative integer.
    """
    if seed is not None:
        return seed
    text = os.environ.get(COHORT_SEED_ENV_VAR, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"{COHORT_SEED_ENV_VAR} must be a non-negative integer (the built-in "
                         f"cohort's seed), got {text!r}.")
    return int(text)


def ensure_cohort(
    data_dir: str | Path | None = None,
    *,
    sites: Sequence[str] = DEFAULT_SITE_IDS,
    seed: int | None = None,
    site_effect: float = 1.0,
    n_subjects_scale: float = 1.0,
    version: str = COHORT_VERSION,
) -> Path:
    """Return a directory holding the built-in cohort for these parameters, made if needed.

    Parameters
    ----------
    data_dir : str or pathlib.Path or None, default=None
        Base data directory, resolved by :func:`fedbn_med.paths.resolve_data_dir`.
    seed : int or None, default=None
        As in :func:`generate_cohort`; None: :func:`cohort_seed` (``$FEDBN_MED_COHORT_SEED``
        or 0), so that every run of the pipeline can draw another cohort world.
    sites, site_effect, n_subjects_scale, version
        As in :func:`generate_cohort`.

    Returns
    -------
    pathlib.Path
        ``<data_dir>/builtin/<cohort_key(...)>``, which contains ``ABIDE_pcp/``.
    """
    seed = cohort_seed(seed)
    key = cohort_key(sites=sites, seed=seed, site_effect=site_effect,
                     n_subjects_scale=n_subjects_scale, version=version)
    root = resolve_data_dir(data_dir) / "builtin" / key
    return generate_cohort(root, sites=sites, seed=seed, site_effect=site_effect,
                           n_subjects_scale=n_subjects_scale, version=version)
