"""Task ``"abide"``: autism diagnosis from resting-state connectivity across ABIDE sites.

Each site classifies subjects (ASD or control) from the 6105 Fisher-z correlations of
their 111 Harvard-Oxford ROI time series, with the FedBN paper's MLP; under FedBN its
batch-norm layers stay at their site.

The task's files: ``sites`` (one TOML file per institution), ``data`` (ABIDE PCP files to
features), ``cohort`` (the built-in ABIDE-format cohort), ``splits`` (per-site folds),
``cells`` (a comparison's cell: the sites split for one fold and seed), ``model`` (the
MLP), ``settings`` and ``build`` (a site's trainer from these, with the binary objective
:class:`fedbn_med.training.objective.BinaryClassification`). Importing this package
registers the task (see :mod:`fedbn_med.tasks`) without importing torch: the builders
are imported when a site or the server model is first built.
"""

from __future__ import annotations

from fedbn_med.tasks import Cells, Task, lazy, register_task
from fedbn_med.tasks.abide.settings import Settings

__all__ = ["ABIDE_TASK"]

ABIDE_TASK = register_task(Task(
    name="abide", experiment="abide-fedbn",
    build_site=lazy("fedbn_med.tasks.abide.build:build_site"),
    build_server_model=lazy("fedbn_med.tasks.abide.build:build_server_model"),
    default_input_shape=Settings().input_shape(),
    check_sites=lazy("fedbn_med.tasks.abide.build:check_sites"),
    build_pooled=lazy("fedbn_med.tasks.abide.build:build_pooled"),
    prepare=lazy("fedbn_med.tasks.abide.build:prepare"),
    site_data=lazy("fedbn_med.tasks.abide.build:site_data"),
    preload=("fedbn_med.tasks.abide.build", "fedbn_med.tasks.abide.data",
             "fedbn_med.tasks.abide.cohort", "fedbn_med.tasks.abide.splits"),
    cells=Cells(load_sites=lazy("fedbn_med.tasks.abide.sites:load_sites"),
                prepare=lazy("fedbn_med.tasks.abide.cells:prepare_sites"),
                with_features=lazy("fedbn_med.tasks.abide.cells:with_features")),
))
