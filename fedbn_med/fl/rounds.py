"""One federated round, defined once: its plan, the reply, the aggregation that closes it.

Every engine runs a round the same way: the in-process driver, the Flower ServerApp,
onboarding's quick federation and the benchmarks all call :func:`plan_round` and
:func:`close_round`. The functions here are pure: they take tensors and return tensors,
and know nothing of processes, networks or tasks.

A round, for every strategy that exchanges weights:

1. the server sends the global values of the exchanged keys with a :class:`RoundPlan`;
2. each site loads them under its own private layers, trains, and replies with its new
   exchanged values and its number of training examples (a :class:`Reply`);
3. :func:`close_round` leaves out every reply that fails the checks of
   :mod:`fedbn_med.fl.reply_checks` (a private key, keys, dtypes or shapes that differ
   from the model's, NaN or Inf, an update norm far above the other sites' and the
   run's history), then averages the rest with
   :func:`~fedbn_med.fl.strategies.weighted_average`, each site weighed as
   :mod:`fedbn_med.fl.weighting` says (with ``max_share``, no site's claimed count makes
   it weigh more than that share);
4. under SCAFFOLD, the server's control variate moves by the accepted sites' changes of
   theirs (:func:`update_control`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fedbn_med.fl.reply_checks import (
    HISTORY_SHARE,
    check_reply,
    lower_median,
    num_examples_reason,
    outlier_reason,
    update_norm,
)
from fedbn_med.fl.strategies import Strategy, weighted_average
from fedbn_med.fl.weighting import check_weighting, site_weights

__all__ = ["Reply", "RoundOutcome", "RoundPlan", "close_round", "plan_round", "update_control"]

Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class RoundPlan:
    """What the server asks of every site in one round.

    Attributes
    ----------
    round : int
        The round's number, from 1.
    local_epochs : int or None
        Local epochs, when the run overrides each trainer's own setting.
    evaluate_first : bool
        Score the received weights before training (the previous round's evaluation,
        which the Flower engine folds into the next round's message).
    """

    round: int
    local_epochs: int | None = None
    evaluate_first: bool = False

    def trainer_config(self) -> dict[str, int]:
        """Return the ``extra`` a site trainer's ``train`` takes."""
        config = {"round": self.round}
        if self.local_epochs is not None:
            config["local_epochs"] = self.local_epochs
        return config


def plan_round(rnd: int, *, local_epochs: int | None = None, fold_evaluation: bool = False
               ) -> RoundPlan:
    """Return the plan of round ``rnd``.

    Parameters
    ----------
    rnd : int
        The round (at least 1).
    local_epochs : int, optional
        Local epochs every site runs in this round.
    fold_evaluation : bool
        Whether the previous round's evaluation travels with this round's message.
    """
    if not isinstance(rnd, int) or rnd < 1:
        raise ValueError(f"A round number must be an integer >= 1, got {rnd!r}.")
    if local_epochs is not None and local_epochs < 1:
        raise ValueError(f"local_epochs must be at least 1, got {local_epochs}.")
    return RoundPlan(round=rnd, local_epochs=local_epochs,
                     evaluate_first=fold_evaluation and rnd > 1)


@dataclass(frozen=True)
class Reply:
    """One site's answer to a round: its exchanged weights and its example count.

    ``controls`` holds the change of the site's SCAFFOLD control variate (empty otherwise).
    """

    site: str
    weights: Mapping[str, torch.Tensor]
    num_examples: int | float  # checked by close_round (num_examples_reason)
    metrics: Mapping[str, float] = field(default_factory=dict)
    controls: Mapping[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class RoundOutcome:
    """The result of closing a round.

    Attributes
    ----------
    global_weights : dict
        The new global values of the exchanged keys (unchanged when nothing was averaged).
    accepted : list of str
        The sites whose update went into the average, in site order.
    refused : dict of str to str
        The sites left out, with the reason.
    control : dict
        The server's new SCAFFOLD control variate (empty for other strategies).
    shares : dict of str to float
        Each accepted site's share of the average (they sum to 1).
    norms : dict of str to float
        The update norm (over the floating-point keys) of every reply that passed
        :func:`~fedbn_med.fl.reply_checks.check_reply`; integer counters are held to the
        outlier rule apart.
    norm_reference : float
        The largest median accepted norm of this round and every earlier one: pass it to
        the next round's :func:`close_round` (a server checkpoints it).
    """

    global_weights: Weights
    accepted: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    control: Weights = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)
    norms: dict[str, float] = field(default_factory=dict)
    norm_reference: float = 0.0


def update_control(
    control: Mapping[str, torch.Tensor],
    changes: Sequence[tuple[Mapping[str, torch.Tensor], int]], n_sites: int,
) -> Weights:
    """Return SCAFFOLD's new server variate ``c + |S|/N * mean_i(c_i+ - c_i)``.

    Parameters
    ----------
    control : mapping of str to tensor
        The server's variate ``c``.
    changes : sequence of (change, num_examples)
        The accepted sites' changes of their variates, averaged as the weights are
        (weighted by training examples) so that ``c`` tracks the same objective.
    n_sites : int
        Sites in the federation, ``N``; ``|S|`` is ``len(changes)``.
    """
    if not changes:
        return dict(control)
    if n_sites < len(changes):
        raise ValueError(f"n_sites must count every site of the federation ({len(changes)} "
                         f"replied), got {n_sites}.")
    mean = weighted_average(changes)
    share = len(changes) / n_sites
    return {k: (v.double() + share * mean[k].double()).to(v.dtype) for k, v in control.items()}



def close_round(
    strategy: Strategy, global_weights: Mapping[str, torch.Tensor], replies: Sequence[Reply],
    private_keys: Iterable[str] = (), *, control: Mapping[str, torch.Tensor] | None = None,
    n_sites: int | None = None, weighting: str = "samples", max_share: float | None = None,
    norm_reference: float = 0.0, registered: Mapping[str, int] | None = None,
) -> RoundOutcome:
    """Check every reply, leave out the unsound ones, and average the rest.

    Parameters
    ----------
    strategy : Strategy
        A strategy that exchanges nothing keeps the global weights as they are.
    global_weights : mapping of str to tensor
        The weights the round started from; they give the expected keys, dtypes and shapes.
    replies : sequence of Reply
        The sites' answers, in any order: they are aggregated in site-name order.
    private_keys : iterable of str
        Keys no reply may carry.
    control : mapping of str to tensor, optional
        The server's SCAFFOLD variate (strategies with ``controls``): every reply must
        carry a change of the same keys and shapes, and the accepted ones move it.
    n_sites : int, optional
        Sites in the federation (default: the replies).
    weighting : str
        One of :data:`~fedbn_med.fl.weighting.WEIGHTINGS`. ``"samples"``: each accepted
        site weighs by its training examples (FedAvg's rule); ``"equal"``: every accepted
        site weighs the same (the FedBN paper's code).
    max_share : float, optional
        With ``"samples"``, the largest share of the average one site may have, whatever
        count it claims (:func:`~fedbn_med.fl.weighting.capped_weights`); None: no cap
        (every site is trusted).
    norm_reference : float
        The previous round's :attr:`RoundOutcome.norm_reference` (0 in the first round):
        the outlier rule's floor is
        :data:`~fedbn_med.fl.reply_checks.HISTORY_SHARE` of it.
    registered : mapping of str to int, optional
        Training-example counts registered with the sites' keys: a site weighs at most
        its own, and ``max_share`` is measured against the others' registered counts.

    Returns
    -------
    RoundOutcome
        The new global weights, the sites averaged and the sites refused with reasons.
    """
    check_weighting(weighting, max_share)
    # Replies are taken in site order, not arrival order: the float sums of the average
    # must not depend on which site answered first.
    replies = sorted(replies, key=lambda r: r.site)
    current = dict(global_weights)
    controls = dict(control or {}) if strategy.controls else {}
    outcome = RoundOutcome(global_weights=current, control=controls,
                           norm_reference=norm_reference)
    counted = []
    for reply in replies:  # the count weights the average and goes to MLflow: every strategy
        reason = num_examples_reason(reply.num_examples)
        if reason is not None:
            outcome.refused[reply.site] = reason
        else:
            counted.append(reply)
    if not strategy.exchanges:
        outcome.accepted = [r.site for r in counted]
        return outcome
    private = frozenset(private_keys)
    sound: list[tuple[Reply, float]] = []
    for reply in counted:
        reason = check_reply(reply.weights, current, private)
        if reason is None and controls:
            reason = check_reply(reply.controls, controls)
            reason = reason and f"its control variate change is unsound: {reason}"
        if reason is not None:
            outcome.refused[reply.site] = reason
            continue
        # Floating-point weights and integer counters (num_batches_tracked under FedAvg)
        # are measured apart: counters grow by the batches trained, weights' updates
        # shrink as training converges, and neither may hide the other.
        floats = {k: v for k, v in reply.weights.items() if v.dtype.is_floating_point}
        counters = {k: v for k, v in reply.weights.items() if k not in floats}
        outcome.norms[reply.site] = update_norm(floats, current)
        sound.append((reply, update_norm(counters, current)))
    floor = HISTORY_SHARE * norm_reference
    for reply, counter_norm in sound:
        others = [r for r, _ in sound if r is not reply]
        reason = outlier_reason(outcome.norms[reply.site],
                                [outcome.norms[r.site] for r in others], floor=floor)
        if reason is None and counter_norm:
            reason = outlier_reason(counter_norm, [n for r, n in sound if r is not reply])
            reason = reason and f"its integer counters: {reason}"
        if reason is not None:
            outcome.refused[reply.site] = reason
        else:
            outcome.accepted.append(reply.site)
    kept = [r for r, _ in sound if r.site in outcome.accepted]
    if not kept:
        return outcome
    weights = site_weights({r.site: int(r.num_examples) for r in kept}, weighting, max_share,
                           registered)
    total = sum(weights.values())
    outcome.shares = {site: w / total for site, w in weights.items()}
    outcome.norm_reference = max(norm_reference,
                                 lower_median([outcome.norms[r.site] for r in kept]))
    outcome.global_weights = weighted_average([(r.weights, weights[r.site]) for r in kept])
    if controls:
        outcome.control = update_control(
            controls, [(r.controls, weights[r.site]) for r in kept],
            max(n_sites or len(replies), len(kept)))
    return outcome
