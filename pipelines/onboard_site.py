"""Onboard a site that took no part in training: shared weights + its own BN layers.

Weights from ``--checkpoint WORKDIR/server/global.safetensors`` or ``--mlflow-run RUN_ID``;
with neither, a quick FedBN and FedAvg federation is trained in-process first, on the
task's sites without the new one (``--sites`` to choose them).
"""

from fedbn_med.cli.onboard import main

if __name__ == "__main__":
    main()
