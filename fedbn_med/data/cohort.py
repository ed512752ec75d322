"""Generate a built-in, seeded ABIDE-format cohort with realistic site (scanner) effects.

The cohort is written in the exact ABIDE Preprocessed (PCP) layout that
:func:`nilearn.datasets.fetch_abide_pcp` reads offline::

    <data_dir>/ABIDE_pcp/Phenotypic_V1_0b_preprocessed1.csv
    <data_dir>/ABIDE_pcp/cpac/filt_noglobal/<FILE_ID>_rois_ho.1D

so the whole pipeline (selection, QC filter, nilearn reader, features) runs on it as on
the real release. Subject counts, diagnosis split, quality-control failures, files
without data (``no_filename``), age, sex, head motion, volumes and TR follow the real
per-site figures in :data:`SITE_FIGURES` (computed from the real phenotypic table).

Signal model
------------
Everything below happens per subject on the 111 Harvard-Oxford ROIs of ``rois_ho``
(MNI centroids in :data:`HO_CENTROIDS_MM`), in Fisher-z space ``z = arctanh(r)``:

1. Shared network structure ``z0``: connectivity decays with the Euclidean distance of
   the ROI centroids (``0.55 exp(-d / 30 mm)``), plus a within-system block (a coarse,
   hand-made assignment of the regions to ten canonical systems, :data:`HO_SYSTEMS`), a
   homotopic (left-right mirror region) term, and a small fixed idiosyncratic part.
2. Individual variation: system-by-system block offsets (low rank, so it stays close
   to a valid correlation matrix) and a small independent per-connection term.
3. Diagnosis: on a fixed subset of :data:`DX_EDGE_FRACTION` (7 %) of the connections,
   biased towards default-mode, salience, limbic and subcortical regions, ASD shifts
   ``z`` by ``d * DX_Z_PER_D`` with ``d`` drawn in :data:`DX_COHEN_D` (0.2 to 0.4);
   long-range effects are mostly hypo-, short-range mostly hyper-connectivity. The
   effect is identical at every site. ``DX_Z_PER_D`` is calibrated so that the Cohen's
   d measured on the output features (after noise, global signal and finite sampling
   have attenuated it) averages about 0.3 (0.24 to 0.37 per default site).
4. Head motion: mean framewise displacement (FD) is drawn per subject (log-normal, with
   the real site and diagnosis medians, so ASD moves more); ``z`` changes by
   ``MOTION_GAIN * (FD - FD_ref) * (exp(-d / 25 mm) - 0.3)``: motion raises short-range
   and lowers long-range correlations. QC-failed subjects move more.
5. Scanner effects, as ComBat models them: per site a per-connection additive shift
   ``gamma`` and a multiplicative scaling ``delta`` of the individual variation, each
   with a distance-dependent part and a per-connection part.

The subject's ``z`` matrix is mapped to correlations (``tanh``), made positive definite
by eigenvalue clipping and rescaled to a unit diagonal. Time series are drawn with that
correlation (Cholesky factor applied to AR(1) Gaussian noise, whose smoothness depends
on TR, like band-pass filtered BOLD). Then, per site: a global signal with a
site-specific share of variance, per-ROI noise whose level depends on the ROI size
(fewer voxels, lower temporal SNR), on ventral susceptibility regions and on the site
(temporal SNR), per-ROI scaling and offsets, and the site's volume count and TR. A few
subjects per site get the real all-zero column of the 2-voxel ROI 3455 (index 82).

``site_effect`` scales every site effect: shift, scaling, temporal SNR, global signal and
amplitude scale linearly with it, while acquisition (volumes, TR) and motion figures
move from a common reference (``site_effect=0``: 200 volumes, TR 2 s, pooled motion)
to the real site values (``site_effect>=1``). With ``site_effect=0`` the sites differ
only in their subject counts, diagnosis ratio, age and sex, which do not enter the
signal.

At the default settings the result behaves like real ABIDE features: a logistic
regression tells the four default sites apart almost perfectly, while diagnosis is
learnable only modestly (about 60 to 75 % within-site cross-validated accuracy).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd
from scipy.signal import lfilter
from threadpoolctl import threadpool_limits

from fedbn_med.data.abide import (
    DATASET_DIRNAME,
    MISSING_VALUE,
    NO_FILENAME,
    PHENOTYPIC_FILENAME,
)
from fedbn_med.paths import resolve_data_dir

__all__ = [
    "DEFAULT_SITE_IDS",
    "HO_CENTROIDS_MM",
    "HO_LABELS",
    "HO_SYSTEMS",
    "MANIFEST_FILENAME",
    "SITE_FIGURES",
    "ZERO_ROI_INDEX",
    "ZERO_ROI_LABEL",
    "SiteFigures",
    "cohort_key",
    "ensure_cohort",
    "generate_cohort",
    "site_figures_table",
]

logger = logging.getLogger(__name__)

COHORT_VERSION = "1"
MANIFEST_FILENAME = "fedbn_med_cohort.json"
DEFAULT_SITE_IDS: tuple[str, ...] = ("NYU", "UM_1", "USM", "UCLA_1")
_PIPELINE, _STRATEGY, _DERIVATIVE = "cpac", "filt_noglobal", "rois_ho"
MAX_SUBJECTS_SCALE = 5.0

# Harvard-Oxford ROIs of PCP ``rois_ho`` in .1D column order: label, voxel count (3 mm),
# MNI centroid x, y, z (mm). Facts derived from the PCP atlas image.
_HO_TABLE = """
   10  668   -9.8  -19.6   8.9
      11  420  -13.5    6.9  14.2
      12  449  -25.0   -1.0   3.2
   13  137  -18.3   -7.3   1.4
      17  380  -25.2  -25.8  -9.1
      18  185  -23.2   -4.7 -14.7
   26   59   -8.0    8.7  -5.8
      49  612   11.6  -19.0   9.2
      50  404   14.8    7.4  15.2
   51  434   26.4    0.5   3.4
      52  135   18.8   -4.3   1.5
      53  349   27.2  -23.3  -9.7
   54  169   23.3   -4.2 -14.2
      58   45    9.5    8.7  -5.3
     101 3605   26.0   52.6  11.0
  102 3035  -24.8   53.0  10.4
     201  508   37.0    1.6   2.3
     202  482  -34.9    0.5   3.1
  301 1149   14.7   19.6  59.5
     302 1130  -14.3   17.6  59.4
     401 1110   40.1   19.3  44.9
  402 1188  -37.7   18.0  45.4
     501  224   52.6   27.8   9.9
     502  270  -50.0   28.8  10.8
  601  267   52.2   15.1  18.5
     602  317  -50.2   15.1  17.9
     701 1888   33.7  -11.5  52.5
  702 1786  -33.8  -11.8  51.5
     801 1031   41.6   13.2 -28.2
     802 1030  -40.7   11.3 -27.8
  901  115   59.4   -1.4  -6.5
     902   95  -56.6   -4.8  -4.3
    1001  393   60.9  -23.0   4.3
 1002  388  -61.3  -27.4   5.7
    1101  191   59.4   -2.1 -21.9
    1102  186  -58.6   -4.6 -19.8
 1201  484   61.5  -22.5 -11.0
    1202  543  -61.4  -28.1  -9.6
    1301  478   58.6  -49.4   3.9
 1302  343  -57.4  -53.2   3.2
    1401  152   47.6   -3.7 -39.9
    1402  172  -47.9   -5.3 -37.9
 1501  413   55.0  -23.4 -26.8
    1502  472  -53.1  -28.0 -24.5
    1601  363   56.0  -49.6 -15.3
 1602  298  -51.0  -54.3 -14.6
    1701 1264   39.4  -26.1  55.0
    1702 1472  -39.1  -28.0  54.3
 1801  630   29.5  -48.5  62.4
    1802  576  -28.9  -49.9  60.3
    1901  333   59.2  -27.5  40.5
 1902  452  -57.3  -33.9  39.4
    2001  566   55.6  -40.5  36.2
    2002  393  -55.4  -47.6  35.3
 2101  581   52.3  -52.4  35.8
    2102  363  -48.9  -55.3  33.2
    2201 1987   34.0  -72.4  41.4
 2202 2105  -31.2  -74.0  41.4
    2301  878   46.3  -75.2   0.3
    2302  887  -45.3  -76.2   0.5
 2401  310   12.7  -75.0  11.1
    2402  282  -11.5  -76.3  10.9
    2501  230    4.9   41.3 -17.8
 2502  149   -6.4   40.6 -16.1
    2601  338    5.6   -2.4  61.6
    2602  251   -6.8   -2.1  58.3
 2701  298    4.5   19.1 -11.5
    2702  204   -6.0   18.5 -13.7
    2801  592    7.4   35.5  26.3
 2802  485   -7.8   35.9  23.7
    2901  673    5.3   18.8  24.7
    2902  364   -6.3   18.5  25.4
 3001  666    6.7  -35.5  31.1
    3002  427   -7.1  -37.1  30.0
    3101 1187    9.1  -58.7  41.6
 3102  841   -9.0  -60.1  38.8
    3201  298    8.7  -79.7  30.8
    3202  196   -9.5  -81.2  28.8
 3301  659   29.1   23.2 -13.8
    3302  715  -28.7   24.0 -13.9
    3401  305   21.0   -8.9 -28.4
 3402  260  -19.7   -9.4 -28.5
    3455    2   21.0    0.0 -21.5
    3501  164   21.8  -30.0 -14.8
 3502  197  -19.5  -33.6 -14.6
    3601  794   13.5  -64.2  -3.1
    3602  619  -12.4  -65.5  -3.9
 3701  143   31.5   -4.1 -41.4
    3702  149  -29.8   -4.6 -41.4
    3801  305   36.7  -24.2 -26.1
 3802  390  -35.1  -30.2 -23.5
    3901  373   35.9  -50.0 -15.1
    3902  263  -33.6  -54.9 -14.4
 4001  379   27.6  -75.8  -9.8
    4002  372  -25.7  -77.5 -11.0
    4101  135   40.6   19.0   9.1
 4102  161  -37.6   19.1   9.0
    4201  361   48.7   -5.6  15.1
    4202  387  -46.6   -7.6  15.4
 4301  220   47.6  -28.4  25.1
    4302  257  -45.2  -32.7  24.4
    4401  179   47.5   -6.7  -5.2
 4402  162  -45.1   -8.5  -6.4
    4501   98   47.2  -18.1   8.5
    4502  125  -42.8  -22.0   9.3
 4601  171   52.1  -27.1  14.2
    4602  217  -49.8  -32.0  13.3
    4701   69    8.7  -75.8  16.1
 4702   23  -16.4  -68.9  17.8
    4801 1147   18.1  -96.6  11.2
    4802 1050  -17.4  -98.6   8.9
"""
_ho = np.array(_HO_TABLE.split(), dtype=np.float64).reshape(-1, 5)
HO_LABELS: tuple[int, ...] = tuple(int(v) for v in _ho[:, 0])
HO_N_VOXELS: np.ndarray = _ho[:, 1].astype(np.int64)
HO_CENTROIDS_MM: np.ndarray = _ho[:, 2:].copy()
for _array in (HO_N_VOXELS, HO_CENTROIDS_MM):
    _array.setflags(write=False)
N_ROIS = len(HO_LABELS)
ZERO_ROI_LABEL = 3455
ZERO_ROI_INDEX = HO_LABELS.index(ZERO_ROI_LABEL)

# Coarse, hand-made assignment of regions to canonical systems (after Yeo et al. 2011);
# good enough to give the simulated connectome a block structure.
_SUBCORTICAL_SYSTEM = {10: "subcortical", 11: "subcortical", 12: "subcortical",
                       13: "subcortical", 26: "subcortical", 17: "limbic", 18: "limbic"}
_CORTICAL_SYSTEM = {
    "default": (1, 11, 12, 21, 25, 28, 30, 31),
    "salience": (2, 19, 29, 41),
    "control": (3, 4, 5, 6, 13, 20),
    "dorsal_attention": (16, 18, 22),
    "somatomotor": (7, 17, 26, 42, 43),
    "auditory": (9, 10, 44, 45, 46),
    "visual": (23, 24, 32, 36, 39, 40, 47, 48),
    "ventral_temporal": (14, 15, 37, 38),
    "limbic": (8, 27, 33, 34, 35),
}
_RIGHT_SUBCORTICAL = {49: 10, 50: 11, 51: 12, 52: 13, 53: 17, 54: 18, 58: 26}


def _system_of(label: int) -> str:
    if label == ZERO_ROI_LABEL:
        return "limbic"
    if label < 100:
        return _SUBCORTICAL_SYSTEM[_RIGHT_SUBCORTICAL.get(label, label)]
    index = label // 100
    return next(name for name, members in _CORTICAL_SYSTEM.items() if index in members)


def _homologue(label: int) -> int:
    if label < 100:
        left = _RIGHT_SUBCORTICAL.get(label)
        if left is not None:
            return left
        return next((right for right, left in _RIGHT_SUBCORTICAL.items() if left == label), -1)
    if label == ZERO_ROI_LABEL:
        return -1
    return label + 1 if label % 100 == 1 else label - 1


HO_SYSTEMS: tuple[str, ...] = tuple(_system_of(label) for label in HO_LABELS)


@dataclass(frozen=True)
class SiteFigures:
    """Real figures of one ABIDE site, from the PCP phenotypic table.

    Counts are of subjects with a file (``FILE_ID != "no_filename"``); ``*_qc`` counts
    those that also pass nilearn's quality-control filter. FD is mean framewise
    displacement in mm; ``fd_log_sd`` is the spread of log FD within diagnosis groups.
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

    @property
    def n_subjects(self) -> int:
        """Return the number of subjects with a file."""
        return self.n_asd + self.n_control


def _figures(*rows: tuple[Any, ...]) -> MappingProxyType[str, SiteFigures]:
    return MappingProxyType({row[0]: SiteFigures(*row) for row in rows})


# site, prefix, first SUB_ID, no_filename, ASD, control, ASD after QC, control after QC,
# age mean/sd/min/max, female share, median FD ASD/control, log-FD sd, volumes, TR.
SITE_FIGURES: MappingProxyType[str, SiteFigures] = _figures(
    ("NYU", "NYU", 50952, 9, 75, 100, 74, 98, 15.26, 6.57, 6.47, 39.10, 0.206,
     0.071, 0.046, 0.56, 180, 2.0),
    ("UM_1", "UM_1", 50272, 4, 53, 53, 34, 52, 13.40, 2.88, 8.20, 19.20, 0.236,
     0.125, 0.050, 0.92, 300, 2.0),
    ("UM_2", "UM_2", 50382, 1, 13, 21, 13, 21, 16.01, 3.36, 12.80, 28.80, 0.059,
     0.065, 0.057, 0.72, 300, 2.0),
    ("USM", "USM", 50432, 30, 46, 25, 43, 24, 22.69, 8.34, 8.77, 50.22, 0.0,
     0.106, 0.096, 0.74, 240, 2.0),
    ("UCLA_1", "UCLA_1", 51201, 10, 41, 31, 37, 27, 13.19, 2.40, 8.36, 17.94, 0.139,
     0.097, 0.065, 0.94, 120, 3.0),
    ("UCLA_2", "UCLA_2", 51291, 1, 13, 13, 11, 10, 12.49, 1.53, 9.79, 16.47, 0.077,
     0.152, 0.084, 0.84, 120, 3.0),
    ("PITT", "Pitt", 50002, 1, 29, 27, 24, 26, 18.94, 6.93, 9.33, 35.20, 0.143,
     0.105, 0.118, 0.55, 196, 1.5),
    ("YALE", "Yale", 50551, 0, 28, 28, 22, 19, 12.71, 2.88, 7.00, 17.83, 0.286,
     0.089, 0.080, 0.62, 196, 2.0),
)

# Common acquisition and motion used at site_effect=0 (FD: geometric means of the sites).
REFERENCE_VOLUMES = 200
REFERENCE_TR_S = 2.0
REFERENCE_FD_ASD = 0.098
REFERENCE_FD_CONTROL = 0.071
REFERENCE_FD_LOG_SD = 0.70

# Signal-model constants (Fisher-z units unless stated).
DX_Z_PER_D = 0.25  # latent z shift per unit of Cohen's d (calibrated, see module docstring)
DX_EDGE_FRACTION = 0.07
DX_COHEN_D = (0.2, 0.4)
MOTION_GAIN = 0.5  # z per mm of mean FD, at zero distance
ZERO_ROI_SHARE = 0.06
_BOLD_TAU_S = 4.0  # AR(1) time constant of band-pass filtered BOLD
_MIN_EIGENVALUE = 1e-4


# ----------------------------------------------------------------------------- model


@dataclass(frozen=True)
class _Template:
    """Population-level structure shared by every site (depends on the seed only)."""

    z0: np.ndarray
    dx_shift: np.ndarray
    motion: np.ndarray
    distance: np.ndarray
    system_index: np.ndarray
    gs_loading: np.ndarray
    noise_var: np.ndarray
    amplitude: np.ndarray


@dataclass(frozen=True)
class _Scanner:
    """Site-level acquisition and scanner effects (depend on seed, site and site_effect)."""

    gamma: np.ndarray
    delta: np.ndarray
    noise_scale: np.ndarray
    gs_var: float
    amplitude: float
    n_volumes: int
    tr_s: float
    fd_median: tuple[float, float]  # control, ASD
    fd_log_sd: float


def _symmetric_noise(rng: np.random.Generator, n: int, sd: float) -> np.ndarray:
    noise = rng.normal(0.0, sd / math.sqrt(2.0), size=(n, n))
    noise = noise + noise.T
    np.fill_diagonal(noise, 0.0)
    return noise


def _build_template(seed: int) -> _Template:
    rng = np.random.default_rng([seed, 0])
    xyz = HO_CENTROIDS_MM
    distance = np.sqrt(((xyz[:, None, :] - xyz[None, :, :]) ** 2).sum(-1))
    systems = sorted(set(HO_SYSTEMS))
    system_index = np.array([systems.index(s) for s in HO_SYSTEMS])
    same_system = system_index[:, None] == system_index[None, :]
    homotopic = np.zeros((N_ROIS, N_ROIS), dtype=bool)
    for i, label in enumerate(HO_LABELS):
        partner = _homologue(label)
        if partner in HO_LABELS:
            homotopic[i, HO_LABELS.index(partner)] = True
    z0 = (
        0.08
        + 0.55 * np.exp(-distance / 30.0)
        + 0.22 * same_system
        + 0.40 * homotopic
        + _symmetric_noise(rng, N_ROIS, 0.06)
    )
    np.fill_diagonal(z0, 0.0)

    rows, cols = np.triu_indices(N_ROIS, k=1)
    social = np.isin(system_index, [systems.index(s) for s in
                                    ("default", "salience", "limbic", "subcortical")])
    weight = 1.0 + 1.5 * (social[rows] | social[cols])
    n_dx = round(DX_EDGE_FRACTION * len(rows))
    picked = rng.choice(len(rows), size=n_dx, replace=False, p=weight / weight.sum())
    long_range = distance[rows[picked], cols[picked]] >= 60.0
    negative = np.where(long_range, rng.random(n_dx) < 0.7, rng.random(n_dx) < 0.4)
    effect = rng.uniform(*DX_COHEN_D, size=n_dx) * DX_Z_PER_D
    dx_shift = np.zeros((N_ROIS, N_ROIS))
    dx_shift[rows[picked], cols[picked]] = np.where(negative, -effect, effect)
    dx_shift = dx_shift + dx_shift.T

    motion = np.exp(-distance / 25.0) - 0.3
    np.fill_diagonal(motion, 0.0)
    subcortical = system_index == systems.index("subcortical")
    gs_loading = np.where(subcortical, 0.6, 1.0) + rng.normal(0.0, 0.1, N_ROIS)
    ventral = xyz[:, 2] < -15.0  # susceptibility artefacts lower temporal SNR there
    noise_var = np.minimum(0.15 + 40.0 / HO_N_VOXELS + 0.3 * ventral, 10.0)
    amplitude = np.exp(rng.normal(math.log(8.0), 0.3, N_ROIS))
    return _Template(z0, dx_shift, motion, distance, system_index, gs_loading, noise_var,
                     amplitude)


def _site_seed(site_id: str) -> int:
    return zlib.crc32(site_id.encode("utf-8"))


def _build_scanner(template: _Template, figures: SiteFigures, seed: int,
                   site_effect: float) -> _Scanner:
    rng = np.random.default_rng([seed, _site_seed(figures.site_id), 1])
    a = site_effect
    b = min(site_effect, 1.0)  # acquisition and motion: reference -> real site figures
    near = np.exp(-template.distance / 30.0)
    far = template.distance / 100.0
    g0, g_near, g_far = rng.normal(0.0, (0.03, 0.08, 0.04))
    gamma = a * (g0 + g_near * near + g_far * far + _symmetric_noise(rng, N_ROIS, 0.03))
    h0, h_near = rng.normal(0.0, (0.15, 0.15))
    delta = np.exp(a * (h0 + h_near * near + _symmetric_noise(rng, N_ROIS, 0.10)))
    t_site = rng.normal(0.0, 0.35)
    noise_scale = np.exp(a * (t_site + rng.normal(0.0, 0.25, N_ROIS)))
    gs_var = 0.25 * math.exp(a * rng.normal(0.0, 0.5))
    amplitude = math.exp(a * rng.normal(0.0, 0.4))

    def mix(reference: float, real: float) -> float:
        return math.exp((1 - b) * math.log(reference) + b * math.log(real))

    return _Scanner(
        gamma=gamma,
        delta=delta,
        noise_scale=noise_scale,
        gs_var=gs_var,
        amplitude=amplitude,
        n_volumes=round((1 - b) * REFERENCE_VOLUMES + b * figures.n_volumes),
        tr_s=(1 - b) * REFERENCE_TR_S + b * figures.tr_s,
        fd_median=(mix(REFERENCE_FD_CONTROL, figures.fd_median_control),
                   mix(REFERENCE_FD_ASD, figures.fd_median_asd)),
        fd_log_sd=(1 - b) * REFERENCE_FD_LOG_SD + b * figures.fd_log_sd,
    )


def _ar1(rng: np.random.Generator, n_volumes: int, n_columns: int, phi: float) -> np.ndarray:
    """Draw unit-variance AR(1) series, columns independent, after a burn-in."""
    burn = 30
    white = rng.standard_normal((n_volumes + burn, n_columns))
    series = lfilter([math.sqrt(1.0 - phi**2)], [1.0, -phi], white, axis=0)
    return series[burn:]


def _nearest_correlation(z: np.ndarray) -> np.ndarray:
    """Map Fisher-z to a positive definite correlation matrix (eigenvalue clipping)."""
    corr = np.tanh(z)
    np.fill_diagonal(corr, 1.0)
    values, vectors = np.linalg.eigh(corr)
    if values[0] < _MIN_EIGENVALUE:
        corr = (vectors * np.maximum(values, _MIN_EIGENVALUE)) @ vectors.T
        scale = 1.0 / np.sqrt(np.diag(corr))
        corr = corr * scale[:, None] * scale[None, :]
    return corr


def _subject_series(
    template: _Template,
    scanner: _Scanner,
    rng: np.random.Generator,
    *,
    asd: bool,
    mean_fd: float,
    n_volumes: int,
) -> np.ndarray:
    n_systems = int(template.system_index.max()) + 1
    blocks = _symmetric_noise(rng, n_systems, 0.07) + np.diag(rng.normal(0, 0.07, n_systems))
    individual = (blocks[template.system_index][:, template.system_index]
                  + _symmetric_noise(rng, N_ROIS, 0.05))
    fd_reference = math.sqrt(REFERENCE_FD_ASD * REFERENCE_FD_CONTROL)
    z = (
        template.z0
        + scanner.gamma
        + scanner.delta * individual
        + (template.dx_shift if asd else 0.0)
        + MOTION_GAIN * (mean_fd - fd_reference) * template.motion
    )
    np.fill_diagonal(z, 0.0)
    chol = np.linalg.cholesky(_nearest_correlation(z))
    phi = math.exp(-scanner.tr_s / _BOLD_TAU_S)
    signal = _ar1(rng, n_volumes, N_ROIS, phi) @ chol.T
    global_signal = _ar1(rng, n_volumes, 1, phi) * template.gs_loading
    noise = _ar1(rng, n_volumes, N_ROIS, phi) * np.sqrt(template.noise_var * scanner.noise_scale)
    series = signal + math.sqrt(scanner.gs_var) * global_signal + noise
    offset = rng.normal(0.0, 0.5, N_ROIS)
    return (series + offset) * template.amplitude * scanner.amplitude


# ------------------------------------------------------------------------ phenotypes


_QC_PASS_COLUMNS = ("qc_rater_1", "qc_anat_rater_2", "qc_func_rater_2", "qc_anat_rater_3",
                    "qc_func_rater_3")
# How a subject fails nilearn's QC filter: (column, value, note), with probabilities.
_QC_FAILURES = (
    ("qc_rater_1", "fail", "head motion, ghosting"),
    ("qc_func_rater_3", "fail", None),
    ("qc_func_rater_2", "fail", None),
    ("qc_anat_rater_3", "fail", None),
    ("qc_rater_1", "maybe", "signal dropout, frontal"),
)
_QC_FAILURE_P = (0.4, 0.2, 0.15, 0.15, 0.1)


def _qc_values(rng: np.random.Generator, passes: bool) -> dict[str, object]:
    values: dict[str, object] = {
        "qc_rater_1": "OK",
        "qc_notes_rater_1": None,
        "qc_anat_rater_2": "maybe" if rng.random() < 0.15 else "OK",
        "qc_func_rater_2": "maybe" if rng.random() < 0.2 else "OK",
        "qc_anat_rater_3": "OK",
        "qc_func_rater_3": "OK",
    }
    if not passes:
        column, value, note = _QC_FAILURES[rng.choice(len(_QC_FAILURES), p=_QC_FAILURE_P)]
        values[column] = value
        if note is not None:
            values["qc_notes_rater_1"] = note
    return values


def _scaled(count: int, scale: float, minimum: int = 0) -> int:
    return max(minimum, round(count * scale)) if count else 0


def _site_rows(figures: SiteFigures, scanner: _Scanner, seed: int, scale: float,
               first_sub_id: int) -> list[dict[str, object]]:
    """Draw the phenotypic rows of one site (including no_filename rows)."""
    rng = np.random.default_rng([seed, _site_seed(figures.site_id), 2])
    groups = (  # (ASD, has file, passes QC, count)
        (True, True, True, _scaled(figures.n_asd_qc, scale, 2)),
        (True, True, False, _scaled(figures.n_asd - figures.n_asd_qc, scale)),
        (False, True, True, _scaled(figures.n_control_qc, scale, 2)),
        (False, True, False, _scaled(figures.n_control - figures.n_control_qc, scale)),
    )
    specs = [(asd, has_file, passes) for asd, has_file, passes, n in groups for _ in range(n)]
    n_no_file = _scaled(figures.n_no_filename, scale)
    specs += [(bool(rng.random() < 0.55), False, bool(rng.random() < 0.3))
              for _ in range(n_no_file)]
    order = rng.permutation(len(specs))
    with_file = [k for k in range(len(specs)) if specs[k][1]]
    n_zero = max(1, round(ZERO_ROI_SHARE * len(with_file)))
    zero_roi = set(rng.choice(with_file, size=n_zero, replace=False).tolist())
    rows: list[dict[str, object]] = []
    for position, k in enumerate(order):
        asd, has_file, passes = specs[k]
        sub_id = first_sub_id + position
        fd_median = scanner.fd_median[int(asd)] * (1.0 if passes else 1.6)
        mean_fd = float(np.clip(fd_median * math.exp(rng.normal(0.0, scanner.fd_log_sd)),
                                0.01, 1.5))
        age = float(np.clip(rng.normal(figures.age_mean, figures.age_sd),
                            figures.age_min, figures.age_max))
        dsm = int(rng.choice([1, 2, 3, MISSING_VALUE], p=[0.62, 0.2, 0.12, 0.06])) if asd else 0
        short = rng.random() < 0.12  # a few acquisitions end early
        n_volumes = scanner.n_volumes - (int(rng.integers(1, 5)) if short else 0)
        rows.append({
            "SUB_ID": sub_id,
            "SITE_ID": figures.site_id,
            "FILE_ID": f"{figures.file_prefix}_{sub_id:07d}" if has_file else NO_FILENAME,
            "DX_GROUP": 1 if asd else 2,
            "DSM_IV_TR": dsm,
            "AGE_AT_SCAN": round(age, 2),
            "SEX": 2 if rng.random() < figures.female_fraction else 1,
            "func_mean_fd": mean_fd,
            **_qc_values(rng, passes),
            "_index": k,
            "_zero_roi": k in zero_roi,
            "_n_volumes": n_volumes,
        })
    return rows


# --------------------------------------------------------------------------- writing


def _write_1d(path: Path, series: np.ndarray) -> None:
    header = "\t".join(f"#{label}" for label in HO_LABELS)
    row = "\t".join(["%.6f"] * series.shape[1]) + "\n"
    body = (row * series.shape[0]) % tuple(series.ravel())
    path.write_text(header + "\n" + body, encoding="utf-8")


def _write_phenotypic(path: Path, rows: list[dict[str, object]]) -> None:
    table = pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    table = table.sort_values("SUB_ID", kind="stable").reset_index(drop=True)
    n = len(table)
    table.insert(0, "Unnamed: 0", np.arange(1, n + 1))
    table.insert(2, "X", np.arange(1, n + 1))
    table.insert(3, "subject", table["SUB_ID"])
    table.to_csv(path, index=True, float_format="%.10g")


def _validate_parameters(sites: Sequence[str], seed: int, site_effect: float,
                         n_subjects_scale: float) -> tuple[str, ...]:
    ids = (sites,) if isinstance(sites, str) else tuple(sites)
    unknown = [s for s in ids if s not in SITE_FIGURES]
    if not ids or unknown:
        raise ValueError(
            f"Expected one or more built-in sites, got {list(ids)!r}"
            + (f" (unknown: {', '.join(map(repr, unknown))})" if unknown else "")
            + f". Valid sites: {', '.join(SITE_FIGURES)}."
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"Expected each site once, got {list(ids)!r}.")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
    if not (isinstance(site_effect, (int, float)) and math.isfinite(site_effect)
            and site_effect >= 0):
        raise ValueError(f"site_effect must be a finite number >= 0, got {site_effect!r}.")
    if not (isinstance(n_subjects_scale, (int, float))
            and 0 < n_subjects_scale <= MAX_SUBJECTS_SCALE):
        raise ValueError(f"n_subjects_scale must lie in (0, {MAX_SUBJECTS_SCALE:g}], "
                         f"got {n_subjects_scale!r}.")
    return ids


def _parameters(ids: tuple[str, ...], seed: int, site_effect: float,
                n_subjects_scale: float) -> dict[str, object]:
    return {
        "generator": "fedbn_med.data.cohort",
        "version": COHORT_VERSION,
        "sites": list(ids),
        "seed": int(seed),
        "site_effect": float(site_effect),
        "n_subjects_scale": float(n_subjects_scale),
    }


def cohort_key(
    *,
    sites: Sequence[str] = DEFAULT_SITE_IDS,
    seed: int = 0,
    site_effect: float = 1.0,
    n_subjects_scale: float = 1.0,
) -> str:
    """Return the directory name that identifies a built-in cohort's parameters.

    Parameters
    ----------
    sites, seed, site_effect, n_subjects_scale
        As in :func:`generate_cohort`.

    Returns
    -------
    str
        E.g. ``"seed0-effect1-scale1-3f2a9c1e"`` (the suffix hashes sites and version).
    """
    ids = _validate_parameters(sites, seed, site_effect, n_subjects_scale)
    digest = hashlib.sha256(json.dumps(_parameters(ids, seed, site_effect, n_subjects_scale),
                                       sort_keys=True).encode()).hexdigest()[:8]
    return f"seed{seed}-effect{site_effect:g}-scale{n_subjects_scale:g}-{digest}"


def generate_cohort(
    data_dir: str | Path,
    *,
    sites: Sequence[str] = DEFAULT_SITE_IDS,
    seed: int = 0,
    site_effect: float = 1.0,
    n_subjects_scale: float = 1.0,
) -> Path:
    """Write a seeded ABIDE-format cohort into ``data_dir/ABIDE_pcp``, unless it is there.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Directory that will contain ``ABIDE_pcp/``.
    sites : sequence of str, default=DEFAULT_SITE_IDS
        ABIDE SITE_IDs among :data:`SITE_FIGURES`.
    seed : int, default=0
        Seed of the whole simulated world (template, scanners, subjects).
    site_effect : float, default=1.0
        Strength of every site effect; 0 gives sites identical feature distributions.
    n_subjects_scale : float, default=1.0
        Multiplies every per-site count (at least two QC-passing subjects per class).

    Returns
    -------
    pathlib.Path
        ``data_dir``, ready for :func:`fedbn_med.data.abide.load_site_features`.

    Raises
    ------
    ValueError
        For invalid parameters, if ``data_dir`` holds a cohort made with other
        parameters, or an ``ABIDE_pcp`` folder this module did not write.
    """
    ids = _validate_parameters(sites, seed, site_effect, n_subjects_scale)
    params = _parameters(ids, seed, site_effect, n_subjects_scale)
    root = Path(data_dir).expanduser().absolute()
    target = root / DATASET_DIRNAME
    if _existing_matches(target, params):
        logger.debug("Cohort already present in %s", target)
        return root
    started = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{DATASET_DIRNAME}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        # Threaded BLAS only slows the many small per-subject products down.
        with threadpool_limits(1, "blas"):
            counts = _write_cohort(staging, ids, seed, site_effect, n_subjects_scale)
        (staging / MANIFEST_FILENAME).write_text(
            json.dumps({**params, "subjects": counts}, indent=2), encoding="utf-8")
        try:
            staging.rename(target)
        except OSError:
            # Another process finished first: accept its result if it matches.
            if not _existing_matches(target, params):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("Generated ABIDE-format cohort %s (%s) in %s in %.1f s",
                ", ".join(f"{s}={n}" for s, n in counts.items()), ", ".join(ids), target,
                time.perf_counter() - started)
    return root


def _existing_matches(target: Path, params: dict[str, object]) -> bool:
    manifest = target / MANIFEST_FILENAME
    if manifest.is_file():
        found = json.loads(manifest.read_text(encoding="utf-8"))
        found_params = {k: found.get(k) for k in params}
        if found_params == params:
            return True
        raise ValueError(
            f"{target} holds a cohort generated with other parameters: {found_params}; "
            f"requested {params}. Use another data_dir, or ensure_cohort(), which keeps one "
            "directory per parameter set."
        )
    if target.exists():
        raise ValueError(
            f"{target} exists but is not a fedbn_med cohort (no {MANIFEST_FILENAME}); "
            "refusing to write into it. Use an empty data_dir for the built-in cohort."
        )
    return False


def _write_cohort(staging: Path, ids: tuple[str, ...], seed: int, site_effect: float,
                  scale: float) -> dict[str, int]:
    template = _build_template(seed)
    series_dir = staging / _PIPELINE / _STRATEGY
    series_dir.mkdir(parents=True)
    rows: list[dict[str, object]] = []
    counts: dict[str, int] = {}
    for site_id in sorted(ids, key=list(SITE_FIGURES).index):
        figures = SITE_FIGURES[site_id]
        scanner = _build_scanner(template, figures, seed, site_effect)
        # Real SUB_ID ranges are disjoint; larger cohorts move to their own blocks.
        first = (figures.first_sub_id if scale <= 1.0
                 else 60000 + 1000 * list(SITE_FIGURES).index(site_id))
        site_rows = _site_rows(figures, scanner, seed, scale, first)
        for row in site_rows:
            if row["FILE_ID"] == NO_FILENAME:
                continue
            rng = np.random.default_rng([seed, _site_seed(site_id), 3, int(row["_index"])])
            series = _subject_series(template, scanner, rng, asd=row["DX_GROUP"] == 1,
                                     mean_fd=float(row["func_mean_fd"]),
                                     n_volumes=int(row["_n_volumes"]))
            if row["_zero_roi"]:
                series[:, ZERO_ROI_INDEX] = 0.0
            _write_1d(series_dir / f"{row['FILE_ID']}_{_DERIVATIVE}.1D", series)
        counts[site_id] = sum(r["FILE_ID"] != NO_FILENAME for r in site_rows)
        rows.extend(site_rows)
    _write_phenotypic(staging / PHENOTYPIC_FILENAME, rows)
    return counts


def ensure_cohort(
    data_dir: str | Path | None = None,
    *,
    sites: Sequence[str] = DEFAULT_SITE_IDS,
    seed: int = 0,
    site_effect: float = 1.0,
    n_subjects_scale: float = 1.0,
) -> Path:
    """Return a directory holding the built-in cohort for these parameters, made if needed.

    Parameters
    ----------
    data_dir : str or pathlib.Path or None, default=None
        Base data directory, resolved by :func:`fedbn_med.paths.resolve_data_dir`.
    sites, seed, site_effect, n_subjects_scale
        As in :func:`generate_cohort`.

    Returns
    -------
    pathlib.Path
        ``<data_dir>/builtin/<cohort_key(...)>``, which contains ``ABIDE_pcp/``.
    """
    key = cohort_key(sites=sites, seed=seed, site_effect=site_effect,
                     n_subjects_scale=n_subjects_scale)
    root = resolve_data_dir(data_dir) / "builtin" / key
    return generate_cohort(root, sites=sites, seed=seed, site_effect=site_effect,
                           n_subjects_scale=n_subjects_scale)


def site_figures_table() -> pd.DataFrame:
    """Return :data:`SITE_FIGURES` as a table, one row per site.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``site_id``.
    """
    return pd.DataFrame([asdict(f) for f in SITE_FIGURES.values()]).set_index("site_id")
