"""Brain MRI tissue segmentation across scanners: FedBN and baselines, tracked in MLflow.

Example: ``python pipelines/mri_fedbn.py --compare fedbn,fedavg,singleset``.
Prints Dice per site; run with --help for every option.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone, too

from fedbn_med.imaging.federate import PipelineDefaults, pipeline_main  # noqa: E402
from fedbn_med.imaging.mri import MRI_DEFAULTS, MRI_SITES  # noqa: E402

DEFAULTS = PipelineDefaults(sites=MRI_SITES, settings=MRI_DEFAULTS, rounds=20,
                            batch_size=4, batch_unit="volumes", headline="Dice")

if __name__ == "__main__":
    pipeline_main("mri", DEFAULTS, __doc__.splitlines()[0])
