"""FedBN on your own MONAI network and data, tracked in MLflow (see docs/library.md).

    python examples/own_model.py sqlite:////tmp/mlflow.db A=hospital_a.json B=hospital_b.json

Each site's MONAI datalist lists its ``training``, ``validation`` and ``test`` items
(``{"image": "scan1.png", "label": 1}``, paths relative to the file). Every site trains a
copy of the network; its batch-norm layers never leave it.
"""
import sys

from monai.data import Dataset, load_decathlon_datalist
from monai.networks.nets import DenseNet121
from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged, ScaleIntensityd

import fedbn_med as fb

load = Compose([LoadImaged("image"), EnsureChannelFirstd("image"), ScaleIntensityd("image")])
splits = ("training", "validation", "test")
lists = dict(arg.split("=", 1) for arg in sys.argv[2:])  # site name = its datalist
sites = {name: fb.image_site(*(Dataset(load_decathlon_datalist(path, False, key), load)
                               for key in splits)) for name, path in lists.items()}
net = DenseNet121(spatial_dims=2, in_channels=1, out_channels=2)  # your own network
result = fb.run(net, sites, fb.Classification(), strategy="fedbn", rounds=2,
                tracking_uri=sys.argv[1], workdir="own_model_run")  # weights written there
print(result.table, "\nMLflow run:", result.run_id, "\nshared weights:", result.shared_weights)
