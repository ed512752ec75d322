#!/usr/bin/env python
"""FedBN on ABIDE I across hospital sites.

    python pipelines/abide_fedbn.py                      # 4 sites on this host, built-in cohort
    python pipelines/abide_fedbn.py --compare            # every strategy, paper-style table
    python pipelines/abide_fedbn.py --serve --listen 0.0.0.0:9092      # consortium server
    python pipelines/abide_fedbn.py --site UCLA --superlink server.example.org:9092 \\
        --root-certificates ca.pem                       # one hospital's site

Run with --help for every option.
"""

from __future__ import annotations

import sys

from fedbn_med.cli import main

if __name__ == "__main__":
    sys.exit(main())
