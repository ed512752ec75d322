"""Onboard a site that took no part in training (test-time FedBN, paper appendix G).

A new site, whose scanner the federation has never seen, receives the federation's
latest shared (non-BN) weights and builds its own batch-normalisation layers. The
package is split by job:

- :mod:`~fedbn_med.onboarding.weights`: where the shared weights come from (a server
  checkpoint, an MLflow run, a quick in-process federation) and whether they fit;
- :mod:`~fedbn_med.onboarding.bn_adapt`: the site's own BN layers (statistics on its
  unlabeled data, averaged or reset scale and shift, BN-only fine-tuning);
- :mod:`~fedbn_med.onboarding.cases`: the site's unlabeled inputs and its few labeled
  cases (per class for a classification, in all for segmentation);
- :mod:`~fedbn_med.onboarding.compare`: the comparison of onboarding methods on the
  site's test split, its table and its MLflow run;
- :mod:`~fedbn_med.onboarding.new_site`: all of it for a site of any task, built
  through the task registry.
"""

from __future__ import annotations

from fedbn_med.onboarding.bn_adapt import (
    adapt_model,
    average_bn_affine,
    bn_affine_keys,
    estimate_bn_statistics,
    few_shot_indices,
    finetune_bn,
    load_bn_affine,
    save_bn_affine,
)
from fedbn_med.onboarding.cases import draw_labeled, few_case_indices, unlabeled_inputs
from fedbn_med.onboarding.compare import (
    OnboardingOptions,
    OnboardingResult,
    log_onboarding,
    method_table,
    onboard,
)
from fedbn_med.onboarding.new_site import onboard_new_site, table_columns
from fedbn_med.onboarding.weights import (
    ONBOARDING_EXPERIMENT,
    SHARED_WEIGHTS_ARTIFACT,
    CheckpointSource,
    FederationWeights,
    MlflowRunSource,
    RunFolderSource,
    TrainedFederation,
    WeightsSource,
    abide_input_shape,
    check_site_fits,
    train_federation,
)

__all__ = [
    "ONBOARDING_EXPERIMENT",
    "SHARED_WEIGHTS_ARTIFACT",
    "CheckpointSource",
    "FederationWeights",
    "MlflowRunSource",
    "OnboardingOptions",
    "OnboardingResult",
    "RunFolderSource",
    "TrainedFederation",
    "WeightsSource",
    "abide_input_shape",
    "adapt_model",
    "average_bn_affine",
    "bn_affine_keys",
    "check_site_fits",
    "draw_labeled",
    "estimate_bn_statistics",
    "few_case_indices",
    "few_shot_indices",
    "finetune_bn",
    "load_bn_affine",
    "log_onboarding",
    "method_table",
    "onboard",
    "onboard_new_site",
    "save_bn_affine",
    "table_columns",
    "train_federation",
    "unlabeled_inputs",
]
