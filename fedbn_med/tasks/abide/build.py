"""Build an ABIDE site: its data, its split, the network and its trainer.

Both engines build their sites through :func:`build_trainer`, so the in-process driver
and the Flower deployment train on the same data with the same initial weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedbn_med.tasks.abide.model import AbideLinear, AbideMLP
from fedbn_med.tasks.abide.sites import SiteConfig, load_sites

if TYPE_CHECKING:  # the data and training stack loads only where a site trains
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.data import SiteFeatures
    from fedbn_med.tasks.abide.harmonize import ComBat
    from fedbn_med.tasks.abide.splits import Split
    from fedbn_med.training.trainer import SiteData, SiteTrainer

#: One split's rows: features, labels, subject index per row, mean FD per row.
Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

__all__ = [
    "build_model",
    "build_pooled",
    "build_server_model",
    "build_site",
    "build_trainer",
    "check_sites",
    "feature_transform",
    "has_feature_chain",
    "pooled_data",
    "prepare",
    "prepare_site_data",
    "resolve_site_data_dir",
    "site_data",
    "site_rows",
    "split_data",
]


def resolve_site_data_dir(site: SiteConfig, config: RunSpec) -> Path:
    """Return the folder holding ``ABIDE_pcp/`` for a site.

    Order: the site's own scans (extracted on first use), the run's ``data_dir``, then
    the site file's ``data_dir``, then the built-in cohort (generated on first use under
    ``$FEDBN_MED_DATA`` or ``~/fedbn_med_data``).
    """
    if site.scans is not None:
        from fedbn_med.tasks.abide.scans.site import site_rois_dir

        if config.settings.cohort_scale != 1:
            raise ValueError(f"cohort_scale={config.settings.cohort_scale:g} sizes the built-in "
                             f"cohort's sites; site '{site.name}' brings its own scans, whose "
                             "number is fixed. Leave it out of the run, or cohort_scale at 1.")
        return site_rois_dir(site, site_effect=config.settings.site_effect)
    if config.data_dir is not None:
        return Path(config.data_dir)
    if site.data_dir is not None:
        return site.data_dir
    from fedbn_med.tasks.abide.cohort import DEFAULT_SITE_IDS, ensure_cohort

    wanted = tuple(dict.fromkeys((*DEFAULT_SITE_IDS, *site.abide_site_ids)))
    return ensure_cohort(sites=wanted, site_effect=config.settings.site_effect,
                         n_subjects_scale=config.settings.cohort_scale)


def _load_split(site: SiteConfig, config: RunSpec, split: Split | None = None
                ) -> tuple[Path, SiteFeatures, Split]:
    from fedbn_med.tasks.abide.data import load_site_features
    from fedbn_med.tasks.abide.splits import repetition_split_seed, site_splits

    data_dir = resolve_site_data_dir(site, config)
    feats = load_site_features(data_dir, site.abide_site_ids, name=site.name)
    if split is None:  # every repetition (run seed) re-draws the split
        split = site_splits(feats.labels, n_folds=config.n_folds, fold=config.fold,
                            seed=repetition_split_seed(site.split_seed, config.seed))
    return data_dir, feats, split


def feature_transform(config: RunSpec) -> str:
    """Return the run's feature harmonisation: the strategy's, else the settings'."""
    own = config.settings.harmonize
    wanted = config.strategy_obj().features
    if wanted is not None and own not in ("none", wanted):
        raise ValueError(
            f"Strategy '{config.strategy}' harmonises the features with {wanted!r}, but the "
            f"run's settings ask for harmonize={own!r}. Choose one: harmonize=none with this "
            "strategy, or strategy fedavg with that setting.")
    return wanted or own


def has_feature_chain(config: RunSpec) -> bool:
    """Return whether the run's rows differ from the whole-series correlation features.

    True with windows, tangent-space connectivity, FD regression or a harmonisation:
    the rows then go through :func:`site_rows` (and :func:`prepare_site_data` builds
    them, fitted on the training rows only).
    """
    settings = config.settings
    return bool(getattr(settings, "windows", 0) or getattr(settings, "fd_regression", False)
                or getattr(settings, "connectivity", "correlation") != "correlation"
                or feature_transform(config) != "none")


def site_rows(site: SiteConfig, config: RunSpec, split: Split | None = None
              ) -> dict[str, Rows]:
    """Return a site's rows per split, after windowing or tangent space and FD regression.

    Each split maps to ``(features, labels, subject, mean_fd)``: one row per subject, or
    one per window with ``windows`` set (``subject`` then says whose window a row is).
    The FD regression is fitted on the training rows only. ``split``: the subjects of
    each part (e.g. a nested split, :func:`fedbn_med.tasks.abide.splits.nested_split`);
    by default the run's fold and repetition.
    """
    from fedbn_med.tasks.abide.harmonize import MotionRegressor

    data_dir, feats, split = _load_split(site, config, split)
    settings = config.settings
    if settings.windows:
        from fedbn_med.tasks.abide.transforms import SlidingWindowConnectivity, window_rows

        x, subject = window_rows(data_dir, feats, SlidingWindowConnectivity(
            settings.windows, settings.window_step))
    elif settings.connectivity == "tangent":
        from fedbn_med.tasks.abide.transforms import tangent_rows

        # the reference is this site's training subjects' mean: fitted here, kept here
        x, subject = tangent_rows(data_dir, feats, split.train), np.arange(feats.n_subjects)
    else:
        x, subject = np.asarray(feats.features), np.arange(feats.n_subjects)
    out: dict[str, Rows] = {}
    for name in ("train", "val", "test"):
        idx = np.asarray(getattr(split, name), dtype=np.int64)
        rows = (np.concatenate([np.flatnonzero(subject == i) for i in idx]) if idx.size
                else np.zeros(0, np.int64))
        who = subject[rows]
        out[name] = (x[rows], feats.labels[who], who, feats.mean_fd[who])
    if settings.fd_regression:
        motion = MotionRegressor().fit(out["train"][0], out["train"][3])
        out = {k: (motion.transform(v[0], v[3]), *v[1:]) for k, v in out.items()}
    return out


def _harmonised(site: SiteConfig, config: RunSpec, rows: dict[str, Rows]) -> dict[str, Rows]:
    """Apply the run's harmonisation, fitted on training rows only."""
    from fedbn_med.tasks.abide.harmonize import ComBat, SiteStandardizer

    method = feature_transform(config)
    if method == "none":
        return rows
    if method == "site_z":
        z = SiteStandardizer().fit(rows["train"][0])
        return {k: (z.transform(v[0]), *v[1:]) for k, v in rows.items()}
    # ComBat's pooled estimates need every site's training rows (not federated).
    others = load_sites(list(config.sites))
    key = (config, tuple(others.values()))
    mine = _fingerprint(rows["train"][0])
    cached = _COMBAT_FIT.get(key)
    if cached is None or cached[1].get(site.name) != mine:
        train = {name: (rows if name == site.name else site_rows(other, config))["train"][0]
                 for name, other in others.items()}
        _COMBAT_FIT.clear()  # one run's fit at a time: the next site of the run reuses it
        cached = ComBat().fit(train), {name: _fingerprint(x) for name, x in train.items()}
        _COMBAT_FIT[key] = cached
    return {k: (cached[0].transform(site.name, v[0]), *v[1:]) for k, v in rows.items()}


#: The last ComBat fit, by run and site files, with a digest of each site's training rows
#: it saw: the sites of one run built in one process share it instead of each re-reading
#: every other site (a site whose training rows differ from the digest refits).
_COMBAT_FIT: dict[object, tuple[ComBat, dict[str, str]]] = {}


def _fingerprint(x: np.ndarray) -> str:
    arr = np.ascontiguousarray(x)
    return hashlib.sha256(arr.tobytes()).hexdigest() + str(arr.shape) + str(arr.dtype)


def prepare_site_data(site: SiteConfig, config: RunSpec, split: Split | None = None
                      ) -> SiteData:
    """Load a site's connectivity features and split them for this run's fold.

    With the task's feature options (windows, tangent space, FD regression, harmonisation: see
    :class:`~fedbn_med.tasks.abide.settings.Settings`) the rows go through
    :func:`site_rows` and the harmonisation, each fitted on the training rows only.
    ``split`` replaces the run's fold and repetition (a nested split, for example: every
    transform is then fitted on its training part); ComBat does not take one.
    """
    from fedbn_med.training.trainer import SiteData

    settings = config.settings
    if split is not None and feature_transform(config) == "combat" and not _same_split(
            split, _load_split(site, config)[2]):
        raise ValueError(
            f"Site '{site.name}' was given a split of its own, but ComBat fits on every "
            "site's training rows of the run's own fold and repetition, and that split is "
            "another. Use harmonize=none or site_z with a given split.")
    if has_feature_chain(config):
        rows = _harmonised(site, config, site_rows(site, config, split))

        def tensors(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = rows[name][0], rows[name][1]
            return (torch.tensor(np.asarray(x), dtype=torch.float32),
                    torch.tensor(np.asarray(y), dtype=torch.int64))

        splits = ("train", "val", "test")
        groups = ({f"{k}_groups": torch.as_tensor(rows[k][2]) for k in splits}
                  if settings.windows else {})
        return SiteData(train=tensors("train"), val=tensors("val"), test=tensors("test"),
                        **groups)
    _, feats, split = _load_split(site, config, split)
    return split_data(feats, split)


def _same_split(a: Split, b: Split) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("train", "val", "test"))


def split_data(feats: SiteFeatures, split: Split) -> SiteData:
    """Return one site's whole-series features cut into the splits' tensors."""
    from fedbn_med.training.trainer import SiteData

    x = torch.tensor(np.asarray(feats.features), dtype=torch.float32)
    y = torch.tensor(np.asarray(feats.labels), dtype=torch.int64)

    def part(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(np.array(idx, dtype=np.int64))
        return x[index], y[index]

    return SiteData(train=part(split.train), val=part(split.val), test=part(split.test))


def build_model(in_features: int, config: RunSpec) -> AbideMLP | AbideLinear:
    """Build the ABIDE network (``Settings.model``) with the run's seed, alike at every site."""
    torch.manual_seed(config.seed)
    if getattr(config.settings, "model", "mlp") == "linear":
        return AbideLinear(in_features, dropout=config.dropout)
    return AbideMLP(in_features, dropout=config.dropout)


def build_trainer(
    site: SiteConfig, config: RunSpec, data: SiteData | None = None,
    device: str | None = None,
) -> SiteTrainer:
    """Build the trainer of one site for this run."""
    from fedbn_med.fl.privacy import resolve_privacy
    from fedbn_med.training.objective import BinaryClassification
    from fedbn_med.training.trainer import SiteTrainer

    # The site's own file may demand more noise than the run: checked before any data load.
    privacy = resolve_privacy(config.privacy(), site.privacy, site.name)
    if privacy is not None:
        privacy.check(config.rounds, who=f"Site {site.name} ({config.rounds} rounds)")
    data = data if data is not None else prepare_site_data(site, config)
    return SiteTrainer(
        site.name, build_model(data.num_features, config), data, config.strategy_obj(),
        lr=config.lr, batch_size=config.batch_size, local_epochs=config.local_epochs,
        seed=config.seed, device=device or (config.device if config.device != "auto"
                                            else site.device), privacy=privacy,
        bn_init=config.bn_init, threads=config.threads,
        optimiser=config.settings.optimizer, weight_decay=config.settings.weight_decay,
        objective=BinaryClassification(threshold=config.settings.threshold),
    )


def pooled_data(datas: Sequence[SiteData]) -> SiteData:
    """Concatenate every site's training data (validation/test stay per site)."""
    from fedbn_med.training.trainer import SiteData

    xs = torch.cat([d.train[0] for d in datas])
    ys = torch.cat([d.train[1] for d in datas])
    empty = (xs[:0], ys[:0])
    return SiteData(train=(xs, ys), val=empty, test=empty)


def build_site(name: str, config: RunSpec, data_dir: Path | None, device: str, *,
               data: SiteData | None = None) -> SiteTrainer:
    """Return the trainer of the site ``sites/<name>.toml`` (the task's ``build_site``).

    ``data``: the site's splits (e.g. a benchmark's subsample of :func:`site_data`'s);
    prepared for the run's fold when omitted.
    """
    site = load_sites([name])[name]
    config = config.replace(data_dir=data_dir) if data_dir is not None else config
    return build_trainer(site, config, data,
                         device=device if device != "auto" else site.device)


def site_data(name: str, config: RunSpec) -> SiteData:
    """Return the splits of the site ``sites/<name>.toml`` for the run's fold (``site_data``)."""
    return prepare_site_data(load_sites([name])[name], config)


def build_server_model(config: RunSpec, input_shape: tuple[int, ...]
                       ) -> AbideMLP | AbideLinear:
    """Return the network the server initialises (the task's ``build_server_model``)."""
    return build_model(int(input_shape[0]), config)


def build_pooled(trainers: Mapping[str, SiteTrainer], config: RunSpec) -> SiteTrainer:
    """Return one trainer over every site's training data (the Centralized baseline)."""
    from fedbn_med.training.objective import BinaryClassification
    from fedbn_med.training.trainer import SiteTrainer

    datas = [t.data for t in trainers.values()]
    return SiteTrainer(
        "pooled", build_model(datas[0].num_features, config), pooled_data(datas),
        config.strategy_obj(), lr=config.lr, batch_size=config.batch_size,
        local_epochs=config.local_epochs, seed=config.seed, device=config.device,
        bn_init=config.bn_init, threads=config.threads,
        optimiser=config.settings.optimizer, weight_decay=config.settings.weight_decay,
        objective=BinaryClassification(threshold=config.settings.threshold),
    )


def prepare(config: RunSpec) -> None:
    """Generate the built-in cohort and cache every site's features before sites start."""
    for site in load_sites(list(config.sites)).values():
        prepare_site_data(site, config)



def check_sites(names: Sequence[str]) -> None:
    """Raise ``ValueError`` listing the valid sites when a name has no site file."""
    load_sites(list(names))
