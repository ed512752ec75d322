#!/usr/bin/env python
"""FedBN on H&E tiles across hospitals: nuclei segmentation (task ``histo``).

    python pipelines/histo_fedbn.py --rounds 5                 # generated tiles, 4 sites
    python pipelines/histo_fedbn.py --data-dir MONUSEG --set site_rule=organ \\
        --sites breast,kidney,lung,prostate,other --compare    # the MoNuSeg tiles

Run with --help for every option.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone, too

from fedbn_med.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(task="histo"))
