"""Run imaging federations in process, tracked in MLflow: what the imaging pipelines call.

Settings that only imaging tasks have (image size, subjects per built-in site, slices per
volume, caching) travel in ``ExperimentConfig.extra`` and are validated here, once, into
:class:`ImagingSettings`. Site datasets are built once per process and reused by every
strategy of a comparison, so decoding happens once, not per strategy or per round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedbn_med.driver import History, run_in_process
from fedbn_med.experiment import ExperimentConfig
from fedbn_med.imaging.sites import ImagingSite
from fedbn_med.imaging.trainer import ImageSiteData, ImageTrainer
from fedbn_med.report import site_table
from fedbn_med.tasks import get_task
from fedbn_med.tracking import FederationTracker

__all__ = ["ImagingSettings", "run_federation", "run_pipeline", "site_data"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImagingSettings:
    """Imaging-only settings of a run, read from ``ExperimentConfig.extra``.

    Attributes
    ----------
    image_size : int
        Edge of the network's input (and of the built-in sites' images), a multiple of 8.
    subjects : int
        Subjects (MRI volumes or radiographs) per built-in site.
    slices : int
        2D slices drawn from each training volume per epoch (MRI only).
    cache : bool
        Keep decoded, preprocessed images in memory (``CacheDataset``).
    """

    image_size: int
    subjects: int
    slices: int = 8
    cache: bool = True

    @classmethod
    def from_extra(cls, extra: Mapping[str, str], defaults: ImagingSettings) -> ImagingSettings:
        """Parse ``extra`` (strings, as a CLI or Flower run config gives them) over defaults."""
        known = {"image_size", "subjects", "slices", "cache"}
        values: dict[str, object] = {}
        for key in known & set(extra):
            raw = str(extra[key]).strip().lower()
            if key == "cache":
                if raw not in ("1", "0", "true", "false"):
                    raise ValueError(f"cache must be true or false, got {extra[key]!r}.")
                values[key] = raw in ("1", "true")
                continue
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"{key} must be a positive integer, got {extra[key]!r}.")
            values[key] = int(raw)
        settings = cls(**{**defaults.__dict__, **values})
        if settings.image_size % 8 or settings.image_size < 16:
            raise ValueError(f"image_size must be a multiple of 8 and at least 16, "
                             f"got {settings.image_size}.")
        return settings


_DATA: dict[tuple[object, ...], ImageSiteData] = {}


def site_data(task: str, site: ImagingSite, settings: ImagingSettings, seed: int,
              data_dir: Path | None, build: Callable[[], ImageSiteData]) -> ImageSiteData:
    """Return a site's datasets, building them on the first call of this process."""
    key = (task, site.name, site.datalist, settings, seed, data_dir)
    if key not in _DATA:
        _DATA[key] = build()
        logger.info("Site %s: %d training, %d validation, %d test items", site.name,
                    len(_DATA[key].train), len(_DATA[key].val), len(_DATA[key].test))
    return _DATA[key]


def run_federation(task_name: str, config: ExperimentConfig, *,
                   tracking_uri: str | None = None, data_dir: Path | None = None,
                   track: bool = True) -> History:
    """Run one imaging federation in this process, logging each round to MLflow.

    Parameters
    ----------
    task_name : str
        ``"mri"`` or ``"xray"``.
    config : ExperimentConfig
        Strategy, rounds, sites, optimiser settings; imaging settings in ``extra``.
    tracking_uri : str, optional
        MLflow store (default: :func:`fedbn_med.tracking.default_tracking_uri`).
    data_dir : path, optional
        Data root of the built-in sites.
    track : bool
        Log to MLflow (a parent run and one child run per site).
    """
    task = get_task(task_name)
    strategy = config.strategy_obj()
    trainers = {name: task.build_site(name, config, data_dir, config.device)
                for name in config.sites}
    pooled = None
    if strategy.pooled:
        sites = [t for t in trainers.values() if isinstance(t, ImageTrainer)]
        pooled = sites[0].derive("pooled", ImageSiteData.pooled([t.data for t in sites]))
    tracker = None
    if track:
        tracker = FederationTracker(task.experiment, strategy.label,
                                    {**config.params(), **dict(config.extra)},
                                    config.sites, tracking_uri=tracking_uri,
                                    tags={"task": task_name})

    def on_round(rnd: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
        if tracker is not None:
            tracker.log_round(rnd, metrics)
        scores = ", ".join(f"{site} {_headline(m):.3f}" for site, m in metrics.items())
        logger.info("%s %s round %d/%d, validation Dice or AUC: %s", task_name,
                    strategy.label, rnd, config.rounds, scores)

    try:
        history = run_in_process(trainers, strategy, config.rounds, pooled=pooled,
                                 on_round=on_round)
        if tracker is not None:
            first = next(iter(trainers.values()))
            kept = first.partition.all - first.exchanged  # BN under FedBN; none under FedAvg
            tracker.log_text(site_table(history.final(), _columns(history)), "results.md")
            tracker.log_shared_weights(history.global_weights, kept)
    except BaseException:
        if tracker is not None:
            tracker.finish("FAILED")
        raise
    if tracker is not None:
        tracker.finish()
    return history


def _headline(metrics: Mapping[str, float]) -> float:
    return float(metrics.get("val_dice", metrics.get("val_auc", float("nan"))))


def _columns(history: History) -> tuple[str, ...]:
    keys = next(iter(history.final().values()), {})
    wanted = [k for k in keys if k.startswith("test_dice")] or ["test_auc", "test_accuracy"]
    return (*wanted, "num_examples")


def run_pipeline(task_name: str, config: ExperimentConfig, strategies: Sequence[str], *,
                 tracking_uri: str | None = None, data_dir: Path | None = None
                 ) -> tuple[dict[str, History], str]:
    """Run one federation per strategy on the same sites; return histories and a report.

    The report holds one markdown table per strategy (test metrics per site, rates in %).
    """
    histories: dict[str, History] = {}
    sections = []
    for name in strategies:
        run_config = config.replace(strategy=name)
        history = run_federation(task_name, run_config, tracking_uri=tracking_uri,
                                 data_dir=data_dir)
        histories[history.strategy] = history
        sections.append(f"## {history.strategy} ({config.rounds} rounds)\n\n"
                        + site_table(history.final(), _columns(history)))
    return histories, "\n\n".join(sections)



@dataclass(frozen=True)
class PipelineDefaults:
    """What differs between the imaging pipelines' command lines."""

    sites: tuple[str, ...]
    settings: ImagingSettings
    rounds: int
    batch_size: int
    batch_unit: str
    headline: str


def pipeline_main(task_name: str, defaults: PipelineDefaults, description: str,
                  argv: Sequence[str] | None = None) -> None:
    """Parse an imaging pipeline's options, run the federation(s) and print the table."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--site", default=",".join(defaults.sites), help="comma-separated sites")
    p.add_argument("--strategy", default="fedbn")
    p.add_argument("--compare", nargs="?", default="", const="singleset,fedavg,fedprox,fedbn",
                   help="run several strategies in turn (default: all federated ones)")
    p.add_argument("--rounds", type=int, default=defaults.rounds)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=defaults.batch_size,
                   help=f"{defaults.batch_unit} per batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=defaults.settings.image_size)
    p.add_argument("--subjects", type=int, default=defaults.settings.subjects)
    p.add_argument("--device", default="auto")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--engine", choices=("inprocess", "flower"), default="inprocess",
                   help="inprocess: every site in this process; flower: a SuperLink on "
                        "127.0.0.1 and one process per site")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = ExperimentConfig(
        strategy=args.strategy, rounds=args.rounds, local_epochs=args.local_epochs,
        batch_size=args.batch_size, lr=args.lr, seed=args.seed, device=args.device,
        sites=tuple(s for s in args.site.split(",") if s),
        extra={"image_size": str(args.image_size), "subjects": str(args.subjects)},
    )
    strategies = [s for s in args.compare.split(",") if s] or [args.strategy]
    if args.engine == "flower":
        report = _run_over_flower(task_name, config, strategies, args)
    else:
        _, report = run_pipeline(task_name, config, strategies,
                                 tracking_uri=args.tracking_uri, data_dir=args.data_dir)
    print(report)


def _run_over_flower(task_name: str, config: ExperimentConfig, strategies: Sequence[str],
                     args: object) -> str:
    """Run the strategies over Flower: one SuperLink, one process per site, same tracking."""
    import time

    from fedbn_med.federation.run import FlowerOptions, run_flower
    from fedbn_med.paths import resolve_data_dir
    from fedbn_med.tracking import default_tracking_uri

    size = int(config.extra["image_size"])
    data_dir = getattr(args, "data_dir", None)
    options = FlowerOptions(
        workdir=resolve_data_dir() / "runs" / f"{task_name}-{time.strftime('%Y%m%d-%H%M%S')}",
        tracking_uri=getattr(args, "tracking_uri", None) or default_tracking_uri(),
        task=task_name, input_shape=(1, size, size))
    configs = [config.replace(strategy=name) for name in strategies]
    dirs = {site: data_dir for site in config.sites} if data_dir is not None else None
    results = run_flower(configs, options, data_dirs=dirs, device=config.device)
    return "\n\n".join(f"## {r['strategy']} ({config.rounds} rounds, Flower)\n\n{r['table']}"
                        for r in results)
