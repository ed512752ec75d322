"""A site whose file names scans (``scans = ...``): its ROI series, extracted once."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fedbn_med.paths import resolve_data_dir
from fedbn_med.tasks.abide.scans.builtin import ensure_scan_site
from fedbn_med.tasks.abide.scans.extract import extract_site
from fedbn_med.tasks.abide.scans.writer import SCANS_MANIFEST
from fedbn_med.tasks.abide.sites import BUILTIN_SCANS, SiteConfig

__all__ = ["site_rois_dir"]


def site_rois_dir(site: SiteConfig, *, site_effect: float = 1.0) -> Path:
    """Return the folder holding ``ABIDE_pcp/`` for a scan site, extracting it if needed.

    The built-in scan site is generated from the cohort model; a folder of scans is
    extracted with the default cleaning into ``<data_dir>/scans/<name>-<hash>/rois``
    (delete that folder, or run ``pipelines/fmri_to_rois.py``, to extract again).
    """
    if site.scans is None:
        raise ValueError(f"Site '{site.name}' names no scans.")
    site_id = site.abide_site_ids[0]
    if site.scans == BUILTIN_SCANS:
        return ensure_scan_site(site_id, site_effect=site_effect)
    digest = hashlib.sha256(str(site.scans).encode()).hexdigest()[:8]
    rois = resolve_data_dir() / "scans" / f"{site.name}-{digest}" / "rois"
    if not (rois / "ABIDE_pcp" / SCANS_MANIFEST).is_file():
        extract_site(site.scans, rois, site=site_id, institution=site.institution)
    return rois
