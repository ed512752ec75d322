"""A new site's cases as onboarding reads them: unlabeled inputs and a few labeled cases.

Onboarding asks two things of a site's data, whatever the task:

- the *unlabeled* inputs its BN statistics are estimated on (:func:`unlabeled_inputs`);
- a few *labeled* cases, for BN fine-tuning and the local reference (:func:`draw_labeled`).

The answer depends on the kind of data the task's sites hold, not on the task's name:

- tensors (:class:`~fedbn_med.training.data.SiteData`, ABIDE): the unlabeled inputs are
  the training and validation rows; the labels are classes, so ``shots`` cases are drawn
  *per class* (:func:`~fedbn_med.onboarding.bn_adapt.few_shot_indices`);
- datasets (``ImageSiteData``: MRI, X-ray): the unlabeled inputs are the training items
  as training sees them (the objective's ``bn_inputs``: 3D patches, slices or images;
  the validation items are whole volumes, another shape). Where every training item's
  label is one class index (X-ray) ``shots`` items are drawn per class; where labels
  are maps (MRI segmentation: a case is a subject's volume with its tissue labels)
  ``shots`` items are drawn in all (:func:`few_case_indices`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from fedbn_med.onboarding.bn_adapt import few_shot_indices
from fedbn_med.training.data import SiteData, derive_seed
from fedbn_med.training.objective import Objective

__all__ = ["Labeled", "LabeledSubset", "case_classes", "draw_labeled", "few_case_indices",
           "unlabeled_inputs"]


@dataclass(frozen=True)
class Labeled:
    """The few labeled cases drawn at a site.

    Attributes
    ----------
    data : SiteData or ImageSiteData
        The site's data with only these cases to train on (validation and test as they were).
    inputs, targets : torch.Tensor
        What BN fine-tuning steps on, as one batch (for datasets: the training view of
        the cases, e.g. their patches, drawn once with a fixed seed).
    cases : int
        How many labeled cases were drawn.
    per_class : bool
        Whether ``shots`` counted cases per class (a classification) or in all.
    """

    data: Any
    inputs: torch.Tensor
    targets: torch.Tensor
    cases: int
    per_class: bool


class LabeledSubset(Subset):
    """Some items of a dataset whose augmentation is seeded as the whole dataset's is.

    The imaging objective seeds a dataset's random transforms through its ``transform``;
    this gives it the parent's, so that the labeled cases' patches are reproducible.
    """

    @property
    def transform(self) -> Any:
        """Return the parent dataset's transform."""
        return getattr(self.dataset, "transform", None)


def few_case_indices(n: int, shots: int, seed: int) -> torch.Tensor:
    """Draw ``shots`` of ``n`` cases, reproducibly (no classes: e.g. segmentation)."""
    if shots > n:
        raise ValueError(f"shots={shots} labeled cases were asked for, but the site's training "
                         f"split has only {n}. Use shots <= {n}.")
    gen = torch.Generator().manual_seed(seed)
    return torch.sort(torch.randperm(n, generator=gen)[:shots]).values


def case_classes(dataset: Dataset) -> torch.Tensor | None:
    """Return each item's class when every label is one integer, else None (label maps).

    Read from the dataset's items (``dataset.data``, a MONAI dataset's list), before
    any transform.
    """
    items = getattr(dataset, "data", None)
    if not isinstance(items, Sequence) or not items:
        return None
    labels = [item.get("label") if isinstance(item, Mapping) else None for item in items]
    classes = [int(v) for v in labels
               if isinstance(v, (int, np.integer)) and not isinstance(v, bool)]
    return torch.tensor(classes, dtype=torch.int64) if len(classes) == len(labels) else None


def unlabeled_inputs(data: Any, objective: Objective, batch_size: int, seed: int
                     ) -> torch.Tensor | list[torch.Tensor]:
    """Return the inputs a new site's BN statistics are estimated on (labels unused).

    Tensors: the training and validation rows, one tensor (batched by the statistics
    pass). Datasets: the objective's batches of the training items, as training sees them.
    """
    if isinstance(data, SiteData):
        return torch.cat([data.train[0], data.val[0]])
    return list(objective.bn_inputs(data, batch_size, seed))


def draw_labeled(data: Any, objective: Objective, shots: int, seed: int) -> Labeled:
    """Draw ``shots`` labeled training cases, per class where the labels are classes.

    Parameters
    ----------
    data : SiteData or ImageSiteData
        The site's splits; the cases come from the training split.
    objective : Objective
        The task's objective: it batches a dataset's cases (their training view).
    shots : int
        Cases per class (tensors, or datasets whose labels are class indices), else in all.
    seed : int
        Seeds the draw and the cases' augmentation.
    """
    if isinstance(data, SiteData):  # tensor rows with class labels (ABIDE)
        idx = few_shot_indices(data.train[1], shots, seed)
        x, y = data.train[0][idx], data.train[1][idx]
        return Labeled(dataclasses.replace(data, train=(x, y)), x, y, int(y.numel()), True)
    classes = case_classes(data.train)
    idx = (few_shot_indices(classes, shots, seed) if classes is not None
           else few_case_indices(len(data.train), shots, seed))
    view = dataclasses.replace(data, train=LabeledSubset(data.train, idx.tolist()))
    batches = list(objective.batches(view, max(2, int(idx.numel())), 1,
                                     lambda *parts: derive_seed(seed, "labeled", *parts)))
    if not batches:
        raise ValueError(f"The {idx.numel()} labeled case(s) give no training batch of at "
                         "least 2 examples (batch norm); draw more shots.")
    inputs = torch.cat([b[0] for b in batches])
    targets = torch.cat([b[1] for b in batches])
    return Labeled(view, inputs, targets, int(idx.numel()), classes is not None)
