"""Real figures of the ABIDE sites the built-in cohort imitates (from the PCP table)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

import pandas as pd

__all__ = ["DEFAULT_SITE_IDS", "SITE_FIGURES", "SiteFigures", "site_figures_table"]

DEFAULT_SITE_IDS: tuple[str, ...] = ("NYU", "UM_1", "USM", "UCLA_1")


@dataclass(frozen=True)
class SiteFigures:
    """Real figures of one ABIDE site, from the PCP phenotypic table.

    Counts are of subjects with a file (``FILE_ID != "no_filename"``); ``*_qc`` counts
    those that also pass nilearn's quality-control filter. FD is mean framewise
    displacement in mm; ``fd_log_sd`` is the spread of log FD within diagnosis groups.
    ``fber``, ``dvars`` and ``fwhm`` are the site medians of the table's functional
    quality measures (from the Quality Assessment Protocol): ``func_fber``, the
    foreground-to-background energy ratio (an image SNR); ``func_dvars``, the standardised
    DVARS (volume-to-volume signal change relative to what the temporal noise predicts,
    1 = as expected); ``func_fwhm``, the spatial smoothness in voxels. The defaults are the
    medians over all the sites below (for a site the table does not have).
    """

    site_id: str
    file_prefix: str
    first_sub_id: int
    n_no_filename: int
    n_asd: int
    n_control: int
    n_asd_qc: int
    n_control_qc: int
    age_mean: float
    age_sd: float
    age_min: float
    age_max: float
    female_fraction: float
    fd_median_asd: float
    fd_median_control: float
    fd_log_sd: float
    n_volumes: int
    tr_s: float
    fber: float = 75.0
    dvars: float = 1.08
    fwhm: float = 2.1

    @property
    def n_subjects(self) -> int:
        """Return the number of subjects with a file."""
        return self.n_asd + self.n_control


def _figures(*rows: tuple[Any, ...]) -> MappingProxyType[str, SiteFigures]:
    return MappingProxyType({row[0]: SiteFigures(*row) for row in rows})


# site, prefix, first SUB_ID, no_filename, ASD, control, ASD after QC, control after QC,
# age mean/sd/min/max, female share, median FD ASD/control, log-FD sd, volumes, TR,
# median func_fber, func_dvars, func_fwhm.
SITE_FIGURES: MappingProxyType[str, SiteFigures] = _figures(
    ("NYU", "NYU", 50952, 9, 75, 100, 74, 98, 15.26, 6.57, 6.47, 39.10, 0.206,
     0.071, 0.046, 0.56, 180, 2.0, 113.5, 0.994, 1.883),
    ("UM_1", "UM_1", 50272, 4, 53, 53, 34, 52, 13.40, 2.88, 8.20, 19.20, 0.236,
     0.125, 0.050, 0.92, 300, 2.0, 73.9, 1.082, 2.373),
    ("UM_2", "UM_2", 50382, 1, 13, 21, 13, 21, 16.01, 3.36, 12.80, 28.80, 0.059,
     0.065, 0.057, 0.72, 300, 2.0, 59.6, 1.079, 2.381),
    ("USM", "USM", 50432, 30, 46, 25, 43, 24, 22.69, 8.34, 8.77, 50.22, 0.0,
     0.106, 0.096, 0.74, 240, 2.0, 74.8, 1.054, 1.843),
    ("UCLA_1", "UCLA_1", 51201, 10, 41, 31, 37, 27, 13.19, 2.40, 8.36, 17.94, 0.139,
     0.097, 0.065, 0.94, 120, 3.0, 75.1, 1.192, 2.017),
    ("UCLA_2", "UCLA_2", 51291, 1, 13, 13, 11, 10, 12.49, 1.53, 9.79, 16.47, 0.077,
     0.152, 0.084, 0.84, 120, 3.0, 82.9, 1.191, 2.099),
    ("PITT", "Pitt", 50002, 1, 29, 27, 24, 26, 18.94, 6.93, 9.33, 35.20, 0.143,
     0.105, 0.118, 0.55, 196, 1.5, 68.2, 1.084, 1.942),
    ("YALE", "Yale", 50551, 0, 28, 28, 22, 19, 12.71, 2.88, 7.00, 17.83, 0.286,
     0.089, 0.080, 0.62, 196, 2.0, 92.4, 1.100, 2.495),
)

# Common acquisition and motion used at site_effect=0 (FD: geometric means of the sites).
REFERENCE_VOLUMES = 200
REFERENCE_TR_S = 2.0
REFERENCE_FD_ASD = 0.098
REFERENCE_FD_CONTROL = 0.071
REFERENCE_FD_LOG_SD = 0.70
# Image quality at site_effect=0: about the median of the sites above.
REFERENCE_FBER = 75.0
REFERENCE_DVARS = 1.08


def site_figures_table() -> pd.DataFrame:
    """Return :data:`SITE_FIGURES` as a table, one row per site.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``site_id``.
    """
    return pd.DataFrame([asdict(f) for f in SITE_FIGURES.values()]).set_index("site_id")
