"""Build an imaging site's trainer from its task's parts: the one recipe MRI and X-ray share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedbn_med.tasks.imaging.datasets import ImageSiteData, site_data
from fedbn_med.tasks.imaging.site_files import ImagingSite, load_imaging_site, site_dp

if TYPE_CHECKING:
    from torch import nn

    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.imaging.trainer import ImageObjective
    from fedbn_med.training.trainer import SiteTrainer

__all__ = ["build_image_site"]


def build_image_site(
    task: str, name: str, config: RunSpec, data_dir: Path | None, device: str, *,
    build_data: Callable[..., ImageSiteData],
    build_model: Callable[[RunSpec, tuple[int, ...]], nn.Module],
    objective: ImageObjective,
) -> SiteTrainer:
    """Return the trainer of site ``name`` of an imaging task (its ``build_site``).

    The site file (``sites/<task>/<name>.toml``) gives the site's data and device; the
    datasets are built once per process and run fold (``data_dir``, else the spec's, is
    the data root of the built-in sites). ``build_data(site, settings, seed, data_dir,
    fold=..., n_folds=...)`` gives the datasets of the run's seed and test fold;
    ``objective`` is the task's loss and scores.
    """
    from fedbn_med.tasks.imaging.trainer import image_optimiser
    from fedbn_med.training.trainer import SiteTrainer

    site = load_imaging_site(task, name)
    settings = config.settings
    root = data_dir if data_dir is not None else config.data_dir
    data = site_data(task, site, settings, config.seed, root,
                     lambda: build_data(site, settings, config.seed, root, fold=config.fold,
                                        n_folds=config.n_folds),
                     fold=(config.fold, config.n_folds))
    return SiteTrainer(
        name, build_model(config, data.input_shape), data, config.strategy_obj(),
        objective, image_optimiser(config.lr), lr=config.lr, batch_size=config.batch_size,
        local_epochs=config.local_epochs, seed=config.seed,
        device=device if device != "auto" else site.device,
        privacy=site_dp(site, config), threads=config.threads)


def cache_folder(settings: Any, data_dir: Path | None, site: ImagingSite) -> Path | None:
    """Return the site's ``PersistentDataset`` folder (None unless ``settings.cache_dir``).

    A relative ``cache_dir`` is resolved under the data root, never the working directory.
    """
    if not getattr(settings, "cache_dir", ""):
        return None
    from fedbn_med.paths import resolve_data_dir

    folder = Path(settings.cache_dir).expanduser()
    if not folder.is_absolute():
        folder = resolve_data_dir(data_dir) / folder
    return folder / site.name
