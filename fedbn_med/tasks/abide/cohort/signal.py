"""Simulate one subject's ROI time series: the cohort's signal model.

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
3. Diagnosis: on a fixed, sparse subset of :data:`DX_EDGE_FRACTION` (10 %) of the
   connections, biased towards default-mode, salience, limbic and subcortical regions,
   ASD shifts ``z`` by ``e * d * DX_Z_PER_D`` with ``d`` drawn per connection in
   :data:`DX_COHEN_D` (0.1 to 0.5) and ``e``, the subject's expression of the pattern,
   uniform in :data:`DX_EXPRESSION` (0 to 2): autism is heterogeneous, and some autistic
   subjects show little of the group difference. Long-range effects are mostly hypo-,
   short-range mostly hyper-connectivity. The effect is identical at every site.
   ``DX_Z_PER_D`` is calibrated so that projecting a subject on the true pattern (an
   oracle without estimation error) gives a within-site AUC of 0.86 to 0.98 (seed 0,
   ``benchmarks/research/cohort_check.py``), and the networks trained on it reach 56 to 64 %
   (``benchmarks/paper_table.py``), the low end of the range published for ABIDE I:
   about 60 to 70 % accuracy (e.g. Nielsen et al. 2013, 60 %; Abraham et al. 2017,
   67 %; Heinsfeld et al. 2018, 70 %). Cohort version 1 gave every ASD subject the full
   effect, at a higher strength per connection; the oracle then scored 97 to 100 %, and
   rankings followed sample size rather than site shift.
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
on TR, like band-pass filtered BOLD). Then, per site, the two acquisition effects that
change correlations themselves (cohort version 2):

- Gain, from temporal noise. Each ROI gets noise whose variance, relative to the network
  signal, is :data:`NOISE_TO_SIGNAL` (1.5 at the reference site) times a per-ROI shape
  (smaller ROIs and ventral susceptibility regions are noisier) times a site factor.
  The site factor comes from the real site's quality figures in the PCP table (image SNR
  ``func_fber``, excess volume-to-volume change ``func_dvars``: noise grows as
  ``(FBER_ref / FBER) * (DVARS / DVARS_ref)^2``), with a seeded log-normal part for what
  those medians miss (coil, reconstruction, physiology). Noise attenuates every
  correlation, the diagnosis effect included, by the classic attenuation factor
  ``sqrt(rel_i * rel_j)`` (reliability ``rel = 1 / (1 + noise)``): a per-site
  multiplicative gain. Edge-level FC is known to be noisy (a meta-analysis of test-retest
  studies found a mean edge ICC of 0.29; Noble et al. 2019), hence noise comparable with
  the signal.
- Offset, from the global signal. Physiological fluctuations (respiration, heart rate,
  arousal) and scanner drift add one signal to every ROI; its share of variance differs
  between sites and populations, and with whether a site regresses it out, and it moves
  every correlation up together (mean connectivity differs a lot between sites: Yan et
  al. 2013). The share is :data:`GLOBAL_SIGNAL_SHARE` at the reference, log-normal
  across sites with sd :data:`GLOBAL_SIGNAL_LOG_SD`, and it also lowers the gain.

At the default settings (seed 0) the features' site means, regressed on the pooled mean,
have slopes 0.71 to 1.19 and offsets -0.06 to +0.08 z (version 1: slopes 0.93 to 1.07).
The per-ROI scaling and offsets of version 1 are gone: correlations ignore them. A few
subjects per site get the real all-zero column of the 2-voxel ROI 3455 (index 82).

``site_effect`` scales every site effect: shift, scaling, and the log of the temporal
noise and global-signal factors move linearly with it, while acquisition (volumes, TR)
and motion figures
move from a common reference (``site_effect=0``: 200 volumes, TR 2 s, pooled motion)
to the real site values (``site_effect>=1``). With ``site_effect=0`` the sites differ
only in their subject counts, diagnosis ratio, age and sex, which do not enter the
signal.

At the default settings the result behaves like real ABIDE features: a logistic
regression tells the four default sites apart almost perfectly (99.7 %), while diagnosis
is learnable only modestly (52 to 70 % within-site cross-validated accuracy).

The figures the model starts from are in :mod:`.figures`, the atlas in :mod:`.atlas`.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from fedbn_med.tasks.abide.cohort.figures import (
    REFERENCE_DVARS,
    REFERENCE_FBER,
    REFERENCE_FD_ASD,
    REFERENCE_FD_CONTROL,
    REFERENCE_FD_LOG_SD,
    REFERENCE_TR_S,
    REFERENCE_VOLUMES,
    SiteFigures,
)
from fedbn_med.tasks.abide.data.atlas import (
    HO_CENTROIDS_MM,
    HO_LABELS,
    HO_N_VOXELS,
    HO_SYSTEMS,
    N_ROIS,
    _homologue,
)

__all__ = [
    "DX_COHEN_D", "DX_EDGE_FRACTION", "DX_EXPRESSION", "DX_Z_PER_D", "GLOBAL_SIGNAL_LOG_SD",
    "GLOBAL_SIGNAL_SHARE", "MOTION_GAIN", "NOISE_TO_SIGNAL", "SIGNAL_SCALE",
]

# Signal-model constants (Fisher-z units unless stated).
DX_Z_PER_D = 0.22  # latent z shift per unit of Cohen's d (calibrated, see the docstring)
DX_EDGE_FRACTION = 0.1
DX_COHEN_D = (0.1, 0.5)
DX_EXPRESSION = (0.0, 2.0)  # range of an ASD subject's expression of the pattern (mean 1)
MOTION_GAIN = 0.5  # z per mm of mean FD, at zero distance
NOISE_TO_SIGNAL = 1.5  # ROI noise variance / network signal variance, reference site
GLOBAL_SIGNAL_SHARE = 0.3  # global signal variance / network signal variance, reference
GLOBAL_SIGNAL_LOG_SD = 0.8  # between-site spread of the global signal share (log scale)
SIGNAL_SCALE = 8.0  # arbitrary units of the written series (correlations ignore it)
_BOLD_TAU_S = 4.0  # AR(1) time constant of band-pass filtered BOLD
_MIN_EIGENVALUE = 1e-4


@dataclass(frozen=True)
class _Template:
    """Population-level structure shared by every site (depends on the seed only)."""

    z0: np.ndarray
    dx_shift: np.ndarray
    motion: np.ndarray
    distance: np.ndarray
    system_index: np.ndarray
    gs_loading: np.ndarray
    noise_shape: np.ndarray


@dataclass(frozen=True)
class _Scanner:
    """Site-level acquisition and scanner effects (depend on seed, site and site_effect)."""

    gamma: np.ndarray
    delta: np.ndarray
    noise_var: np.ndarray
    gs_var: float
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
    noise_shape = np.minimum(0.15 + 40.0 / HO_N_VOXELS + 0.3 * ventral, 10.0)
    noise_shape = noise_shape / np.median(noise_shape)
    return _Template(z0, dx_shift, motion, distance, system_index, gs_loading, noise_shape)


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
    # Temporal noise: image SNR (FBER) and excess volume-to-volume change (DVARS) of the
    # real site, plus what those two medians do not capture, per site and per ROI.
    quality = math.log(REFERENCE_FBER / figures.fber) + 2.0 * math.log(
        figures.dvars / REFERENCE_DVARS)
    t_site = quality + rng.normal(0.0, 0.3)
    noise_var = NOISE_TO_SIGNAL * template.noise_shape * np.exp(
        a * (t_site + rng.normal(0.0, 0.25, N_ROIS)))
    gs_var = GLOBAL_SIGNAL_SHARE * math.exp(a * rng.normal(0.0, GLOBAL_SIGNAL_LOG_SD))

    def mix(reference: float, real: float) -> float:
        return math.exp((1 - b) * math.log(reference) + b * math.log(real))

    return _Scanner(
        gamma=gamma,
        delta=delta,
        noise_var=noise_var,
        gs_var=gs_var,
        n_volumes=round((1 - b) * REFERENCE_VOLUMES + b * figures.n_volumes),
        tr_s=(1 - b) * REFERENCE_TR_S + b * figures.tr_s,
        fd_median=(mix(REFERENCE_FD_CONTROL, figures.fd_median_control),
                   mix(REFERENCE_FD_ASD, figures.fd_median_asd)),
        fd_log_sd=(1 - b) * REFERENCE_FD_LOG_SD + b * figures.fd_log_sd,
    )


def _ar1(rng: np.random.Generator, n_volumes: int, n_columns: int, phi: float) -> np.ndarray:
    """Draw unit-variance AR(1) series, columns independent, after a burn-in."""
    # imported here: scipy.signal costs about a second to import, and every process that
    # only finds the cohort on disk (a site, the main job) imports this module
    from scipy.signal import lfilter

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
    expression = rng.uniform(*DX_EXPRESSION) if asd else 0.0
    z = (
        template.z0
        + scanner.gamma
        + scanner.delta * individual
        + expression * template.dx_shift
        + MOTION_GAIN * (mean_fd - fd_reference) * template.motion
    )
    np.fill_diagonal(z, 0.0)
    chol = np.linalg.cholesky(_nearest_correlation(z))
    phi = math.exp(-scanner.tr_s / _BOLD_TAU_S)
    signal = _ar1(rng, n_volumes, N_ROIS, phi) @ chol.T
    global_signal = _ar1(rng, n_volumes, 1, phi) * template.gs_loading
    noise = _ar1(rng, n_volumes, N_ROIS, phi) * np.sqrt(scanner.noise_var)
    return SIGNAL_SCALE * (signal + math.sqrt(scanner.gs_var) * global_signal + noise)
