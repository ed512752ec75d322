"""Turn a public imaging dataset, or a hospital's DICOM export, into MONAI datalists.

Run with --help for every option; the code is :mod:`fedbn_med.cli.datalists`
(``fedbn-med datalists`` once the package is installed).
"""

from fedbn_med.cli.datalists import main

if __name__ == "__main__":
    main()
