"""One federated round, defined once: its plan, the checks on a reply, the aggregation.

Every engine runs a round the same way: the in-process driver, the Flower ServerApp,
onboarding's quick federation and the benchmarks all call :func:`plan_round` and
:func:`close_round`. The functions here are pure: they take tensors and return tensors,
and know nothing of processes, networks or tasks.

A round, for every strategy that exchanges weights:

1. the server sends the global values of the exchanged keys with a :class:`RoundPlan`;
2. each site loads them under its own private layers, trains, and replies with its new
   exchanged values and its number of training examples (a :class:`Reply`);
3. :func:`close_round` leaves out every reply that fails :func:`check_reply` (a private
   key, keys, dtypes or shapes that differ from the model's, NaN or Inf) or whose update
   norm is far above the other sites' and the run's history (:func:`outlier_reason`),
   then averages the rest with :func:`weighted_average`; with ``max_share``, no site's
   claimed count makes it weigh more than that share (:func:`capped_weights`);
4. under SCAFFOLD, the server's control variate moves by the accepted sites' changes of
   theirs (:func:`update_control`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fedbn_med.fl.strategies import Strategy, weighted_average

__all__ = [
    "HISTORY_SHARE",
    "MAX_EXAMPLES",
    "OUTLIER_FACTOR",
    "WEIGHTINGS",
    "Reply",
    "RoundOutcome",
    "RoundPlan",
    "capped_weights",
    "check_reply",
    "close_round",
    "num_examples_reason",
    "outlier_reason",
    "plan_round",
    "update_control",
    "update_norm",
    "weighted_average",
]

Weights = dict[str, torch.Tensor]

#: An update whose norm is over this many times the other sites' median is left out.
OUTLIER_FACTOR = 50.0

#: The outlier rule's reference never falls below this share of the largest median
#: accepted norm of any earlier round: as training converges and the other sites'
#: updates shrink, an honest site whose update shrinks more slowly is not left out.
HISTORY_SHARE = 0.2

#: How close_round may weigh the accepted updates (``RunSpec.weighting``).
WEIGHTINGS = ("samples", "equal")

#: More training examples than any site holds; a larger count is refused.
MAX_EXAMPLES = 10**9


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
        :func:`check_reply`; integer counters are held to the outlier rule apart.
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


def check_reply(
    weights: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
    private_keys: Iterable[str] = (),
) -> str | None:
    """Return why an update must be left out of the average, or None when it is sound.

    Every key is checked, whatever its dtype: the dtype and shape must be the global
    tensor's, and a floating-point tensor must hold no NaN or Inf (an integer one cannot).

    Parameters
    ----------
    weights : mapping of str to tensor
        What the site sent.
    expected : mapping of str to tensor
        The exchanged keys with the model's dtypes and shapes (the global weights).
    private_keys : iterable of str
        Keys that must never leave a site under this strategy.
    """
    leaked = sorted(set(weights) & set(private_keys))
    if leaked:
        return f"it carries site-private keys {leaked[:3]} (refused, never stored)"
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        return f"its keys differ from the model's (missing {missing[:3]}, unexpected {extra[:3]})"
    for key, tensor in weights.items():
        if not isinstance(tensor, torch.Tensor):
            return f"'{key}' is a {type(tensor).__name__}, expected a tensor"
        want = expected[key]
        if tensor.dtype != want.dtype:
            return f"'{key}' is {tensor.dtype}, expected {want.dtype} (the global's dtype)"
        if tuple(tensor.shape) != tuple(want.shape):
            return (f"'{key}' has shape {tuple(tensor.shape)}, expected "
                    f"{tuple(want.shape)}")
        if tensor.dtype.is_floating_point and not torch.isfinite(tensor).all():
            return f"'{key}' holds NaN or Inf"
    return None


def num_examples_reason(value: object) -> str | None:
    """Return why a reported number of training examples is refused, or None.

    It weights the site's update in the average, so it must be a whole number from 1 to
    :data:`MAX_EXAMPLES` (a server that cannot check the claim also caps the weight it
    gives: ``max_share`` of :func:`close_round`).
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"it reports num-examples {value!r} (expected a number of training examples)"
    if not math.isfinite(value) or value != int(value) or not 1 <= value <= MAX_EXAMPLES:
        return (f"it reports num-examples {value!r} ({value!r} training examples; expected a "
                f"whole number from 1 to {MAX_EXAMPLES})")
    return None


def update_norm(weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
                ) -> float:
    """Return the L2 norm of ``weights - reference`` over every key, in float64.

    Integer tensors count too (a counter such as ``num_batches_tracked`` under FedAvg),
    so that no tensor escapes the outlier rule by its dtype.
    """
    total = 0.0
    for key, tensor in weights.items():
        diff = tensor.detach().double() - reference[key].detach().double()
        total += float(torch.sum(diff * diff))
    return math.sqrt(total)


def _median(values: Sequence[float]) -> float:
    # the lower median: with two values, the smaller, so that one site never raises it
    return sorted(values)[(len(values) - 1) // 2]


def outlier_reason(norm: float, others: Sequence[float], factor: float = OUTLIER_FACTOR,
                   floor: float = 0.0) -> str | None:
    """Return why an update norm is an outlier, or None.

    The reference is the other sites' (lower) median norm, but never below ``floor``
    (:data:`HISTORY_SHARE` of the run's largest median accepted norm, from
    :attr:`RoundOutcome.norm_reference`); an update over ``factor`` times it is an
    outlier. Without the floor, late in training, when the other sites' updates have
    shrunk to almost nothing, an honest site whose update shrinks more slowly would be
    left out round after round.
    """
    if not others:
        return None
    median = _median(others)
    ref = max(median, floor)
    if ref > 0 and norm > factor * ref:
        if ref > median:
            return (f"its update norm {norm:.3g} is over {factor:g}x {ref:.3g} (the floor "
                    f"from earlier rounds; the others' median is {median:.3g})")
        return f"its update norm {norm:.3g} is over {factor:g}x the others' median {ref:.3g}"
    return None


def capped_weights(counts: Mapping[str, int], max_share: float) -> dict[str, int]:
    """Return each site's weight: its count, but never over ``max_share`` of the average.

    A count is a site's own claim, which the server cannot check. Each site's weight is
    cut to ``max_share / (1 - max_share)`` times the sum of the other sites' counts, so
    that one site, whatever it claims, weighs at most ``max_share`` of the average
    (``0.5``: never more than all the others together). A single site is not capped.

    Raises
    ------
    ValueError
        When ``max_share`` is not in (0, 1).
    """
    if not 0 < max_share < 1:
        raise ValueError(f"max_share must be a share between 0 and 1 (exclusive), got "
                         f"{max_share!r}.")
    total = sum(counts.values())
    if len(counts) < 2:
        return dict(counts)
    ratio = max_share / (1 - max_share)
    return {site: max(1, min(n, int(ratio * (total - n)))) for site, n in counts.items()}


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
    norm_reference: float = 0.0,
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
        ``"samples"``: each accepted site weighs by its training examples (FedAvg's
        rule); ``"equal"``: every accepted site weighs the same (the FedBN paper's code).
    max_share : float, optional
        With ``"samples"``, the largest share of the average one site may have, whatever
        count it claims (:func:`capped_weights`); None: no cap (every site is trusted).
    norm_reference : float
        The previous round's :attr:`RoundOutcome.norm_reference` (0 in the first round):
        the outlier rule's floor is :data:`HISTORY_SHARE` of it.

    Returns
    -------
    RoundOutcome
        The new global weights, the sites averaged and the sites refused with reasons.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got "
                         f"{weighting!r}.")
    if max_share is not None and not 0 < max_share < 1:
        raise ValueError(f"max_share must be a share between 0 and 1 (exclusive), got "
                         f"{max_share!r}.")
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
    if weighting == "equal":
        weights = {r.site: 1 for r in kept}
    else:
        weights = {r.site: int(r.num_examples) for r in kept}
        if max_share is not None:
            weights = capped_weights(weights, max_share)
    total = sum(weights.values())
    outcome.shares = {site: w / total for site, w in weights.items()}
    outcome.norm_reference = max(norm_reference, _median([outcome.norms[r.site] for r in kept]))
    outcome.global_weights = weighted_average([(r.weights, weights[r.site]) for r in kept])
    if controls:
        outcome.control = update_control(
            controls, [(r.controls, weights[r.site]) for r in kept],
            max(n_sites or len(replies), len(kept)))
    return outcome
