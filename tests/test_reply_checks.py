"""The server's rules for what a site sends, as pure functions (the attacks run in
``tests/test_attacks_replies.py``): dtypes, decoding, metric names and values, the
weight one site's claimed count buys, and the outlier rule over a long run."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from fedbn_med.federation.records import RECORD, pack, unpack
from fedbn_med.federation.server.checks import (
    MAX_ENTRIES,
    SCORE_RANGES,
    evaluate_reason,
    metrics_reason,
    read_evaluate,
    read_query,
    read_train,
    refusal,
    score_names,
    train_reason,
)
from fedbn_med.fl.reply_checks import (
    HISTORY_SHARE,
    OUTLIER_FACTOR,
    check_reply,
    outlier_reason,
    update_norm,
)
from fedbn_med.fl.rounds import Reply, close_round
from fedbn_med.fl.strategies import FedAvg, FedBN
from fedbn_med.fl.weighting import capped_weights
from fedbn_med.tasks import TASK_NAMES, get_task

GLOBAL = {"w": torch.zeros(3, 2), "nbt": torch.tensor(4, dtype=torch.int64)}
HASH = "0" * 64


# ------------------------------------------------------------------ item 3: dtypes
def test_a_tensor_of_another_dtype_is_refused_whatever_its_values():
    sent = {"w": torch.full((3, 2), 10**12, dtype=torch.int64), "nbt": GLOBAL["nbt"]}
    assert check_reply(sent, GLOBAL) == ("'w' is torch.int64, expected torch.float32 "
                                         "(the global's dtype)")
    half = {"w": torch.zeros(3, 2, dtype=torch.float64), "nbt": GLOBAL["nbt"]}
    assert "'w' is torch.float64, expected torch.float32" in check_reply(half, GLOBAL)
    sound = {"w": torch.ones(3, 2), "nbt": GLOBAL["nbt"]}
    out = close_round(FedAvg(), GLOBAL, [Reply("A", sound, 5), Reply("B", sent, 5)])
    assert out.accepted == ["A"] and "torch.int64" in out.refused["B"]


def test_integer_keys_count_in_the_norm_and_the_outlier_rule():
    assert update_norm({"nbt": torch.tensor(7)}, {"nbt": torch.tensor(4)}) == 3.0
    honest = [Reply(s, {"w": torch.full((3, 2), 0.1), "nbt": torch.tensor(8)}, 10)
              for s in ("A", "B", "C")]
    huge = Reply("D", {"w": torch.full((3, 2), 0.1), "nbt": torch.tensor(10**12)}, 10)
    out = close_round(FedAvg(), GLOBAL, [*honest, huge])
    assert out.accepted == ["A", "B", "C"]
    assert out.refused["D"].startswith("its integer counters: its update norm 1e+12")
    assert int(out.global_weights["nbt"]) == 8


# ------------------------------------------------------------------ item 4: decoding
@pytest.mark.parametrize("entry, value, message", [
    ("dims", [-1, -1], "'dims' must be a list of whole numbers >= 0"),
    ("dims", [3.0, 2.0], "'dims' must be a list of whole numbers >= 0"),
    ("ndims", [True], "'ndims' must be a list of whole numbers >= 0"),
    ("float-keys", "w", "'float-keys' must be a list of names"),
    ("float-keys", ["w", "w"], "names a tensor twice"),
    ("int-keys", ["w"], "names a tensor both float and int"),
    ("dims", [2**40, 2**40 + 6], "carries 6 float values but its layout describes 12089"),
    ("float", "abc", "float tensor bytes are malformed"),
])
def test_a_tampered_layout_is_one_value_error_naming_the_fault(entry, value, message):
    content = pack({"w": torch.randn(3, 2)})
    content[RECORD][f"tensors/{entry}"] = value
    with pytest.raises(ValueError, match=message):
        unpack(content)


def test_dims_whose_product_wraps_around_are_refused():
    # 2**32 * 2**32 is 0 in int64: the old count let such a layout through to reshape
    content = pack({"w": torch.randn(1)})
    content[RECORD]["tensors/ndims"] = [3]
    content[RECORD]["tensors/dims"] = [2**32, 2**32, 1]
    with pytest.raises(ValueError, match="carries 1 float values but its layout describes"):
        unpack(content)


def test_no_tampering_escapes_unpack_as_anything_but_value_error():
    rng = random.Random(0)
    junk = [-1, 0, 2**63, 1.5, True, "x", b"\0" * 3, [], [-1], ["a", 1], [[1]], None, {"a": 1}]
    base = pack({"w": torch.randn(2, 3), "n": torch.tensor(5)}, metrics={"train_loss": 0.5})
    entries = [k for k in base[RECORD] if k.startswith("tensors/")]
    for _ in range(300):
        content = pack({"w": torch.randn(2, 3), "n": torch.tensor(5)})
        for entry in rng.sample(entries, rng.randint(1, 3)):
            try:
                content[RECORD][entry] = rng.choice(junk)
            except (TypeError, ValueError):
                continue  # Flower's record refuses this value type itself
        try:
            unpack(content)
        except ValueError:
            pass


# ------------------------------------------------------------------ item 5: names
def test_only_the_tasks_metrics_in_a_bounded_count():
    scores = score_names(get_task("abide").score_metrics)
    sound = {"metrics": {"num-examples": 10, "train_loss": 0.7, "setups": 1},
             "eval": {"test_auc": 0.6, "val_loss": 0.69}, "state": {"private-hash": HASH,
                                                                    "round": 2}}
    assert train_reason(sound, scores) is None
    flood = {**sound, "metrics": {**sound["metrics"], **{f"m{i}": 1.0 for i in range(52_000)}}}
    assert train_reason(flood, scores).startswith(
        f"its metrics section holds 52003 metrics (at most {MAX_ENTRIES}")
    assert "names a metric 'test_dice', which the task does not define" in \
        train_reason({**sound, "eval": {"test_dice": 0.5}}, scores)
    assert "holds sections ['junk']" in train_reason({**sound, "junk": {"a": 1}}, scores)
    assert "lacks num-examples" in train_reason({**sound, "metrics": {"train_loss": 0.5}},
                                                scores)
    # a DP site sends no train_loss (issue 44): the reply stands without it
    assert train_reason({**sound, "metrics": {"num-examples": 3}}, scores) is None
    assert "not a SHA-256" in train_reason(
        {**sound, "state": {"private-hash": "x" * 10_000, "round": 2}}, scores)
    assert "state section holds ['extra']" in train_reason(
        {**sound, "state": {"private-hash": HASH, "round": 2, "extra": 1}}, scores)
    assert evaluate_reason({"metrics": {}}, scores) is None  # a DP site sends no scores
    assert "names a metric 'x'" in evaluate_reason({"metrics": {"x": 1.0}}, scores)


def test_every_tasks_metrics_have_a_range_and_are_what_its_trainer_names():
    from fedbn_med.evaluation.metrics import METRIC_NAMES
    from fedbn_med.tasks.imaging.synth import TISSUE_CLASSES

    for name in TASK_NAMES:
        for score in score_names(get_task(name).score_metrics):
            metric = score.partition("_")[2]
            assert metric in SCORE_RANGES or metric.partition("_")[0] in SCORE_RANGES, score
    assert get_task("abide").score_metrics == get_task("xray").score_metrics == METRIC_NAMES
    assert set(get_task("mri").score_metrics) == {
        "dice", "loss", *(f"dice_{c}" for c in TISSUE_CLASSES[1:])}


# ------------------------------------------------------------------ a node's query reply
QUERY = {"site": "NYU", "input-shape": [6105], "resumed-round": 0, "private-hash": HASH,
         "num-train": 80, "device": "cpu"}


def test_a_sound_query_reply_reads_as_site_info():
    info = read_query(pack(info=QUERY))
    assert (info.site, info.input_shape, info.resumed_round) == ("NYU", (6105,), 0)
    assert read_query(pack(info={**QUERY, "private-hash": ""})).private_hash == ""


@pytest.mark.parametrize("key, value, message", [
    ("site", "../../etc", "its site name '../../etc' is not 1 to 64 letters, digits"),
    ("site", "N" * 5000, "is not 1 to 64 letters"),
    ("site", 7, "its site name 7 is not"),
    ("input-shape", [6105.5], "its input-shape [6105.5] is not 1 to 8 whole numbers from 1"),
    ("input-shape", [0], "its input-shape [0] is not"),
    ("input-shape", [True], "its input-shape [True] is not"),
    ("input-shape", [1] * 9, "is not 1 to 8 whole numbers"),
    ("input-shape", [], "its input-shape [] is not"),
    ("resumed-round", -1, "its resumed-round -1 is not a whole number from 0"),
    ("resumed-round", "5", "its resumed-round '5' is not a whole number from 0"),
    ("private-hash", "x" * 10_000, "is not a SHA-256 in hex"),
])
def test_a_query_reply_is_checked_before_anything_is_kept(key, value, message):
    with pytest.raises(ValueError) as err:
        read_query(pack(info={**QUERY, key: value}))
    assert message in str(err.value) and len(str(err.value)) < 200


def test_a_query_reply_without_a_site_is_refused():
    with pytest.raises(ValueError, match="its site name None is not"):
        read_query(pack(info={k: v for k, v in QUERY.items() if k != "site"}))


def test_train_and_evaluate_replies_read_as_checked_values():
    scores = score_names(get_task("abide").score_metrics)
    sent = {"w": torch.ones(3, 2)}
    read = read_train(pack(sent, metrics={"num-examples": 10, "train_loss": 0.7, "setups": 1,
                                          "dp_epsilon": 2.0},
                           eval={"test_auc": 0.6}, state={"private-hash": HASH, "round": 2}),
                      "NYU", scores)
    assert read.update.site == "NYU" and read.update.num_examples == 10
    assert torch.equal(read.update.weights["w"], sent["w"])
    assert read.fits == {"num_examples": 10, "train_loss": 0.7, "setups": 1,
                         "dp_epsilon": 2.0}
    assert read.evals == {"test_auc": 0.6} and read.private_hash == HASH
    bare = read_train(pack(sent, metrics={"num-examples": 10, "train_loss": 0.7}), "UM", scores)
    assert bare.evals is None and bare.private_hash is None and bare.fits["setups"] == 0.0
    assert "train_loss" not in read_train(pack(sent, metrics={"num-examples": 3}), "UM",
                                          scores).fits
    assert read_evaluate(pack(metrics={"val_loss": 0.5}), scores) == {"val_loss": 0.5}
    with pytest.raises(ValueError, match="holds only metrics"):
        read_evaluate(pack(metrics={}, eval={"val_loss": 0.5}), scores)
    assert refusal(KeyError("x" * 900)).startswith("KeyError: ") \
        and len(refusal(ValueError("y" * 900))) == 500


# ------------------------------------------------------------------ item 6: values
@pytest.mark.parametrize("section, name, value, message", [
    ("eval", "test_auc", 1e308, "'test_auc' (eval) is 1e+308 (expected a finite number "
                                "from 0 to 1, or NaN for undefined)"),
    ("eval", "test_accuracy", math.nan, "'test_accuracy' (eval) is nan"),
    ("eval", "val_loss", math.inf, "'val_loss' (eval) is inf"),
    ("eval", "val_loss", -0.5, "'val_loss' (eval) is -0.5"),
    ("eval", "test_f1", 1.5, "'test_f1' (eval) is 1.5"),
    ("eval", "test_auc", "0.5", "'test_auc' (eval) is str, not a number"),
    ("metrics", "train_loss", -math.inf, "'train_loss' (metrics) is -inf"),
    ("metrics", "train_loss", math.nan, "'train_loss' (metrics) is nan"),
    ("metrics", "train_loss", 1e308, "'train_loss' (metrics) is 1e+308"),
    ("metrics", "setups", 1.5, "'setups' (metrics) is 1.5 (expected a whole number"),
    ("metrics", "dp_delta", 2.0, "'dp_delta' (metrics) is 2.0"),
])
def test_values_must_be_finite_and_in_their_range(section, name, value, message):
    sections = {"metrics": {"num-examples": 10, "train_loss": 0.5}, "eval": {}}
    sections[section] = {**sections[section], name: value}
    reason = metrics_reason(sections)
    assert reason is not None and message in reason, reason


def test_an_undefined_auc_or_dice_may_be_nan():
    assert metrics_reason({"eval": {"test_auc": math.nan, "val_accuracy": 1.0}}) is None
    mri = score_names(get_task("mri").score_metrics)
    assert metrics_reason({"eval": {"test_dice_csf": math.nan, "test_dice": 0.8}}, mri) is None
    assert "'test_dice_gm' (eval) is 1.2" in metrics_reason({"eval": {"test_dice_gm": 1.2}}, mri)


# ------------------------------------------------------------------ item 2: counts
def test_one_site_claiming_any_count_weighs_at_most_max_share():
    assert capped_weights({"A": 41, "B": 28, "LIAR": 10**9}, 0.5) == {"A": 41, "B": 28,
                                                                     "LIAR": 69}
    assert capped_weights({"A": 10, "B": 30}, 0.5) == {"A": 10, "B": 10}
    assert capped_weights({"A": 5}, 0.5) == {"A": 5}  # one site is the whole average
    with pytest.raises(ValueError, match="max_share must be a share between 0 and 1 "
                                         r"\(exclusive\), got 1.5"):
        capped_weights({"A": 1}, 1.5)
    start = {"w": torch.zeros(4)}
    replies = [Reply("A", {"w": torch.full((4,), 1.0)}, 41),
               Reply("B", {"w": torch.full((4,), 1.0)}, 28),
               Reply("LIAR", {"w": torch.full((4,), 3.0)}, 10**9)]
    trusted = close_round(FedAvg(), start, replies)
    capped = close_round(FedAvg(), start, replies, max_share=0.5)
    assert trusted.shares["LIAR"] > 0.999999
    assert capped.shares == pytest.approx({"A": 41 / 138, "B": 28 / 138, "LIAR": 0.5})
    torch.testing.assert_close(capped.global_weights["w"], torch.full((4,), 2.0))
    assert close_round(FedAvg(), start, replies, weighting="equal",
                       max_share=0.5).shares["LIAR"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="max_share must be a share between 0 and 1"):
        close_round(FedAvg(), start, replies, max_share=0.0)


# ------------------------------------------------------------------ item 17: outliers
def _norm_sequence(rounds: int = 200, seed: int = 0) -> list[dict[str, float]]:
    """Update norms per site and round, shaped on a real 200-round FedBN run.

    On the built-in cohort (4 sites, fedbn, 200 rounds, in-process driver) the median
    norm fell from 0.106 in round 1 to about 0.005 by round 200, roughly as t^-0.55,
    each site scattering by about 25 % round to round. UCLA here is the issue's case: an
    honest site whose updates stay large (0.18, scattering 30 %) while the others shrink
    to about 0.005: now and then above OUTLIER_FACTOR times their median, late in training
    (6 times in rounds 151-200 with seed 0, as the issue saw in rounds 135-200).
    """
    rng = np.random.default_rng(seed)
    out = []
    for t in range(1, rounds + 1):
        row = {s: float(a * 0.11 * t ** -0.55 * np.exp(0.25 * rng.standard_normal()))
               for s, a in (("NYU", 1.2), ("UM", 0.7), ("USM", 1.0))}
        row["UCLA"] = float(0.18 * np.exp(0.3 * rng.standard_normal()))
        out.append(row)
    return out


def _run(sequence, attack=None):  # noqa: ANN001, ANN202
    """Close every round on updates of exactly these norms; return the refusals per round."""
    weights = {"w": torch.zeros(8, dtype=torch.float64)}
    direction = torch.ones(8, dtype=torch.float64) / math.sqrt(8)
    reference, refused = 0.0, []
    for t, norms in enumerate(sequence, start=1):
        replies = [Reply(s, {"w": weights["w"] + n * direction}, 10) for s, n in norms.items()]
        if attack is not None:
            replies.append(Reply("EVIL", {"w": weights["w"] + attack(t, reference) * direction},
                                 10))
        out = close_round(FedBN(), weights, replies, norm_reference=reference)
        reference = out.norm_reference
        refused.append(out.refused)  # the start stays put: every norm is measured from it
    return refused, reference


def test_honest_sites_are_kept_over_a_long_run_as_updates_shrink():
    sequence = _norm_sequence()
    # the old rule (no memory: reference 0 every round) drops honest UCLA late in training
    old = [(t, s) for t, norms in enumerate(sequence, 1) for s, n in norms.items()
           if outlier_reason(n, [v for k, v in norms.items() if k != s])]
    assert len(old) >= 5 and {s for _, s in old} == {"UCLA"} and min(t for t, _ in old) > 100
    refused, reference = _run(sequence)
    assert not any(refused), [(t, r) for t, r in enumerate(refused, 1) if r]
    # the reference is the largest median accepted norm, here round 1's
    assert reference == pytest.approx(sorted(sequence[0].values())[1])


def test_the_floor_still_refuses_a_huge_update_in_every_round():
    sequence = _norm_sequence()
    refused, _ = _run(sequence, attack=lambda t, ref: 1000.0)
    assert all("EVIL" in r for r in refused)
    assert all(set(r) == {"EVIL"} for r in refused)
    late = refused[-1]["EVIL"]
    assert f"over {OUTLIER_FACTOR:g}x" in late and "the floor from earlier rounds" in late


def test_one_site_cannot_raise_the_floor_by_sending_just_under_it():
    sequence = _norm_sequence()
    # with EVIL among five accepted sites, the lower median is at most the third honest
    honest_max = max(sorted(r.values())[2] for r in sequence)

    def under(t, reference):  # noqa: ANN001, ANN202
        return 0.99 * OUTLIER_FACTOR * max(HISTORY_SHARE * reference, 1e-3)

    refused, reference = _run(sequence, attack=under)
    assert reference <= honest_max * 1.000001
