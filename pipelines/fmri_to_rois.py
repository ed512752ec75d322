"""Turn a site's 4D fMRI into the ROI time series, table and site file --data-dir reads.

Run with --help for every option; the code is :mod:`fedbn_med.cli.rois`
(``fedbn-med rois`` once the package is installed).
"""

from fedbn_med.cli.rois import main

if __name__ == "__main__":
    main()
