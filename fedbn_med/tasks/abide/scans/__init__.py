"""A hospital's own fMRI scans: 4D BOLD images to PCP-format ROI time series.

:mod:`.inputs` finds the images (fMRIPrep derivatives or ABIDE ``func_preproc``), their
confounds, TR and diagnosis; :mod:`.transforms` is the MONAI chain (``LoadImaged``, a
check, resampling to the atlas, nilearn's ``NiftiLabelsMasker`` with ``filt_noglobal``
cleaning); :mod:`.atlas` holds the Harvard-Oxford label image; :mod:`.extract` runs a
site and :mod:`.writer` writes what ``--data-dir`` reads; :mod:`.builtin` generates the
built-in scan site (``sites/CITY.toml``) from the cohort model.
"""

from __future__ import annotations

from fedbn_med.tasks.abide.scans.atlas import derive_atlas, load_atlas
from fedbn_med.tasks.abide.scans.extract import ExtractionReport, extract_site
from fedbn_med.tasks.abide.scans.inputs import ScanInput, find_scans
from fedbn_med.tasks.abide.scans.transforms import (
    CheckBoldd,
    Cleaning,
    ExtractRoiSignalsd,
    ResampleToAtlasd,
    min_volumes,
    scan_transforms,
)
from fedbn_med.tasks.abide.scans.writer import SCANS_MANIFEST, write_site

__all__ = [
    "SCANS_MANIFEST",
    "CheckBoldd",
    "Cleaning",
    "ExtractRoiSignalsd",
    "ExtractionReport",
    "ResampleToAtlasd",
    "ScanInput",
    "derive_atlas",
    "extract_site",
    "find_scans",
    "load_atlas",
    "min_volumes",
    "scan_transforms",
    "write_site",
]
