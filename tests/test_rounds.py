"""One round, defined once: its plan, the checks on replies, and the aggregation."""

from __future__ import annotations

import pytest
import torch

from fedbn_med.fl.reply_checks import outlier_reason, update_norm
from fedbn_med.fl.rounds import Reply, close_round, plan_round
from fedbn_med.fl.strategies import FedAvg, FedBN, SingleSet

GLOBAL = {"w": torch.zeros(3, 2), "b": torch.zeros(2)}


def _reply(site: str, value: float, n: int = 10, **extra: torch.Tensor) -> Reply:
    return Reply(site, {"w": torch.full((3, 2), value), "b": torch.full((2,), value), **extra}, n)


def test_plan_carries_round_epochs_and_folded_evaluation():
    assert plan_round(1, fold_evaluation=True).evaluate_first is False
    plan = plan_round(3, local_epochs=4, fold_evaluation=True)
    assert plan.evaluate_first and plan.trainer_config() == {"round": 3, "local_epochs": 4}
    assert plan_round(2).trainer_config() == {"round": 2}
    with pytest.raises(ValueError, match="integer >= 1, got 0"):
        plan_round(0)
    with pytest.raises(ValueError, match="local_epochs must be at least 1, got 0"):
        plan_round(1, local_epochs=0)


def test_sound_replies_are_averaged_by_examples():
    out = close_round(FedAvg(), GLOBAL, [_reply("A", 1.0, 10), _reply("B", 4.0, 30)])
    assert out.accepted == ["A", "B"] and out.refused == {}
    torch.testing.assert_close(out.global_weights["w"], torch.full((3, 2), 3.25))


def test_each_bad_reply_is_left_out_with_its_reason():
    replies = [
        _reply("A", 1.0), _reply("B", 1.5),
        _reply("NAN", float("nan")),
        Reply("SHAPE", {"w": torch.ones(2, 3), "b": torch.ones(2)}, 10),
        _reply("PRIV", 1.0, **{"bn.running_var": torch.ones(2)}),
        _reply("ZERO", 1.0, n=0),
        _reply("HUGE", 1e6),
    ]
    out = close_round(FedBN(), GLOBAL, replies, {"bn.running_var"})
    assert out.accepted == ["A", "B"]
    assert "NaN or Inf" in out.refused["NAN"]
    assert "shape (2, 3), expected (3, 2)" in out.refused["SHAPE"]
    assert "site-private keys ['bn.running_var']" in out.refused["PRIV"]
    assert "0 training examples" in out.refused["ZERO"]
    assert "over 50x the others' median" in out.refused["HUGE"]
    torch.testing.assert_close(out.global_weights["w"], torch.full((3, 2), 1.25))


def test_outlier_check_does_not_depend_on_reply_order():
    a, b, huge = _reply("A", 1.0), _reply("B", 2.0), _reply("HUGE", 1e6)
    first = close_round(FedAvg(), GLOBAL, [huge, a, b])
    last = close_round(FedAvg(), GLOBAL, [a, b, huge])
    assert set(first.refused) == set(last.refused) == {"HUGE"}
    torch.testing.assert_close(first.global_weights["w"], last.global_weights["w"])


def test_nothing_sound_keeps_the_global_weights():
    out = close_round(FedAvg(), GLOBAL, [_reply("NAN", float("nan"))])
    assert out.accepted == [] and set(out.refused) == {"NAN"}
    assert torch.equal(out.global_weights["w"], GLOBAL["w"])


def test_a_strategy_that_exchanges_nothing_averages_nothing():
    out = close_round(SingleSet(), {}, [Reply("A", {}, 5), Reply("B", {}, 7)])
    assert out.accepted == ["A", "B"] and out.global_weights == {}


def test_norms():
    assert update_norm({"w": torch.full((2,), 3.0)}, {"w": torch.full((2,), -1.0)}) == \
        pytest.approx(32 ** 0.5)
    assert outlier_reason(10.0, []) is None
    assert outlier_reason(10.0, [1.0, 1.0]) is None
    assert outlier_reason(100.0, [1.0, 2.0, 1.0]) is not None
