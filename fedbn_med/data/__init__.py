"""Data layer: the ABIDE loader, the built-in ABIDE-format cohort, per-site splits."""

from __future__ import annotations

from fedbn_med.data.abide import (
    FEDBN_INSTITUTIONS,
    DataFileError,
    SiteFeatures,
    check_abide_files,
    load_abide,
    load_site_features,
)
from fedbn_med.data.cohort import (
    DEFAULT_SITE_IDS,
    SITE_FIGURES,
    SiteFigures,
    ensure_cohort,
    generate_cohort,
)
from fedbn_med.data.splits import Split, site_splits

__all__ = [
    "DEFAULT_SITE_IDS",
    "FEDBN_INSTITUTIONS",
    "SITE_FIGURES",
    "DataFileError",
    "SiteFeatures",
    "SiteFigures",
    "Split",
    "check_abide_files",
    "ensure_cohort",
    "generate_cohort",
    "load_abide",
    "load_site_features",
    "site_splits",
]
