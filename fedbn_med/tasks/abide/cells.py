"""A comparison's cell of ABIDE sites: every site loaded and split, and a method's features.

The task's :class:`~fedbn_med.tasks.Cells` hook (registered by :mod:`fedbn_med.tasks.abide`),
which :mod:`fedbn_med.evaluation.cell_data` calls. :func:`prepare_sites` loads each
site's whole-series features and draws its split from the site's split seed and the
repetition seed (:func:`fedbn_med.tasks.abide.splits.repetition_split_seed`), so that
every method of a cell and its reference rows see the same subjects; validation is
carved from the training part only. :func:`with_features` rebuilds the rows of a method
whose strategy or settings transform the features (per-site z, ComBat, FD regression,
sliding windows, tangent space), fitted on the training rows only, on the same split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from fedbn_med.evaluation.cell_data import PreparedSite

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.sites import SiteConfig

__all__ = ["prepare_sites", "with_features"]


def prepare_sites(spec: RunSpec, sites: Mapping[str, SiteConfig] | None = None
                  ) -> dict[str, PreparedSite]:
    """Load every site of ``spec`` and split it for the spec's fold and repetition seed."""
    import torch

    from fedbn_med.tasks.abide.build import resolve_site_data_dir
    from fedbn_med.tasks.abide.data import load_site_features
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.tasks.abide.splits import repetition_split_seed, site_splits
    from fedbn_med.training.trainer import SiteData

    sites = sites or load_sites(list(spec.sites))
    out = {}
    for name, site in sites.items():
        feats = load_site_features(resolve_site_data_dir(site, spec), site.abide_site_ids,
                                   name=site.name)
        split = site_splits(feats.labels, n_folds=spec.n_folds, fold=spec.fold,
                            seed=repetition_split_seed(site.split_seed, spec.seed))
        x = torch.tensor(np.asarray(feats.features), dtype=torch.float32)
        y = torch.tensor(np.asarray(feats.labels), dtype=torch.int64)

        def part(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            index = torch.as_tensor(np.array(idx, dtype=np.int64))
            return x[index], y[index]  # noqa: B023 - used within this iteration

        data = SiteData(train=part(split.train), val=part(split.val), test=part(split.test))
        out[name] = PreparedSite(data, split, np.asarray(feats.labels),
                                 np.asarray(feats.mean_fd, dtype=np.float64),
                                 np.asarray(feats.features))
    return out


def with_features(spec: RunSpec, prepared: Mapping[str, PreparedSite],
                  sites: Mapping[str, SiteConfig] | None = None
                  ) -> Mapping[str, PreparedSite]:
    """Return the sites' data with the spec's feature chain applied, when it has one.

    :func:`prepare_sites` gives whole-series features, which every method of a cell and
    the reference rows share. A method whose strategy or settings transform them (per-site
    z, ComBat, FD regression, sliding windows, tangent space) gets its rows built as a run
    of it builds them (:func:`fedbn_med.tasks.abide.build.prepare_site_data`, fitted on
    the training rows only), on the same split: each site's ``split``, which on fixed
    splits (``run_comparison(..., split_seed=...)``) is not the spec's own repetition's.
    ``sites``: their site files, loaded from ``sites/`` when omitted.
    """
    from fedbn_med.tasks.abide.build import has_feature_chain, prepare_site_data

    if not has_feature_chain(spec):
        return prepared
    if sites is None:
        from fedbn_med.tasks.abide.sites import load_sites

        sites = load_sites(list(prepared))
    return {name: dataclasses.replace(p, data=prepare_site_data(sites[name], spec, p.split))
            for name, p in prepared.items()}
