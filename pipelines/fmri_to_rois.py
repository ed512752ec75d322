"""Turn a site's 4D fMRI into the ROI time series, table and site file --data-dir reads.

Input: fMRIPrep-style derivatives (sub-*/func/*_space-MNI152*_desc-preproc_bold.nii.gz,
confounds, sidecars, participants.tsv) or ABIDE *_func_preproc.nii.gz files with their
phenotypic CSV. Output: <out>/ABIDE_pcp/ (PCP rois_ho layout) and <out>/<SITE>.toml.
Real scans need --atlas (PCP's ho_mask_pad.nii.gz); --stand-in-atlas runs on the built-in
stand-in instead, for trials on synthetic scans, and marks everything it writes as such.
"""

from fedbn_med.cli.rois import main

if __name__ == "__main__":
    main()
