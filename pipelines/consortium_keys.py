#!/usr/bin/env python
"""Create a consortium's CA, the server certificate and one key pair per site.

Run with --help for every option; the code is :mod:`fedbn_med.cli.keys`
(``fedbn-med keys`` once the package is installed).
"""

import sys

from fedbn_med.cli.keys import main

if __name__ == "__main__":
    sys.exit(main())
