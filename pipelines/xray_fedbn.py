"""X-ray finding classification across hospitals: FedBN and baselines, tracked in MLflow.

Example: ``python pipelines/xray_fedbn.py --compare fedbn,fedavg,singleset``.
Prints ROC AUC per site; run with --help for every option.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone, too

from fedbn_med.imaging.federate import PipelineDefaults, pipeline_main  # noqa: E402
from fedbn_med.imaging.xray import XRAY_DEFAULTS, XRAY_SITES  # noqa: E402

DEFAULTS = PipelineDefaults(sites=XRAY_SITES, settings=XRAY_DEFAULTS, rounds=5,
                            batch_size=8, batch_unit="images", headline="ROC AUC")

if __name__ == "__main__":
    pipeline_main("xray", DEFAULTS, __doc__.splitlines()[0])
