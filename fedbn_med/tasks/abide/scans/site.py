"""A site whose file names scans (``scans = ...``): its ROI series, extracted once."""

from __future__ import annotations

from pathlib import Path

from fedbn_med.tasks.abide.scans.builtin import ensure_scan_site
from fedbn_med.tasks.abide.sites import BUILTIN_SCANS, SiteConfig

__all__ = ["site_rois_dir"]


def site_rois_dir(site: SiteConfig, *, site_effect: float = 1.0) -> Path:
    """Return the folder holding ``ABIDE_pcp/`` for a scan site, extracting it if needed.

    The built-in scan site is generated from the cohort model (on the stand-in atlas,
    marked as such). A folder of real scans is refused: its extraction needs the
    Harvard-Oxford atlas, given to ``pipelines/fmri_to_rois.py --atlas``.
    """
    if site.scans is None:
        raise ValueError(f"Site '{site.name}' names no scans.")
    site_id = site.abide_site_ids[0]
    if site.scans == BUILTIN_SCANS:
        return ensure_scan_site(site_id, site_effect=site_effect)
    raise ValueError(
        f"Site '{site.name}' names scans at {site.scans}, but ROI series of real scans need "
        "the Harvard-Oxford atlas, which the project does not ship: run pipelines/"
        f"fmri_to_rois.py --bids {site.scans} --atlas ho_mask_pad.nii.gz --out DIR, then set "
        "data_dir = DIR in the site file instead of scans.")
