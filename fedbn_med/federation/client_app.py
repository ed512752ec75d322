"""The ClientApp: one site's :class:`SiteTrainer` behind Flower messages.

The site is named by the node config (:class:`~fedbn_med.federation.config.NodeSettings`);
the run config carries the :class:`~fedbn_med.spec.RunSpec` (a site's view of it: where
its data lie is the site's own setting, never the server's). A site sends only the keys
its strategy exchanges: under FedBN never a normalisation-layer tensor. Whatever the site
keeps (its BN layers; under SingleSet its whole model) is saved after every round,
atomically, in the node's ``state-dir``, so a restarted site resumes with its own state
and a runtime that starts a fresh process per message still sees it.

A score (the evaluation of a model on the site's own validation and test data) depends
on the site's private layers, so a server that chose the weights could read those layers
back from the scores. A site therefore scores only models it can account for:

- the aggregate of a round it took part in, once: in the next round's train message
  (``evaluate-first``, the very weights it then trains from) or in the final evaluate
  message of that round; never a round it did not train, nor one already scored (across
  runs of the federation too: the last round scored is in its state file). Asked again
  for the very weights it last scored (a server resumed after a crash that lost the
  reply), it sends the same scores again: nothing new leaves the site;
- at most ``max_scores_per_run`` scores per federation (its site file, default 500);
- at bounded precision (:data:`~fedbn_med.fl.release.SCORE_DECIMALS` decimals, losses capped
  at :data:`~fedbn_med.fl.release.MAX_LOSS`; the in-process engine records the same);
- under client-level DP, not at all: the DP budget covers the updates, not the scores
  (nor the training loss, which a DP site does not send either).

Before it computes anything on a model the server sent (training or scoring), a site
refuses one that no honest server sends (:meth:`SiteRuntime.check_model`): non-finite
values, values beyond its bound, all-zero or constant layers, and, without DP, a model
that is no aggregate of the update it sent last (:mod:`fedbn_med.fl.model_checks`). It
trains with its own settings or within its own bounds (``[training]`` in its site file),
runs only the run specs it approved when it pins them (``approved_specs``), never writes
nor sends non-finite state, and logs what came in and what left in its hash-chained
audit trail (:mod:`fedbn_med.federation.audit`). See ``docs/threat-model.md``.

Its DP spending is kept across federations (:class:`~fedbn_med.fl.privacy.PrivacyLedger`,
``<state-dir>/<site>.dp_ledger.json``); a run, or a round, that would take it above the site
file's ``dp_epsilon_max`` is refused.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedbn_med.federation.audit import AuditLog, run_spec_hash, tensor_facts
from fedbn_med.federation.config import APP_HASH_KEY, NodeSettings, read_site_config
from fedbn_med.federation.kept_rounds import keep_rounds
from fedbn_med.federation.records import Payload, unpack
from fedbn_med.federation.secagg import (
    check_outgoing,
    clipping_range,
    is_secagg,
    masked_reply,
    secagg_gate,
)
from fedbn_med.federation.site_runtime import SiteRuntime, _refused
from fedbn_med.federation.wire import (
    EVAL,
    MAX_NORM,
    METRICS,
    SCALE,
    SETUPS,
    EvaluateInstruction,
    EvaluateResult,
    SiteFacts,
    SiteState,
    TrainInstruction,
    TrainResult,
    config_round,
)
from fedbn_med.fl.privacy import PrivacyLedger
from fedbn_med.fl.release import MAX_LOSS, SCORE_DECIMALS, bounded, bounded_fit
from fedbn_med.fl.rounds import plan_round
from fedbn_med.fl.scaffold import join_controls, split_controls
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import get_task
from fedbn_med.tasks.site_toml import SitePolicy, site_policy
from fedbn_med.training.trainer import SiteTrainer

__all__ = ["MAX_LOSS", "SCORE_DECIMALS", "SiteRuntime", "app", "bounded"]

logger = logging.getLogger(__name__)

app = ClientApp()


_RUNTIMES: dict[tuple[int, str], SiteRuntime] = {}
_SETUPS = {"count": 0}


def runtime(context: Context) -> SiteRuntime:
    """Return this site's runtime for the run, building it on the run's first message."""
    node = NodeSettings.from_node_config(context.node_config)
    key = (context.run_id, node.site)
    if key not in _RUNTIMES:
        # The spec without any path: the data are the node's own (--data-dir), else its
        # site file's, else the built-in data; nothing the server says names a path here.
        config, federation_id = read_site_config(context.run_config)
        if config.strategy_obj().reads_every_site:  # whatever the server asks
            raise PermissionError(
                f"Site {node.site} does not run strategy '{config.strategy}': it reads every "
                "site's data in one place, which a site never does for a federation.")
        policy = site_policy(node.site, config.task)
        _check_approved(node.site, config, policy,
                        str(context.node_config.get(APP_HASH_KEY, "")))
        try:  # the site decides how it trains: its values, or the run's within its bounds
            config = policy.training.apply(config)
        except PermissionError as err:
            raise PermissionError(_refused(f"Site {node.site} refuses this run: {err}")) from None
        state_path = node.state_path(federation_id)
        ledger = PrivacyLedger(Path(node.state_dir) / f"{node.site}.dp_ledger.json", node.site)
        task = get_task(config.task)
        trainer = task.build_site(node.site, config, node.data_dir, node.device)
        trainer.pin_threads()  # this site's process computes with the spec's threads
        # The site's own policy, on the keys its strategy would actually send.
        if trainer.exchanged & trainer.partition.private and not node.share_private:
            raise PermissionError(_refusal(node.site, config.strategy))
        rt = SiteRuntime(trainer=trainer, state_path=state_path, federation_id=federation_id,
                         policy=policy, ledger=ledger)
        rt.restore()
        _check_delta(trainer)
        rt.check_budget(config.rounds)
        _SETUPS["count"] += 1
        rt.setups = _SETUPS["count"]
        _RUNTIMES.clear()  # one run at a time per site process
        _RUNTIMES[key] = rt
    return _RUNTIMES[key]


def _check_approved(site: str, spec: RunSpec, policy: SitePolicy, app_hash: str) -> None:
    # a site with approved_specs / approved_apps runs only those: pinned by hash, the
    # refusal naming both
    for what, approved, digest, key, how in (
            ("run spec", policy.approved_specs, run_spec_hash(spec.to_dict()),
             "approved_specs", "`python -m fedbn_med.federation.approve SPEC.json`"),
            ("app (FAB)", policy.approved_apps, app_hash, "approved_apps",
             "`python -m fedbn_med.federation.approve --fab APP.fab`")):
        if approved is not None and digest not in approved:
            raise PermissionError(_refused(
                f"Site {site} refuses this run: its {what}'s hash is {digest or 'unknown'}, "
                f"and the site approved only {', '.join(approved) or 'none'} ({key} in "
                f"{policy.path}). {how} prints the hash a site approves."))


def _check_delta(trainer: SiteTrainer) -> None:
    # delta is the chance the guarantee fails outright: well below 1/n, or one record in
    # n may be told outright
    privacy, n = trainer.privacy, int(trainer.data.num_train)
    if privacy is not None and n > 0 and privacy.delta * n > 0.1:
        raise PermissionError(_refused(
            f"Site {trainer.site} refuses this run: its DP delta {privacy.delta:g} is not "
            f"well below 1/n for its {n} training examples (it must be at most "
            f"{0.1 / n:.2g}, a tenth of 1/n)."))


def _refusal(site: str, strategy: str) -> str:
    reason = (f"Site {site} refuses strategy '{strategy}': it would send this site's private "
              "(normalisation) layers, and the site's policy keeps them home "
              "(share_private_layers = false in its site file; --share-private-layers "
              "on its command line allows it).")
    logger.error(reason)
    return reason


Handler = Callable[[Message, Context], Message]
_I = TypeVar("_I", TrainInstruction, EvaluateInstruction)
_AUDIT_LOGS: dict[Path, AuditLog] = {}


def _audit_facts(msg: Message, context: Context) -> tuple[AuditLog | None, dict]:
    """Return the site's audit log and what the message says of itself (never values)."""
    try:
        node = NodeSettings.from_node_config(context.node_config)
    except (ValueError, TypeError, KeyError):
        return None, {}
    facts: dict[str, object] = {"message": str(msg.metadata.message_type),
                                "run": int(context.run_id),
                                "app": str(context.node_config.get(APP_HASH_KEY, ""))}
    try:
        spec, federation_id = read_site_config(context.run_config)
        facts["federation"], facts["spec"] = federation_id, run_spec_hash(spec.to_dict())
    except (ValueError, TypeError, KeyError):
        facts["spec"] = "unreadable"
    try:
        rnd = config_round(unpack(msg.content))
        if rnd is not None:
            facts["round"] = rnd
    except (ValueError, TypeError, KeyError):
        pass
    path = Path(node.state_dir) / f"{node.site}.audit.jsonl"
    if path not in _AUDIT_LOGS:  # one per site: its last hash is read from disk once
        _AUDIT_LOGS[path] = AuditLog(path)
    return _AUDIT_LOGS[path], facts


def _reply_facts(reply: Message) -> dict[str, object]:
    payload = unpack(reply.content)
    out: dict[str, object] = {"tensors": tensor_facts(payload.tensors)}
    if "fitres.parameters" in reply.content.array_records:  # the update, to be masked
        out["secagg"] = "masked update of the shared keys"
    for section in (METRICS, EVAL):
        if section in payload.sections:
            out[section] = sorted(payload.floats(section))  # names only
    metrics = payload.floats(METRICS) if METRICS in payload.sections else {}
    for key in ("dp_epsilon", "dp_noise", "dp_clip", "dp_delta"):
        if key in metrics:
            out[key] = metrics[key]
    return out


def _audited(handler: Handler) -> Handler:
    """Log what ``handler`` received and what it sent, or why it refused, in the audit log."""

    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        log, facts = _audit_facts(msg, context)
        try:
            reply = handler(msg, context)
        except Exception as err:
            if log is not None:
                log.append("received", **facts, refused=f"{type(err).__name__}: {err}"[:400])
            raise
        if log is not None:
            log.append("received", **facts)
            log.append("sent", **{k: v for k, v in facts.items() if k != "message"},
                       **_reply_facts(reply))
        return reply

    return wrapped


@app.query()
@_audited
def query(msg: Message, context: Context) -> Message:
    """Tell the server who this site is and what its data look like."""
    rt = runtime(context)
    facts = SiteFacts(site=rt.trainer.site,
                      input_shape=tuple(int(d) for d in rt.trainer.input_shape),
                      num_train=int(rt.trainer.data.num_train),
                      resumed_round=rt.trainer.rounds_trained, private_hash=rt.kept_hash(),
                      device=str(rt.trainer.device))
    return Message(facts.content(), reply_to=msg)


@app.train(mods=[secagg_gate])
@_audited
def train(msg: Message, context: Context) -> Message:
    """Evaluate the incoming global weights if asked, then train and send the update.

    Under SecAgg (:mod:`fedbn_med.federation.secagg`) the update goes out masked.
    """
    rt = runtime(context)
    payload = unpack(msg.content)
    cfg = _instruction(rt, TrainInstruction.from_payload, payload, "a train")
    rnd = cfg.round if cfg.round is not None else rt.trainer.rounds_trained + 1
    scores: dict[str, float] | None = None
    weights, control = split_controls(payload.tensors)  # control: SCAFFOLD's server variate
    received = weights
    rt.check_model(weights, "a train")
    asked = cfg.local_epochs
    epochs: object = None
    if asked is not None:
        try:
            epochs = rt.policy.training.value("local_epochs", asked)
        except PermissionError as err:
            raise PermissionError(_refused(f"Site {rt.trainer.site} refuses round {rnd}: "
                                           f"{err}")) from None
    if cfg.evaluate_first:
        # The previous round's global weights with this site's current private layers:
        # exactly what the site would have scored right after that round's aggregation,
        # and the weights it now trains from.
        again = rt.scores_again(weights, rnd - 1)
        refusal = None if again is not None else rt.score_refusal(rnd - 1)
        if again is not None:
            scores = again
        elif refusal is None:
            scores = rt.score(weights, rnd - 1)
        else:
            logger.info("Round %d: no scores sent: %s", rnd, refusal)
    # this site's private layers now are those of round rnd - 1: kept with the best's
    keep_rounds(rt.state_path, rt.kept_state(), rnd - 1, cfg.selected_round)
    rt.check_release()
    plan = plan_round(rnd, local_epochs=None if epochs is None else int(cast(int, epochs)))
    weights, n, fit = rt.fit(weights, plan.trainer_config(), control)
    rt.record_release()
    rt.trained.add(rnd)
    digest = rt.save(rnd)
    rt.keep_sent(weights)
    released = bounded_fit(fit)
    if rt.trainer.privacy is not None:
        # Un-noised, the training loss of crafted weights reads BN shifts back: under DP
        # everything data-dependent that leaves the site is the noised update alone.
        released.pop("train_loss", None)
    result = TrainResult(num_examples=float(n),
                         metrics=_numbers({**released, SETUPS: rt.setups}),
                         evals=scores, state=SiteState(digest, rnd))
    if is_secagg(msg):
        return Message(_secagg_content(rt, context, cfg, weights, received, n, result),
                       reply_to=msg)
    return Message(result.content(join_controls(weights, rt.trainer.control_delta)),
                   reply_to=msg)


def _instruction(rt: SiteRuntime, parse: Callable[[Payload], _I], payload: Payload,
                 what: str) -> _I:
    try:
        return parse(payload)
    except ValueError as err:
        raise ValueError(_refused(f"Site {rt.trainer.site} refuses {what} message: "
                                  f"{err}.")) from None


def _secagg_content(rt: SiteRuntime, context: Context, cfg: TrainInstruction, sent: dict,
                    received: dict, n: int, result: TrainResult):  # -> RecordDict
    # The site's own checks of what it masks (the server sees only the sum), then the
    # vector: its weight is its own count (1 each when the run weighs sites alike).
    site = rt.trainer.site
    if rt.trainer.control_delta:
        raise PermissionError(_refused(f"Site {site} refuses SecAgg with a strategy that "
                                       "sends control variates (SCAFFOLD)."))
    scale, max_norm = cfg.secagg_scale, cfg.secagg_max_norm
    if scale is None or max_norm is None:  # the values are checked by TrainInstruction
        raise ValueError(f"Site {site} refuses a SecAgg round whose {SCALE} is {scale!r} and "
                         f"{MAX_NORM} {max_norm!r}: expected positive numbers.")
    check_outgoing(site, sent, received, rt.trainer.partition.private,
                   clipping_range(context), float(max_norm))
    equal = read_site_config(context.run_config)[0].weighting == "equal"
    return masked_reply(result.content(), sent, 1.0 if equal else float(n), float(scale))


@app.evaluate()
@_audited
def evaluate(msg: Message, context: Context) -> Message:
    """Score the final global weights on this site's validation and test splits.

    Only the aggregate of a round the site trained, once (see the module's docstring);
    under DP the reply carries no scores.
    """
    rt = runtime(context)
    payload = unpack(msg.content)
    cfg = _instruction(rt, EvaluateInstruction.from_payload, payload, "an evaluate")
    rnd = cfg.round
    weights = split_controls(payload.tensors)[0]
    rt.check_model(weights, "an evaluate")
    again = rt.scores_again(weights, rnd)
    if again is not None:
        return Message(EvaluateResult(_numbers(again)).content(), reply_to=msg)
    refusal = rt.score_refusal(rnd)
    if refusal is not None and rt.trainer.privacy is not None:
        logger.info("Final evaluation: no scores sent: %s", refusal)
        return Message(EvaluateResult().content(), reply_to=msg)
    if refusal is not None:
        raise PermissionError(_refused(f"Refused to score the model of an evaluate message: "
                                       f"{refusal}."))
    metrics = rt.score(weights, rnd)
    rt.save(rt.trainer.rounds_trained)
    keep_rounds(rt.state_path, rt.kept_state(), rt.trainer.rounds_trained, cfg.selected_round)
    return Message(EvaluateResult(_numbers(metrics)).content(), reply_to=msg)


def _numbers(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}
