"""Run a whole federation in one process, its sites on threads where they can be.

This is the reference implementation of a federated run: tests use it, benchmarks sweep
with it, and the Flower engine must reproduce its per-site results. The sites train and
score one after the other, or at once on the free cores when that gives the same numbers
to the bit (:func:`_site_workers`). A run spec becomes
site trainers in one place, :func:`build_federation`, whose :meth:`Federation.run` hands
the spec's round settings to :func:`run_in_process`; ``--engine inprocess``, the
benchmarks, onboarding and the evaluation runner all go through it.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from fedbn_med.fl.partition import select
from fedbn_med.fl.release import bounded, bounded_fit
from fedbn_med.fl.rounds import Reply, close_round, plan_round
from fedbn_med.fl.scaffold import zero_controls
from fedbn_med.fl.strategies import Strategy
from fedbn_med.numerics.cores import usable_cores
from fedbn_med.training.rng import dropout_only
from fedbn_med.training.trainer import SiteTrainer

if TYPE_CHECKING:
    from fedbn_med.evaluation.report import RunResult
    from fedbn_med.evaluation.selection import Rule
    from fedbn_med.spec import RunSpec

__all__ = ["Federation", "History", "RoundCallback", "build_federation", "run_in_process"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class History:
    """Per-round, per-site metrics of a federated run.

    Attributes
    ----------
    rows : list of dict
        One row per (round, site): ``{"round": r, "site": s, "num_examples": n, ...}``.
    global_weights : dict
        The final values of the exchanged keys (empty for SingleSet): the last round's.
    selected_weights : dict
        Those of the selected round (:meth:`best_round`), the weights its scores are of.
    selected_round : int
        The round of ``selected_weights`` (0: none kept).
    selected_kept : dict
        Each site's layers that never leave it (its BN layers under FedBN) at that round:
        with ``selected_weights`` they are the site's selected model.
    """

    strategy: str
    rows: list[dict[str, float | int | str]] = field(default_factory=list)
    global_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    selected_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    selected_round: int = 0
    selected_kept: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    rule: Rule | None = None  # the task's selection rule (None: lowest validation loss)

    @property
    def rounds(self) -> int:
        """Return the number of completed rounds."""
        return max((int(r["round"]) for r in self.rows), default=0)

    def final(self) -> dict[str, dict[str, float]]:
        """Return each site's metrics at the last round."""
        from fedbn_med.evaluation.report import metrics_at

        return metrics_at(self.rows, self.rounds)

    def best_round(self) -> int:
        """Return the run's selected round, by the task's rule (:attr:`rule`).

        The comparison protocol's rule (:func:`fedbn_med.evaluation.comparison.best_round`):
        the best mean validation score over the sites (the lowest validation loss unless
        the task says otherwise), the earliest such round; without validation scores, the
        last round.
        """
        from fedbn_med.evaluation.selection import select_round

        return select_round(self.rows, self.rule)

    def selected(self) -> dict[str, dict[str, float]]:
        """Return each site's metrics at the selected round (:meth:`best_round`).

        This is the run's result; a DP site's epsilon is the whole run's, as in
        :func:`fedbn_med.evaluation.report.run_result`.
        """
        return self.result().selected

    def result(self) -> RunResult:
        """Return the run's result: the selected round, the last round and their table."""
        from fedbn_med.evaluation.report import run_result

        return run_result(self.rows, weights_round=self.rounds if self.global_weights else None,
                          selected_weights_round=self.selected_round
                          if self.selected_weights else None, rule=self.rule)


RoundCallback = Callable[[int, Mapping[str, Mapping[str, float]]], None]


def run_in_process(
    trainers: Mapping[str, SiteTrainer],
    strategy: Strategy,
    rounds: int,
    *,
    local_epochs: int | None = None,
    pooled: SiteTrainer | None = None,
    on_round: RoundCallback | None = None,
    evaluate: bool = True,
    weighting: str = "samples",
    rule: Rule | None = None,
) -> History:
    """Run ``rounds`` federated rounds over the given site trainers.

    Each round is the one :mod:`fedbn_med.fl.rounds` defines: every site loads the global
    exchanged weights and trains locally; :func:`fedbn_med.fl.rounds.close_round` checks the
    replies and averages the sound ones (by training examples, or equally); every site
    then evaluates the new global weights with its own private layers.

    Parameters
    ----------
    trainers : mapping of site name to SiteTrainer
        The sites, all built with ``strategy``.
    strategy : Strategy
        The federated strategy.
    rounds : int
        Number of communication rounds (at least 1).
    local_epochs : int, optional
        Overrides each trainer's local epochs.
    pooled : SiteTrainer, optional
        For a pooled strategy (Centralized): the trainer over all sites' training data;
        each site then evaluates the pooled model on its own splits.
    on_round : callable, optional
        Called after each round with ``(round, {site: metrics})``.
    evaluate : bool
        Score every site after every round (off: training only, e.g. to get weights).
    weighting : str
        ``"samples"`` or ``"equal"``: how :func:`~fedbn_med.fl.rounds.close_round` weighs
        the sites' updates.
    rule : Rule, optional
        The task's selection rule (``Task.selection``), which picks the selected round
        whose weights are kept (None: the lowest mean validation loss).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}.")
    if not trainers:
        raise ValueError("A federation needs at least one site; none was given.")
    if strategy.pooled and pooled is None:
        raise ValueError(f"Strategy '{strategy.name}' needs the pooled trainer (pooled=...).")
    from fedbn_med.evaluation.comparison import RunningBest

    history = History(strategy=strategy.label, rule=rule)
    running = RunningBest.by(rule)
    for trainer in (*trainers.values(), *([pooled] if pooled is not None else [])):
        trainer.pin_threads()  # this process computes for every site
    first = pooled if strategy.pooled and pooled is not None else next(iter(trainers.values()))
    global_weights = first.shared_weights()
    private = first.partition.all - first.exchanged
    # SCAFFOLD's server variate, over the keys every site controls (empty otherwise)
    control = (zero_controls(global_weights, first.control.keys)
               if first.control is not None else {})
    norm_reference = 0.0  # the outlier rule's memory of earlier rounds (close_round)
    with _site_workers(trainers) as (training, scoring):
        for rnd in range(1, rounds + 1):
            plan = plan_round(rnd, local_epochs=local_epochs)
            round_metrics: dict[str, dict[str, float]] = {}
            if strategy.pooled:
                assert pooled is not None
                global_weights, _, fit = pooled.fit(global_weights, plan.trainer_config())
                for site, trainer in trainers.items():
                    round_metrics[site] = {"num_examples": trainer.data.num_train,
                                           "train_loss": bounded_fit(fit)["train_loss"]}
            else:
                replies = list(training.map(_fit, trainers.items(), repeat(global_weights),
                                            repeat(plan.trainer_config()), repeat(control)))
                for reply in replies:
                    round_metrics[reply.site] = {"num_examples": reply.num_examples,
                                                 **bounded_fit(reply.metrics)}
                outcome = close_round(strategy, global_weights, replies, private, control=control,
                                      n_sites=len(trainers), weighting=weighting,
                                      norm_reference=norm_reference)
                control, norm_reference = outcome.control, outcome.norm_reference
                for site, reason in outcome.refused.items():
                    logger.warning("Round %d: update of site %s left out: %s", rnd, site, reason)
                global_weights = outcome.global_weights
            if evaluate:
                # the figures as a site sends them over Flower: the same numbers on both
                for site, scores in zip(trainers, scoring.map(
                        _scores, trainers.values(), repeat(global_weights))):
                    round_metrics[site].update(scores)
            for site in trainers:
                history.rows.append({"round": rnd, "site": site, **round_metrics[site]})
            if evaluate and global_weights and running.take(rnd, round_metrics.values()):
                # the best round so far: its shared weights are the selected model's, for now
                history.selected_weights = {k: v.detach().clone()
                                            for k, v in global_weights.items()}
                history.selected_round = rnd
                history.selected_kept = {site: _kept_copy(t) for site, t in trainers.items()}
            if on_round is not None:
                on_round(rnd, round_metrics)
            logger.debug("round %d done: %s", rnd, round_metrics)
    history.global_weights = global_weights
    if history.selected_round and history.selected_round != history.best_round():
        history.selected_weights, history.selected_round = {}, 0  # best_round fell back
        history.selected_kept = {}
    return history


def _fit(item: tuple[str, SiteTrainer], weights: Mapping[str, torch.Tensor],
         config: dict[str, Any], control: Mapping[str, torch.Tensor]) -> Reply:
    """Return a site's reply to a round: its local training from ``weights``."""
    site, trainer = item
    trainer.pin_threads()  # a thread's own: torch and MKL keep a count per thread
    shared, n, fit = trainer.fit(weights, dict(config), *((control,) if control else ()))
    return Reply(site, shared, n, fit, trainer.control_delta)


def _scores(trainer: SiteTrainer, weights: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Return a site's scores of ``weights`` as it sends them (:func:`bounded`)."""
    trainer.pin_threads()
    return bounded(trainer.score(weights))


class _Serial:
    """Run a site's round operation for one site after the other, in this thread."""

    def map(self, fn: Callable[..., T], *items: Iterable[Any]) -> Iterator[T]:
        return map(fn, *items)


@contextmanager
def _site_workers(trainers: Mapping[str, SiteTrainer]
                  ) -> Iterator[tuple[Executor | _Serial, Executor | _Serial]]:
    """Yield what trains the sites in a round and what scores them: threads, or this one.

    The sites' round operations are independent: each site loads the same global weights
    into its own model, trains on its own data with its own optimiser and scores its
    own splits, and computes with its own thread count as before. So they can run at
    once, one thread per free core, and give the same numbers to the bit. Threads when
    each site computes with one thread on the CPU and its model is its own; scoring
    draws nothing at random, and training runs at once only where dropout is all a site
    draws (:func:`fedbn_med.training.rng.dropout_only`: then from a generator of its
    own) and no round hook (DP noise, proximal term, control variates) takes part.
    A worker process (:mod:`multiprocessing`: a comparison's cells, a benchmark's sweep)
    shares the cores with its siblings, one each: its sites run one after the other.
    ``FEDBN_MED_CORES`` caps the cores (:func:`~fedbn_med.numerics.cores.usable_cores`).
    """
    cores = usable_cores()
    if multiprocessing.parent_process() is not None:
        cores = 1
    sites = list(trainers.values())
    workers = min(cores, len(sites))
    if workers < 2 or len({id(t.model) for t in sites}) < len(sites) or any(
            t.threads != 1 or t.device.type != "cpu" for t in sites):
        yield _Serial(), _Serial()
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="fedbn-site") as pool:
        at_once = all(not t.hooks and not t.amp and dropout_only(t.model) for t in sites)
        yield (pool if at_once else _Serial()), pool


def _kept_copy(trainer: SiteTrainer) -> dict[str, torch.Tensor]:
    """Return a CPU copy of the layers a site keeps home, as they are now."""
    return {k: v.detach().to("cpu").clone()
            for k, v in select(trainer.model.state_dict(), trainer.kept).items()}


@dataclass(frozen=True)
class Federation:
    """Every site of a run spec, built through its task, ready to run in this process.

    Attributes
    ----------
    spec : RunSpec
        The run: its strategy, rounds and weighting drive :meth:`run`.
    trainers : mapping of site name to SiteTrainer
        The sites, in the spec's order.
    pooled : SiteTrainer or None
        The trainer over every site's training data (Centralized only).
    """

    spec: RunSpec
    trainers: Mapping[str, SiteTrainer]
    pooled: SiteTrainer | None = None

    @property
    def kept(self) -> frozenset[str]:
        """Return the keys the sites keep home (their BN layers under FedBN)."""
        return next(iter(self.trainers.values())).kept

    def run(self, on_round: RoundCallback | None = None, *, evaluate: bool = True
            ) -> History:
        """Run the spec's rounds over the sites, with every round setting of the spec.

        Parameters
        ----------
        on_round : callable, optional
            Called after each round with ``(round, {site: metrics})``.
        evaluate : bool
            Score every site after every round (off: training only, e.g. to get weights).
        """
        spec = self.spec
        from fedbn_med.tasks import get_task

        return run_in_process(self.trainers, spec.strategy_obj(), spec.rounds,
                              pooled=self.pooled, on_round=on_round, evaluate=evaluate,
                              weighting=spec.weighting, rule=get_task(spec.task).selection)


def build_federation(spec: RunSpec, datas: Mapping[str, Any] | None = None) -> Federation:
    """Build every site of ``spec`` through its task, and the pooled trainer it needs.

    This is the one place a spec becomes in-process site trainers: each site from the
    task's ``build_site`` (:func:`fedbn_med.tasks.get_task`), the Centralized baseline's
    trainer from its ``build_pooled``; :meth:`Federation.run` then passes the spec's
    rounds, strategy and weighting to :func:`run_in_process` (seeds, DP and local
    training settings are the trainers', from the same spec).

    Parameters
    ----------
    spec : RunSpec
        The run.
    datas : mapping of site name to site data, optional
        Each site's data to train on instead of the task's own (e.g. a benchmark's
        subsample of the task's ``site_data``), one for every site of ``spec``; only for a
        task with ``site_data``.

    Raises
    ------
    ValueError
        When ``datas`` misses a site or the task takes no data, or the strategy pools
        the sites' data and the task has no pooled baseline.
    """
    from fedbn_med.tasks import get_task

    task = get_task(spec.task)
    strategy = spec.strategy_obj()
    if strategy.pooled and task.build_pooled is None:
        raise ValueError(f"Strategy '{strategy.name}' pools every site's data, and task "
                         f"'{spec.task}' has no pooled baseline; choose another strategy.")
    if datas is not None:
        if task.site_data is None:
            raise ValueError(f"Task '{spec.task}' builds its sites' data inside build_site "
                             "only (its site_data is None); it cannot train on given data.")
        missing = [name for name in spec.sites if name not in datas]
        if missing:
            raise ValueError(f"No data given for site(s) {', '.join(missing)}; expected data "
                             f"for every site of the run: {', '.join(spec.sites)}.")
        trainers = {name: task.build_site(name, spec, spec.data_dir, spec.device,
                                          data=datas[name]) for name in spec.sites}
    else:
        trainers = {name: task.build_site(name, spec, spec.data_dir, spec.device)
                    for name in spec.sites}
    pooled = (task.build_pooled(trainers, spec)
              if strategy.pooled and task.build_pooled is not None else None)
    return Federation(spec, trainers, pooled)

