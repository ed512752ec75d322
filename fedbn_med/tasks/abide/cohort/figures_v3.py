"""Summary figures measured on the real shared ABIDE sites: what cohort v3 is drawn from.

Every number below came from ``benchmarks/research/cohort_calibrate.py --data-dir REAL`` (the real
ABIDE Preprocessed release, C-PAC ``filt_noglobal`` ``rois_ho``, read through
:mod:`fedbn_med.tasks.abide.data`) on the 14 shared sites PITT, YALE, MAX_MUN, KKI,
TRINITY, STANFORD, CALTECH, SDSU, OLIN, LEUVEN_2, SBL, LEUVEN_1, CMU, OHSU, each site
restricted to the subjects outside its test fold (fold 0 of its own ``sites/`` split:
336 subjects, 5995 edges that vary at every site). They are summaries over edges and
sites; no subject's data is stored. The paper's four sites (NYU, UM, USM, UCLA) took no
part. Names follow :func:`fedbn_med.tasks.abide.cohort.calibration.measure`; units are
Fisher z, or the pooled within-site sd of an edge where stated.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["CALIBRATION_SITES", "REAL_FIGURES"]

CALIBRATION_SITES = ("PITT", "YALE", "MAX_MUN", "KKI", "TRINITY", "STANFORD", "CALTECH",
                     "SDSU", "OLIN", "LEUVEN_2", "SBL", "LEUVEN_1", "CMU", "OHSU")

REAL_FIGURES: MappingProxyType[str, float] = MappingProxyType({
    # edges: mean and within-site sd (z)
    "edge_mean": 0.3553,
    "within_sd_median": 0.2402,
    # site location effect: sd of site means / within sd, noise-corrected; sites' global
    # offset (sd over sites of the mean edge shift, z); per-edge part once it is removed
    "location": 0.2388,
    "offset_sd": 0.0421,
    "edge_location": 0.1628,
    # site scale effect: sd over sites of log within-site sd, noise-corrected; the
    # sites' global scale (sd of log median sd ratio)
    "scale": 0.1059,
    "site_scale_log_sd": 0.1107,
    # subject global connectivity (mean edge): within-site sd (z), share of an edge's
    # variance it explains, its correlation with log mean FD
    "global_sd": 0.1337,
    "global_r2": 0.2917,
    "global_log_fd_corr": 0.4550,
    # motion: ASD - control gap in mean log FD (pooled, and its between-site sd), the
    # within-group sd of log FD, FD-alone AUC pooled and mean over sites
    "log_fd_gap": 0.0186,
    "log_fd_gap_tau": 0.0408,
    "log_fd_within_sd": 0.5885,
    "fd_auc_pooled": 0.5275,
    "fd_auc_site_mean": 0.5053,
    # edge-wise within-site correlation with log FD: sd over edges of the true effect
    # (excess over the null), and its mean
    "log_fd_effect_sd": 0.2485,
    "log_fd_mean_r": 0.2389,
    # age and sex (female): sd over edges of the true correlation, and its mean
    "age_effect_sd": 0.0,
    "sex_effect_sd": 0.0363,
    "sex_mean_r": -0.0425,
    # diagnosis (Cohen's d per edge): consistent part (cross-site covariance of the
    # sites' maps), site-specific part (over the permutation null), mean over edges,
    # mean correlation of two sites' maps
    "dx_consistent_sd": 0.0608,
    "dx_site_specific_sd": 0.0,
    "dx_global_d": -0.0935,
    "dx_map_corr": 0.0163,
    # reachable: 5-fold L2 logistic regression (C = 0.01, balanced weights), per site
    # (mean over sites) and pooled with per-site z-scored features
    "site_bacc_mean": 0.5259,
    "site_auc_mean": 0.5413,
    "pooled_bacc": 0.5605,
    "pooled_auc": 0.6101,
})
