"""Turn a site's 4D fMRI into the ROI time series, table and site file --data-dir reads.

Input: fMRIPrep-style derivatives (sub-*/func/*_space-MNI152*_desc-preproc_bold.nii.gz,
confounds, sidecars, participants.tsv) or ABIDE *_func_preproc.nii.gz files with their
phenotypic CSV. Output: <out>/ABIDE_pcp/ (PCP rois_ho layout) and <out>/<SITE>.toml.
Real scans need --atlas (PCP's ho_mask_pad.nii.gz); --stand-in-atlas runs on the built-in
stand-in instead, for trials on synthetic scans, and marks everything it writes as such.
"""

from __future__ import annotations

import argparse
import logging

from fedbn_med.cli.argtypes import absolute_path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, extract the site and print what was written."""
    p = argparse.ArgumentParser(prog="fmri_to_rois.py", description=__doc__.splitlines()[0])
    p.add_argument("--bids", type=absolute_path, required=True,
                   help="derivatives or func_preproc folder")
    p.add_argument("--out", type=absolute_path, required=True, help="folder to write (--data-dir)")
    p.add_argument("--site", help="site name and SITE_ID (default: the folder's name)")
    p.add_argument("--no-clean", action="store_true", help="plain ROI means, no cleaning")
    p.add_argument("--no-confounds", action="store_true", help="skip nuisance regression")
    p.add_argument("--no-detrend", action="store_true", help="skip linear detrending")
    p.add_argument("--no-band-pass", action="store_true", help="skip the 0.01-0.1 Hz band-pass")
    p.add_argument("--tr", type=float, help="TR (s) for images with none in sidecar or header")
    atlas = p.add_mutually_exclusive_group()
    atlas.add_argument("--atlas", type=absolute_path,
                       help="Harvard-Oxford label image (ho_mask_pad.nii.gz)")
    atlas.add_argument("--stand-in-atlas", action="store_true",
                       help="use the built-in 6 mm stand-in (synthetic scans only; marked)")
    p.add_argument("--phenotypic", type=absolute_path,
                   help="phenotypic CSV of ABIDE func_preproc input")
    p.add_argument("--institution", default="", help="written into the site file")
    args = p.parse_args(argv)
    if args.atlas is None and not args.stand_in_atlas:
        p.error("no --atlas: ROI series of real scans need the Harvard-Oxford image of PCP "
                "rois_ho (ho_mask_pad.nii.gz from the ABIDE Preprocessed release). Pass "
                "--atlas FILE, or --stand-in-atlas for synthetic scans (output marked stand-in).")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from fedbn_med.tasks.abide.scans import Cleaning, extract_site

    site = args.site or "".join(c for c in args.bids.resolve().name.upper() if c.isalnum())
    cleaning = Cleaning.off() if args.no_clean else Cleaning(
        confounds=not args.no_confounds, detrend=not args.no_detrend,
        band_pass=None if args.no_band_pass else (0.01, 0.1))
    try:
        report = extract_site(args.bids, args.out, site=site, cleaning=cleaning,
                              atlas=args.atlas, tr=args.tr, phenotypic=args.phenotypic,
                              institution=args.institution)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"fmri_to_rois: {err}") from None
    n = len(report.written) + len(report.skipped)
    print(f"\n{site}: {len(report.written)} of {n} subjects written to "
          f"{report.data_dir}/ABIDE_pcp (cleaning: {cleaning.describe()}); "
          f"{len(report.skipped)} skipped.")
    print("Seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report.seconds.items()))
    print(f"Site file: {report.site_file} (copy it into sites/ to onboard or join with it).")

