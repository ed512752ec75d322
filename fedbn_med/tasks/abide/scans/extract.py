"""Extract a site's ROI time series from its scans and write them in the PCP layout.

:func:`extract_site` runs every subject through :func:`.transforms.scan_transforms`,
skips a subject whose files cannot be used (one warning each, naming the file) unless
more than ``max_bad_fraction`` of them fail, as the ``.1D`` loader does, and writes what
``--data-dir`` reads (:mod:`.writer`).
"""

from __future__ import annotations

import gc
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import nibabel as nib
import numpy as np
from monai.transforms import apply_transform
from threadpoolctl import threadpool_limits

from fedbn_med.tasks.abide.data.roi_files import DataFileError
from fedbn_med.tasks.abide.scans.atlas import STAND_IN, load_atlas
from fedbn_med.tasks.abide.scans.inputs import (
    ScanInput,
    find_scans,
    image_tr,
    read_confounds,
)
from fedbn_med.tasks.abide.scans.transforms import Cleaning, scan_transforms
from fedbn_med.tasks.abide.scans.writer import write_site
from fedbn_med.tasks.imaging.readers import ImageReadError, check_nifti_header

__all__ = ["MAX_SCAN_BYTES", "MAX_SCAN_VOXELS", "ExtractionReport", "extract_site"]

logger = logging.getLogger(__name__)

#: Largest 4D image extracted (voxels x volumes), checked from the header: 2**28, about
#: 990 volumes of the 3 mm MNI grid (61 x 73 x 61) or 245 of the 2 mm one (97 x 115 x 97).
MAX_SCAN_VOXELS = 2**28
#: Largest memory one image's extraction may need, estimated from its header as the
#: stored values plus 12 bytes a voxel (a float32 copy and a float64 one).
MAX_SCAN_BYTES = 4 * 2**30


@dataclass
class ExtractionReport:
    """What :func:`extract_site` wrote and skipped, and where its time went.

    Attributes
    ----------
    site : str
        The site name (its ``SITE_ID``).
    data_dir : pathlib.Path
        The folder holding ``ABIDE_pcp/`` (``--data-dir``).
    site_file : pathlib.Path
        The site TOML written next to it.
    written : list of str
        ``FILE_ID`` of every subject written.
    skipped : list of (str, str)
        File and reason of every subject left out.
    seconds : dict
        Seconds spent per step (``LoadImaged``, ``CheckBoldd``, ..., ``write``).
    """

    site: str
    data_dir: Path
    site_file: Path
    written: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def _root_cause(exc: BaseException) -> BaseException:
    while not isinstance(exc, DataFileError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _subject(scan: ScanInput, chain: Any, cleaning: Cleaning, seconds: dict[str, float]
             ) -> tuple[np.ndarray, dict[str, object]]:
    """Return one subject's ROI series and its phenotypic extras, or raise DataFileError."""
    if scan.problem is not None:
        raise DataFileError(*scan.problem)
    try:
        # The declared size is checked before LoadImaged allocates anything: the chain
        # holds the stored values, a float32 MetaTensor and nilearn's float64 copy.
        shape = check_nifti_header(scan.image, max_voxels=MAX_SCAN_VOXELS,
                                   max_bytes=MAX_SCAN_BYTES, working_bytes=12)
        header = nib.load(str(scan.image)).header
    except ImageReadError as exc:
        raise DataFileError(exc.path, exc.reason) from None
    except Exception as exc:  # nibabel raises several types for unreadable files
        raise DataFileError(scan.image, f"cannot be read as NIfTI ({exc}).") from exc
    extras: dict[str, object] = {}
    confounds = None
    if cleaning.confounds and scan.confounds is not None and len(shape) == 4:
        confounds, _, fd = read_confounds(scan.confounds, int(shape[3]))
        if np.isfinite(fd):
            extras["func_mean_fd"] = fd
    elif cleaning.confounds:
        logger.warning("%s: no confounds file; motion regression skipped for it.", scan.image)
    data: dict[str, Any] = {"image": str(scan.image), "source": str(scan.image),
                            "confounds": confounds, "tr": image_tr(scan.sidecar, header)}
    for transform in chain.transforms:
        start = time.perf_counter()
        try:
            data = cast(dict[str, Any], apply_transform(transform, data))
        except Exception as exc:
            cause = _root_cause(exc)
            if isinstance(cause, DataFileError):
                raise cause from None
            raise DataFileError(scan.image, f"{type(cause).__name__}: {cause}") from exc
        finally:
            name = type(transform).__name__
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
    extras["_tr"] = data["tr"]
    return data["image"], extras


def _extract_all(scans: list[ScanInput], chain: Any, cleaning: Cleaning,
                 seconds: dict[str, float], series: list[np.ndarray],
                 rows: list[dict[str, object]], skipped: list[tuple[str, str]]) -> None:
    for scan in scans:
        try:
            roi, extras = _subject(scan, chain, cleaning, seconds)
        except DataFileError as exc:
            logger.warning("Skipping %s: %s", exc.path, exc.reason)
            skipped.append((str(exc.path), exc.reason))
            continue
        series.append(roi)
        rows.append({"SUB_ID": scan.sub_id, "FILE_ID": scan.file_id,
                     "DX_GROUP": scan.dx_group, **scan.phenotype, **extras,
                     "_image": str(scan.image)})


def extract_site(
    scans_dir: str | Path,
    out: str | Path,
    *,
    site: str,
    cleaning: Cleaning | None = None,
    atlas: str | Path | None = None,
    tr: float | None = None,
    phenotypic: str | Path | None = None,
    max_bad_fraction: float = 0.2,
    institution: str = "",
) -> ExtractionReport:
    """Turn a site's 4D BOLD images into PCP ``rois_ho`` files, a table and a site TOML.

    Parameters
    ----------
    scans_dir : str or pathlib.Path
        fMRIPrep-style derivatives, or a folder of ABIDE ``*_func_preproc.nii.gz``.
    out : str or pathlib.Path
        Where ``ABIDE_pcp/`` and ``<site>.toml`` are written (``--data-dir``).
    site : str
        The site's name and ``SITE_ID``.
    cleaning : Cleaning, optional
        Default: motion (+WM/CSF) regression, detrending, band-pass 0.01-0.1 Hz.
    atlas : str or pathlib.Path, optional
        A Harvard-Oxford label image (e.g. PCP's ``ho_mask_pad.nii.gz``); default the
        6 mm stand-in, for the built-in scan site and tests: its output is marked as
        such (:mod:`.writer`) and a warning logged.
    tr : float, optional
        TR in seconds for images whose sidecar and header give none.
    phenotypic : str or pathlib.Path, optional
        The phenotypic CSV of ABIDE ``func_preproc`` input.
    max_bad_fraction : float, default=0.2
        Largest share of unusable subjects skipped before the site is refused.
    institution : str
        Written into the site TOML.

    Returns
    -------
    ExtractionReport

    Raises
    ------
    ValueError
        If more than ``max_bad_fraction`` of the subjects are unusable (the first five
        are listed), or the site name is not a valid ``SITE_ID``.
    FileNotFoundError
        If ``scans_dir`` holds no scans.
    """
    if not site or not site.replace("_", "").isalnum():
        raise ValueError(f"Site name must be letters, digits and '_', got {site!r}.")
    cleaning = cleaning or Cleaning()
    started = time.perf_counter()
    layout, scans = find_scans(scans_dir, site, phenotypic=phenotypic)
    if layout == "abide" and cleaning.confounds:
        logger.info("ABIDE func_preproc input has no confounds file: nuisance regression "
                    "is skipped (those images were already cleaned by C-PAC).")
        cleaning = Cleaning(confounds=False, detrend=cleaning.detrend,
                            band_pass=cleaning.band_pass)
    if atlas is None:
        logger.warning("%s: no atlas given: ROI series are computed on the %s and marked so "
                       "(manifest atlas_stand_in, rois_atlas column); they are not rois_ho "
                       "series of real scans.", site, STAND_IN)
    chain = scan_transforms(load_atlas(atlas), cleaning, default_tr=tr)
    seconds: dict[str, float] = defaultdict(float)
    series: list[np.ndarray] = []
    rows: list[dict[str, object]] = []
    skipped: list[tuple[str, str]] = []
    # nilearn calls gc.collect() several times per image, which walks every object torch
    # and MONAI created (about 0.3 s a call here); frozen objects are not walked.
    gc.freeze()
    try:
        with threadpool_limits(1, "blas"):  # threaded BLAS only slows these products
            _extract_all(scans, chain, cleaning, seconds, series, rows, skipped)
    finally:
        gc.unfreeze()
    if skipped and len(skipped) / len(scans) > max_bad_fraction:

        listed = "\n  ".join(f"{p}: {r}" for p, r in skipped[:5])
        raise ValueError(
            f"{len(skipped)} of {len(scans)} scans of site {site} are unusable "
            f"({len(skipped) / len(scans):.0%}), more than max_bad_fraction="
            f"{max_bad_fraction:g}:\n  {listed}")
    start = time.perf_counter()
    data_dir, site_file = write_site(
        out, site, rows, series, skipped=skipped, cleaning=cleaning, source=Path(scans_dir),
        atlas=str(atlas) if atlas else STAND_IN, layout=layout,
        institution=institution)
    seconds["write"] = time.perf_counter() - start
    seconds["total"] = time.perf_counter() - started
    logger.info("%s: %d of %d subjects written to %s (cleaning: %s) in %.1f s.", site,
                len(rows), len(scans), data_dir, cleaning.describe(), seconds["total"])
    return ExtractionReport(site=site, data_dir=data_dir, site_file=site_file,
                            written=[str(r["FILE_ID"]) for r in rows], skipped=skipped,
                            seconds=dict(seconds))
