#!/usr/bin/env python
"""X-ray finding classification across hospitals: FedBN and baselines, tracked in MLflow.

Example: ``python pipelines/xray_fedbn.py --compare fedbn,fedavg,singleset``.
Prints ROC AUC per site; run with --help for every option.
"""

from __future__ import annotations

import sys

from fedbn_med.cli import main

if __name__ == "__main__":
    sys.exit(main(task="xray"))
