#!/usr/bin/env python
"""FedBN on H&E tiles across hospitals: nuclei segmentation (task ``histo``).

    python pipelines/histo_fedbn.py --rounds 5                 # generated tiles, 4 sites
    python pipelines/histo_fedbn.py --data-dir MONUSEG --set site_rule=organ \\
        --sites breast,kidney,lung,prostate,other --compare    # the MoNuSeg tiles

Run with --help for every option.
"""

from __future__ import annotations

import sys

from fedbn_med.cli import main

if __name__ == "__main__":
    sys.exit(main(task="histo"))
