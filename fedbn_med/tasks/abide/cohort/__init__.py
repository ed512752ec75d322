"""The built-in, seeded ABIDE-format cohort with realistic site (scanner) effects.

:func:`ensure_cohort` returns a directory holding the cohort for a set of parameters,
generating it on first use; :func:`generate_cohort` writes one into a given directory.
The parts: :mod:`.figures` (the real per-site figures), :mod:`.signal` (the signal
model, version 2), :mod:`.signal_v3` and :mod:`.figures_v3` (version 3, drawn from
figures :mod:`.calibration` measured on the real shared sites), :mod:`.phenotypes` (the
phenotypic rows) and :mod:`.writer` (the files on disk). The Harvard-Oxford ROIs it
draws on are the release's, :mod:`fedbn_med.tasks.abide.data.atlas` (re-exported here).
"""

from __future__ import annotations

from fedbn_med.tasks.abide.cohort.figures import (
    DEFAULT_SITE_IDS,
    SITE_FIGURES,
    SiteFigures,
    site_figures_table,
)
from fedbn_med.tasks.abide.cohort.writer import (
    COHORT_SEED_ENV_VAR,
    COHORT_VERSION,
    COHORT_VERSIONS,
    MANIFEST_FILENAME,
    MAX_SUBJECTS_SCALE,
    cohort_key,
    cohort_seed,
    ensure_cohort,
    generate_cohort,
)
from fedbn_med.tasks.abide.data.atlas import (
    HO_CENTROIDS_MM,
    HO_LABELS,
    HO_N_VOXELS,
    HO_SYSTEMS,
    N_ROIS,
    ZERO_ROI_INDEX,
    ZERO_ROI_LABEL,
)

__all__ = [
    "COHORT_SEED_ENV_VAR",
    "COHORT_VERSION",
    "COHORT_VERSIONS",
    "DEFAULT_SITE_IDS",
    "HO_CENTROIDS_MM",
    "HO_LABELS",
    "HO_N_VOXELS",
    "HO_SYSTEMS",
    "MANIFEST_FILENAME",
    "MAX_SUBJECTS_SCALE",
    "N_ROIS",
    "SITE_FIGURES",
    "ZERO_ROI_INDEX",
    "ZERO_ROI_LABEL",
    "SiteFigures",
    "cohort_key",
    "cohort_seed",
    "ensure_cohort",
    "generate_cohort",
    "site_figures_table",
]
