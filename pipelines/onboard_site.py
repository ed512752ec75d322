"""Onboard a site that took no part in training: shared weights + its own BN layers.

Run with --help for every option; the code is :mod:`fedbn_med.cli.onboard`
(``fedbn-med onboard`` once the package is installed).
"""

from fedbn_med.cli.onboard import main

if __name__ == "__main__":
    main()
