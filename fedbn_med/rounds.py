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
   key, keys or shapes that differ from the model's, NaN or Inf) or whose update norm is
   far above the other sites' (:func:`outlier_reason`), then averages the rest with
   :func:`weighted_average`;
4. under SCAFFOLD, the server's control variate moves by the accepted sites' changes of
   theirs (:func:`update_control`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fedbn_med.strategies import Strategy, weighted_average

__all__ = [
    "MAX_EXAMPLES",
    "OUTLIER_FACTOR",
    "WEIGHTINGS",
    "Reply",
    "RoundOutcome",
    "RoundPlan",
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
        The sites whose update went into the average, in reply order.
    refused : dict of str to str
        The sites left out, with the reason.
    control : dict
        The server's new SCAFFOLD control variate (empty for other strategies).
    """

    global_weights: Weights
    accepted: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    control: Weights = field(default_factory=dict)


def check_reply(
    weights: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
    private_keys: Iterable[str] = (),
) -> str | None:
    """Return why an update must be left out of the average, or None when it is sound.

    Parameters
    ----------
    weights : mapping of str to tensor
        What the site sent.
    expected : mapping of str to tensor
        The exchanged keys with the model's shapes (the global weights).
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
        if tuple(tensor.shape) != tuple(expected[key].shape):
            return (f"'{key}' has shape {tuple(tensor.shape)}, expected "
                    f"{tuple(expected[key].shape)}")
        if tensor.dtype.is_floating_point and not torch.isfinite(tensor).all():
            return f"'{key}' holds NaN or Inf"
    return None


def num_examples_reason(value: object) -> str | None:
    """Return why a reported number of training examples is refused, or None.

    It weights the site's update in the average, so it must be a whole number from 1 to
    :data:`MAX_EXAMPLES`: a larger one would let one site outweigh all the others.
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"it reports num-examples {value!r} (expected a number of training examples)"
    if not math.isfinite(value) or value != int(value) or not 1 <= value <= MAX_EXAMPLES:
        return (f"it reports num-examples {value!r} ({value!r} training examples; expected a "
                f"whole number from 1 to {MAX_EXAMPLES})")
    return None


def update_norm(weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
                ) -> float:
    """Return the L2 norm of ``weights - reference`` over the floating-point keys."""
    total = 0.0
    for key, tensor in weights.items():
        if tensor.dtype.is_floating_point:
            diff = tensor.detach().double() - reference[key].detach().double()
            total += float(torch.sum(diff * diff))
    return total ** 0.5


def outlier_reason(norm: float, others: Sequence[float], factor: float = OUTLIER_FACTOR
                   ) -> str | None:
    """Return why an update norm is an outlier against the other sites' norms, or None."""
    if not others:
        return None
    ref = sorted(others)[len(others) // 2]
    if ref > 0 and norm > factor * ref:
        return f"its update norm {norm:.3g} is over {factor:g}x the others' median {ref:.3g}"
    return None


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
    n_sites: int | None = None, weighting: str = "samples",
) -> RoundOutcome:
    """Check every reply, leave out the unsound ones, and average the rest.

    Parameters
    ----------
    strategy : Strategy
        A strategy that exchanges nothing keeps the global weights as they are.
    global_weights : mapping of str to tensor
        The weights the round started from; they give the expected keys and shapes.
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

    Returns
    -------
    RoundOutcome
        The new global weights, the sites averaged and the sites refused with reasons.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got "
                         f"{weighting!r}.")
    # Replies are taken in site order, not arrival order: the float sums of the average
    # must not depend on which site answered first.
    replies = sorted(replies, key=lambda r: r.site)
    current = dict(global_weights)
    controls = dict(control or {}) if strategy.controls else {}
    outcome = RoundOutcome(global_weights=current, control=controls)
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
        sound.append((reply, update_norm(reply.weights, current)))
    for reply, norm in sound:
        others = [n for r, n in sound if r is not reply]
        reason = outlier_reason(norm, others)
        if reason is not None:
            outcome.refused[reply.site] = reason
        else:
            outcome.accepted.append(reply.site)
    def weight(reply: Reply) -> int:
        return int(reply.num_examples) if weighting == "samples" else 1

    kept = [(r.weights, weight(r)) for r, _ in sound if r.site in outcome.accepted]
    if kept:
        outcome.global_weights = weighted_average(kept)
        if controls:
            outcome.control = update_control(
                controls, [(r.controls, weight(r)) for r, _ in sound
                           if r.site in outcome.accepted],
                max(n_sites or len(replies), len(kept)))
    return outcome
