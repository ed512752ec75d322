"""ABIDE's own run settings and its defaults (kept light: no torch, no data stack)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["COHORT_VERSION", "COMPARE", "CONNECTIVITY", "DEFAULTS", "ENGINE", "FEATURE_TRANSFORMS",
           "HARMONIZERS", "MAX_COHORT_SCALE", "MODELS", "NUM_FEATURES", "OPTIMIZERS",
           "THRESHOLDS", "Settings"]

#: Version of the built-in cohort's generator (:mod:`fedbn_med.tasks.abide.cohort`); it is
#: in the cohort's manifest, its directory name, the feature-cache key and MLflow params.
#: 2: per-site gain (temporal noise) and wider offsets (global signal), a sparse and
#: heterogeneous diagnosis effect. 3: strengths drawn from figures measured on the 14
#: shared real sites (``benchmarks/research/cohort_calibrate.py``, ``cohort/figures_v3.py``);
#: version 2 stays reproducible (``generate_cohort(version="2")``).
COHORT_VERSION = "3"

#: The most the built-in cohort's subjects per site may be multiplied by (``cohort_scale``).
MAX_COHORT_SCALE = 5.0

#: Upper triangle of the 111 x 111 Harvard-Oxford connectivity matrix.
NUM_FEATURES = 111 * 110 // 2

#: The paper's ABIDE set-up (four sites, SGD, batches of 32) with two defaults chosen on
#: validation AUC by ``benchmarks/research/defaults_sweep.py`` on two federations of shared real
#: sites: dropout 0.5 after each hidden block (first sweep), and SGD at 3e-3 instead of
#: the paper's 1e-2 (second sweep; a third sweep around it changes nothing). The
#: features (``Settings.windows``, ``Settings.window_step``) are the nested sweep's
#: choice (``--nested``, inner test scores, README "The main job's defaults"): windows
#: of 32 volumes every 16, best in both groups since the last training batch of 2-3
#: examples joins the one before it. Swept again, nested, around the windowed features
#: (optimiser and lr, weight decay, dropout, local epochs; 2026-12-05): nothing changes.
DEFAULTS: dict[str, Any] = {
    "sites": ("NYU", "UM", "USM", "UCLA"),
    "rounds": 100,
    "batch_size": 32,
    "lr": 3e-3,
    "dropout": 0.5,
}


#: The strategies ``--compare`` runs when given no list, in table order. ``name:linear``
#: trains the linear model (``Settings.model``) under that strategy: under FedBN and
#: SiloBN its input standardiser (a BN layer) stays at each site, which is per-site
#: standardisation learnt federatedly; beside the ridge reference rows they show what the
#: MLP adds over a linear model on the same features.
COMPARE = ("singleset", "fedavg", "fedprox", "fedbn", "silobn", "fedavg_localbn",
           "fedavg_sitez", "fedavg_combat", "centralized", "fedavg:linear", "fedbn:linear",
           "silobn:linear")

#: The feature harmonisations (``Settings.harmonize``), each fitted on training rows only
#: (:mod:`fedbn_med.tasks.abide.harmonize`): none, per-site z-scores, ComBat.
HARMONIZERS = ("none", "site_z", "combat")

#: How a subject's connectivity is described (``Settings.connectivity``): Fisher-z
#: correlations, or the tangent space at the site's own training subjects' mean.
CONNECTIVITY = ("correlation", "tangent")

#: The networks (``Settings.model``): the FedBN paper's MLP, or a linear model on
#: batch-normalised features (:mod:`fedbn_med.tasks.abide.model`).
MODELS = ("mlp", "linear")

#: The transforms a strategy may ask of this task (``Strategy.features``).
FEATURE_TRANSFORMS = HARMONIZERS[1:]

#: Local optimisers (the same names as :data:`fedbn_med.training.trainer.OPTIMISERS`; this module
#: stays free of torch).
OPTIMIZERS = ("sgd", "adam")
#: Decision thresholds: fedbn_med.training.objective.THRESHOLDS, written out (no torch here).
THRESHOLDS = ("0.5", "site_prior")

#: The engine a pipeline uses unless ``--engine`` says otherwise.
ENGINE = "flower"


@dataclass(frozen=True)
class Settings:
    """Settings of the ABIDE task.

    Attributes
    ----------
    site_effect : float
        Strength of the built-in cohort's site effects (0: every site scans alike; 1: the
        real sites' figures). Ignored for real ABIDE data.
    cohort_scale : float
        The built-in cohort's subjects per site, times the real site's count (default 1;
        ``benchmarks/research/interval_design.py`` runs a design on more subjects than any real
        site has). Ignored for real ABIDE data.
    connectivity : str
        ``"correlation"``: Fisher-z Pearson correlations of the whole series (the FedBN
        paper). ``"tangent"``: each subject's shrunk covariance in the tangent space at
        the log-Euclidean mean of the site's own training subjects (fitted per site and
        fold, never on validation or test subjects; see
        :class:`fedbn_med.tasks.abide.transforms.TangentConnectivity`). Not with
        ``windows``.
    harmonize : str
        Feature harmonisation fitted on each run's training rows: ``"none"``,
        ``"site_z"`` (each site z-scores every feature with its own training mean and
        standard deviation) or ``"combat"`` (ComBat fitted on every site's training rows;
        not federated, see :class:`fedbn_med.tasks.abide.harmonize.ComBat`).
    fd_regression : bool
        Regress each feature on mean framewise displacement within the site's training
        rows and remove that effect from every row (before ``harmonize``).
    windows : int
        0: one whole-series connectivity vector per subject. Otherwise the published
        federated ABIDE pipeline's augmentation: windows of this many volumes, one
        connectivity vector per window to train on, and each validation or test
        subject scored by the mean probability of its windows (32 in that pipeline).
        Default 32, chosen by the nested defaults sweep on shared real sites; tangent
        space needs ``windows=0``.
    window_step : int
        Volumes between window starts (default 16; 1 in the published pipeline: every
        window).
    optimizer : str
        ``"sgd"`` (the FedBN paper) or ``"adam"`` (the published ABIDE code, lr 1e-5).
    weight_decay : float
        L2 penalty of the local optimiser (the published ABIDE code: 5e-2).
    model : str
        ``"mlp"``: the FedBN paper's network (in -> 16 -> 16 -> 2, BN after each hidden
        layer). ``"linear"``: a BN standardiser on the input features (no scale or
        shift), dropout, one linear layer
        (:class:`fedbn_med.tasks.abide.model.AbideLinear`); the standardiser's running
        statistics are what FedBN keeps at each site, and weight decay acts on the
        linear layer only.
    threshold : str
        Where a probability becomes a predicted ASD: ``"0.5"``, or ``"site_prior"``, the
        site's own threshold at which its training subjects are predicted positive as
        often as they are (:func:`fedbn_med.training.objective.prior_threshold`; the
        default: ``benchmarks/research/threshold.py`` chose it on validation at the windowed
        features). AUC does not depend on it.
    """

    task: ClassVar[str] = "abide"
    site_effect: float = 1.0
    cohort_scale: float = 1.0
    connectivity: str = "correlation"
    harmonize: str = "none"
    fd_regression: bool = False
    windows: int = 32
    window_step: int = 16
    optimizer: str = "sgd"
    weight_decay: float = 0.0
    threshold: str = "site_prior"
    model: str = "mlp"

    def __post_init__(self) -> None:
        value = self.site_effect
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value >= 0):
            raise ValueError(f"site_effect must be a finite number >= 0, got {value!r}.")
        scale = self.cohort_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
                math.isfinite(scale) and 0 < scale <= MAX_COHORT_SCALE):
            raise ValueError(f"cohort_scale must lie in (0, {MAX_COHORT_SCALE:g}], got "
                             f"{scale!r}.")
        for name, valid in (("connectivity", CONNECTIVITY), ("harmonize", HARMONIZERS),
                            ("optimizer", OPTIMIZERS), ("threshold", THRESHOLDS),
                            ("model", MODELS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"{name} must be one of {', '.join(valid)}, got "
                                 f"{getattr(self, name)!r}.")
        if not isinstance(self.fd_regression, bool):
            raise ValueError(f"fd_regression must be true or false, got {self.fd_regression!r}.")
        if isinstance(self.windows, bool) or not isinstance(self.windows, int) or not (
                self.windows == 0 or self.windows >= 3):
            raise ValueError(f"windows must be 0 (off) or a window length of at least 3 "
                             f"volumes, got {self.windows!r}.")
        if isinstance(self.window_step, bool) or not isinstance(self.window_step, int) or (
                self.window_step < 1):
            raise ValueError(f"window_step must be a positive integer, got "
                             f"{self.window_step!r}.")
        if self.windows and self.connectivity != "correlation":
            raise ValueError(f"windows={self.windows} cuts correlation windows (the default "
                             f"features); it does not combine with "
                             f"connectivity={self.connectivity!r}. Set windows=0 (--set "
                             "windows=0) or connectivity=correlation.")
        wd = self.weight_decay
        if isinstance(wd, bool) or not isinstance(wd, (int, float)) or not (
                math.isfinite(wd) and wd >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {wd!r}.")

    def log_params(self) -> dict[str, object]:
        """Return what MLflow logs of these settings (with the built-in cohort's version)."""
        return {"site_effect": self.site_effect, "cohort_scale": self.cohort_scale,
                "cohort_version": COHORT_VERSION,
                "connectivity": self.connectivity, "harmonize": self.harmonize,
                "fd_regression": self.fd_regression,
                "windows": self.windows, "window_step": self.window_step,
                "optimizer": self.optimizer, "weight_decay": self.weight_decay,
                "threshold": self.threshold, "model": self.model}

    def input_shape(self) -> tuple[int, ...]:
        """Return ``(6105,)``: one connectivity vector per subject."""
        return (NUM_FEATURES,)
