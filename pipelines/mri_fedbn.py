#!/usr/bin/env python
"""Brain MRI tissue segmentation across scanners: FedBN and baselines, tracked in MLflow.

Example: ``python pipelines/mri_fedbn.py --compare fedbn,fedavg,singleset``.
Prints Dice per site; run with --help for every option.
"""

from __future__ import annotations

import sys

from fedbn_med.cli import main

if __name__ == "__main__":
    sys.exit(main(task="mri"))
