"""ABIDE data: load ABIDE Preprocessed (PCP) ROI time series as connectivity features.

One module per job: :mod:`.layout` (where the release keeps its files, which subjects a
site selects), :mod:`.atlas` (the Harvard-Oxford ROIs of ``rois_ho``, read from
``ho_atlas.csv``), :mod:`.roi_files` (reading and checking ``.1D`` files), :mod:`.features`
(connectivity features), :mod:`.cache` (the on-disk feature cache) and :mod:`.loader`
(:func:`load_site_features` and :func:`load_abide`, which tie them together).
"""

from __future__ import annotations

from fedbn_med.tasks.abide.data.cache import FEATURES_VERSION
from fedbn_med.tasks.abide.data.features import (
    SiteFeatures,
    ZeroRoiPolicy,
    connectivity_features,
    edge_index,
)
from fedbn_med.tasks.abide.data.layout import (
    DATASET_DIRNAME,
    FEDBN_INSTITUTIONS,
    MISSING_VALUE,
    NO_FILENAME,
    PHENOTYPIC_FILENAME,
    PIPELINES,
    QC_COLUMNS,
    REQUIRED_COLUMNS,
    ROI_DERIVATIVES,
    check_abide_files,
    read_phenotypic,
    roi_file_path,
    select_subjects,
    strategy_name,
)
from fedbn_med.tasks.abide.data.loader import load_abide, load_site_features
from fedbn_med.tasks.abide.data.roi_files import (
    MIN_VOLUMES,
    ROI_COUNTS,
    DataFileError,
    read_roi_time_series,
)

__all__ = [
    "DATASET_DIRNAME",
    "FEATURES_VERSION",
    "FEDBN_INSTITUTIONS",
    "MIN_VOLUMES",
    "MISSING_VALUE",
    "NO_FILENAME",
    "PHENOTYPIC_FILENAME",
    "PIPELINES",
    "QC_COLUMNS",
    "REQUIRED_COLUMNS",
    "ROI_COUNTS",
    "ROI_DERIVATIVES",
    "DataFileError",
    "SiteFeatures",
    "ZeroRoiPolicy",
    "check_abide_files",
    "connectivity_features",
    "edge_index",
    "load_abide",
    "load_site_features",
    "read_phenotypic",
    "read_roi_time_series",
    "roi_file_path",
    "select_subjects",
    "strategy_name",
]
