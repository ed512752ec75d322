"""One site's runtime in a federation: its trainer, its kept state, and what it may release.

:class:`SiteRuntime` is what the ClientApp (:mod:`fedbn_med.federation.client_app`) keeps
between messages: it saves and resumes the site's private state, checks every model the
server sends before anything is computed on it, and counts and bounds the scores that
leave the site. The module docstring of the ClientApp says why each check is there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from fedbn_med.checkpoint import load_tensors, save_tensors, state_hash
from fedbn_med.fl.hooks import split_site_state
from fedbn_med.fl.model_checks import hostile_model_reason, nonfinite_keys, shift_reason
from fedbn_med.fl.partition import select
from fedbn_med.fl.privacy import PrivacyLedger
from fedbn_med.fl.release import bounded
from fedbn_med.tasks.site_toml import SitePolicy
from fedbn_med.training.trainer import SiteTrainer

__all__ = ["SiteRuntime"]

#: Trained rounds a site's state file remembers (a restarted site may score their models).
_KEEP_TRAINED = 16

logger = logging.getLogger("fedbn_med.federation.client_app")


@dataclass
class SiteRuntime:
    """A site's trainer, where its kept state lives, and what it has released, per run."""

    trainer: SiteTrainer
    state_path: Path
    setups: int = 1
    federation_id: str = "default"
    policy: SitePolicy = field(default_factory=SitePolicy)
    ledger: PrivacyLedger | None = None
    #: rounds this site trained in this federation that it can vouch for
    trained: set[int] = field(default_factory=set)
    #: the last aggregate round it scored, and how many scores it sent (this federation)
    scored_through: int = 0
    scores: int = 0
    #: the hash of the weights it last scored and the scores it sent for them
    last_scored: tuple[str, dict[str, float]] | None = None
    #: what it sent last in this federation (None: nothing yet), on its disk too
    own: dict | None = None

    @property
    def sent_path(self) -> Path:
        """Return where this site keeps its last sent update (this federation's folder)."""
        return self.state_path.with_name(f"{self.state_path.stem}.sent.safetensors")

    @property
    def kept_keys(self) -> frozenset[str]:
        """Return the keys that never leave the site under this strategy."""
        return self.trainer.kept

    def kept_state(self) -> dict:
        """Return the layers this site keeps (never sent), as they are in memory now."""
        return select(self.trainer.model.state_dict(), self.kept_keys)

    def kept_hash(self) -> str:
        """Return the hash of the state this site keeps, as it is in memory now."""
        return state_hash(self.kept_state())

    def save(self, rnd: int) -> str:
        """Persist the kept state after a round; return its hash.

        With it go its hooks' state (SCAFFOLD's control variate,
        for one), the DP it has spent and the scores
        it has sent, so that a restarted site neither forgets its variate nor counts its
        epsilon or its scores from zero.
        """
        kept = select(self.trainer.model.state_dict(), self.kept_keys)
        extra, meta = self.trainer.site_state()
        save_tensors(self.state_path, {**kept, **extra},
                     {"round": rnd, "site": self.trainer.site, **meta,
                      "scored_through": self.scored_through, "scores": self.scores,
                      "last_scored": None if self.last_scored is None
                      else {"weights": self.last_scored[0], "scores": self.last_scored[1]},
                      # the rounds it can vouch for after a restart (the latest few)
                      "trained": sorted(self.trained)[-_KEEP_TRAINED:]})
        return state_hash(kept)

    def restore(self) -> int:
        """Load the last saved kept state, if any; return its round (0 when none)."""
        if not self.state_path.exists():
            return 0
        tensors, meta = load_tensors(self.state_path)
        rnd, scored_through, scores = (_count(meta, key, self.state_path)
                                       for key in ("round", "scored_through", "scores"))
        _check_history(meta.get("dp_history"), self.state_path)
        last_scored = _last_scored(meta.get("last_scored"), self.state_path)
        trained = meta.get("trained", [])
        if not isinstance(trained, list) or not all(
                isinstance(r, int) and not isinstance(r, bool) and 0 < r <= rnd for r in trained):
            raise ValueError(f"Site state file {self.state_path}: 'trained' must list rounds "
                             f"from 1 to its round {rnd}, got {trained!r}. This is not a file "
                             "the site wrote.")
        layers, hooks = split_site_state(tensors)
        self.trainer.load_kept(layers)
        self.trainer.load_site_state(hooks, meta)
        self.trainer.rounds_trained = rnd
        self.trained = set(trained) | ({rnd} if rnd > 0 else set())
        self.scored_through, self.scores = scored_through, scores
        self.last_scored = last_scored
        if self.sent_path.exists():
            self.own = load_tensors(self.sent_path)[0]
        logger.info("Site %s resumed its private state of round %d from %s",
                    self.trainer.site, rnd, self.state_path)
        return rnd

    # -- what comes in -------------------------------------------------------------------
    def check_model(self, weights: dict, what: str) -> None:
        """Refuse a global model no honest server sends, before any computation on it.

        Non-finite values, values beyond the site's bound, all-zero or constant layers
        (:func:`~fedbn_med.fl.model_checks.hostile_model_reason`); and, once this site has
        sent an update in this federation without DP, a model that is not plausibly an
        aggregate of it (:func:`~fedbn_med.fl.model_checks.shift_reason`).
        """
        site, policy = self.trainer.site, self.policy
        reason = hostile_model_reason(weights, policy.max_weight_abs)
        if reason is None and self.own is not None and self.trainer.privacy is None:
            reason = shift_reason(weights, self.own, policy.max_model_shift)
        if reason is not None:
            raise PermissionError(_refused(
                f"Site {site} refuses the model of {what} message before computing "
                f"anything on it: {reason}."))

    def fit(self, weights: dict, config: dict, control: dict) -> tuple[dict, int, dict]:
        """Train one round; refuse (and undo) a round that gave any non-finite value.

        A site never writes, nor sends, non-finite state: its private layers go back to
        what they were before the round, and nothing is saved.
        """
        trainer = self.trainer
        before = {k: v.detach().clone() for k, v in self.kept_state().items()}
        trained_before = trainer.rounds_trained
        sent, n, fit = trainer.fit(weights, config, control)
        bad = nonfinite_keys({**self.kept_state(), **sent})
        if bad:
            trainer.load_kept(before)
            trainer.rounds_trained = trained_before
            raise ValueError(_refused(
                f"Site {trainer.site}: training in round {config.get('round')} gave "
                f"non-finite values in {bad[:3]}; nothing is sent, and the site keeps its "
                f"private state of round {trained_before}."))
        return sent, n, fit

    def keep_sent(self, sent: dict) -> None:
        """Remember (in memory and on disk, atomically) the update this site sent."""
        self.own = {k: v.detach().clone() for k, v in sent.items()}
        save_tensors(self.sent_path, self.own, {"site": self.trainer.site})

    # -- what leaves the site ------------------------------------------------------------
    def score_refusal(self, aggregate_round: int) -> str | None:
        """Return why the global model of ``aggregate_round`` is not scored (None: it is)."""
        site = self.trainer.site
        if self.trainer.privacy is not None:
            return (f"site {site} sends no scores under client-level DP (its DP budget covers "
                    "its updates, not its scores)")
        if aggregate_round not in self.trained:
            return (f"site {site} scores only the aggregate of a round it took part in; it "
                    f"did not train round {aggregate_round} of federation "
                    f"'{self.federation_id}' (it trained {sorted(self.trained) or 'none'})")
        if aggregate_round <= self.scored_through:
            return (f"site {site} already scored round {self.scored_through}'s model; each "
                    "round's model is scored once")
        if self.scores >= self.policy.max_scores:
            return (f"site {site} has sent its {self.policy.max_scores} scores of this "
                    f"federation (max_scores_per_run in "
                    f"{self.policy.path or 'its defaults'})")
        return None

    def score(self, weights: dict, aggregate_round: int) -> dict[str, float]:
        """Score ``weights`` as the aggregate of ``aggregate_round``; count it; bound it."""
        digest = state_hash(weights)
        scores = bounded(self.trainer.score(weights))
        self.scored_through = aggregate_round
        self.scores += 1
        self.last_scored = (digest, scores)
        return scores

    def scores_again(self, weights: dict, aggregate_round: int) -> dict[str, float] | None:
        """Return the scores already sent for these very weights of ``aggregate_round``.

        A server that crashed after the site scored a round, but before the reply reached
        it, asks again for the same aggregate when it resumes; the site sends what it sent
        then (not counted again: nothing new leaves it). Other weights get None.
        """
        if self.last_scored is None or aggregate_round != self.scored_through:
            return None
        digest, scores = self.last_scored
        return dict(scores) if digest == state_hash(weights) else None

    def check_budget(self, rounds: int) -> None:
        """Refuse a run whose releases would take the site's epsilon above its ceiling."""
        ceiling, trainer = self.policy.epsilon_max, self.trainer
        if ceiling is None or not trainer.exchanged:
            return
        if trainer.privacy is None:
            raise PermissionError(_refused(
                f"Site {trainer.site} refuses this run: its site file {self.policy.path} caps "
                f"its DP epsilon at dp_epsilon_max = {ceiling:g}, and this run would send "
                "its updates without DP (give the run --dp-clip and --dp-noise, or the site "
                "file dp_clip and dp_noise)."))
        assert self.ledger is not None
        privacy = trainer.privacy
        left = max(0, rounds - trainer.rounds_trained)
        planned = [*trainer.dp_history, (privacy.noise, 1.0, left)]
        before = self.ledger.spent(privacy.delta, trainer.dp_history,
                                   exclude=self.federation_id)
        after = self.ledger.spent(privacy.delta, planned, exclude=self.federation_id)
        if after > ceiling:
            raise PermissionError(_refused(
                f"Site {trainer.site} refuses this run: it has spent epsilon {before:.2f} over "
                f"its federations ({self.ledger.path}), and {left} more rounds at dp_noise "
                f"{privacy.noise:g} would bring it to {after:.2f}, above its ceiling "
                f"dp_epsilon_max = {ceiling:g} ({self.policy.path})."))

    def check_release(self) -> None:
        """Refuse one more DP release when it would cross the site's ceiling."""
        ceiling, trainer = self.policy.epsilon_max, self.trainer
        if ceiling is None or trainer.privacy is None:
            return
        assert self.ledger is not None
        one_more = [*trainer.dp_history, (trainer.privacy.noise, 1.0, 1)]
        after = self.ledger.spent(trainer.privacy.delta, one_more, exclude=self.federation_id)
        if after > ceiling:
            raise PermissionError(_refused(
                f"Site {trainer.site} refuses to train: one more round would bring its epsilon "
                f"to {after:.2f}, above its ceiling dp_epsilon_max = {ceiling:g} "
                f"({self.policy.path})."))

    def record_release(self) -> None:
        """Write this federation's DP releases to the site's ledger."""
        if self.ledger is not None and self.trainer.privacy is not None:
            self.ledger.record(self.federation_id, self.trainer.dp_history)


def _count(meta: dict[str, object], key: str, path: Path) -> int:
    value = meta.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"Site state file {path}: '{key}' must be a whole number >= 0, got {value!r}. "
            "This is not a file the site wrote; move it away to start this federation's "
            "state afresh.")
    return value


def _last_scored(value: object, path: Path) -> tuple[str, dict[str, float]] | None:
    if value is None:
        return None
    ok = (isinstance(value, dict) and set(value) == {"weights", "scores"}
          and isinstance(value["weights"], str) and isinstance(value["scores"], dict)
          and all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                  for k, v in value["scores"].items()))
    if not ok or not isinstance(value, dict):
        raise ValueError(
            f"Site state file {path}: 'last_scored' must be {{'weights': hash, 'scores': "
            f"{{name: number}}}}, got {value!r}. This is not a file the site wrote.")
    return value["weights"], {k: float(v) for k, v in value["scores"].items()}


def _check_history(history: object, path: Path) -> None:
    ok = history is None or (isinstance(history, list) and all(
        isinstance(h, list) and len(h) == 3
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in h)
        for h in history))
    if not ok:
        raise ValueError(
            f"Site state file {path}: 'dp_history' must be a list of [noise, sample_rate, "
            f"releases], got {history!r}. This is not a file the site wrote.")


def _refused(reason: str) -> str:
    logger.error(reason)
    return reason
