"""The task's selection rule picks the reported round everywhere: in process, in the run's
table, in the weights kept, and in the server's recorder (``Task.selection``)."""

from __future__ import annotations

import pytest
import torch

from fedbn_med.evaluation.report import run_result
from fedbn_med.evaluation.selection import RunningBest, best_round, select_round
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import Selection
from fedbn_med.training.data import SiteData
from fedbn_med.training.inprocess import build_federation, run_in_process

DICE = Selection("dice", lower=False)
#: Round 1 has the lowest validation loss, round 2 the highest validation Dice.
ROWS = [{"round": r, "site": s, "val_loss": loss, "val_dice": dice, "test_dice": dice}
        for s in ("A", "B") for r, loss, dice in ((1, 0.5, 0.2), (2, 0.6, 0.9), (3, 0.7, 0.4))]


def test_a_score_rule_picks_another_round_than_the_loss() -> None:
    assert select_round(ROWS) == best_round(ROWS) == 1
    assert select_round(ROWS, DICE) == 2
    result = run_result(ROWS, rule=DICE)
    assert result.selected_round == 2 and result.selected["A"]["test_dice"] == 0.9
    assert "Round 2 of 3 selected (the highest mean validation dice over the sites)" \
        in result.table
    assert "(the lowest mean validation loss over the sites)" in run_result(ROWS).table


def test_the_running_best_follows_the_rule() -> None:
    running, by_loss = RunningBest.by(DICE), RunningBest.by(None)
    for rnd in (1, 2, 3):
        sites = [r for r in ROWS if r["round"] == rnd]
        running.take(rnd, sites)
        by_loss.take(rnd, sites)
    assert (running.best, by_loss.best) == (2, 1)


def _site_data(n_train: int, seed: int, d: int = 12) -> SiteData:
    gen = torch.Generator().manual_seed(seed)
    n = n_train + 16
    y = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, d, generator=gen) + 2.0 * seed
    x[:, 0] += 1.5 * y
    return SiteData(train=(x[:n_train], y[:n_train]), val=(x[n_train:n_train + 8],
                                                           y[n_train:n_train + 8]),
                    test=(x[n_train + 8:], y[n_train + 8:]))


@pytest.mark.parametrize("rule", [Selection("accuracy", lower=False), Selection()])
def test_in_process_keeps_the_weights_of_the_rules_round(rule: Selection) -> None:
    datas = {"NYU": _site_data(40, 0), "UM": _site_data(24, 1)}
    spec = RunSpec.for_task("abide", sites=tuple(datas), strategy="fedbn", rounds=6,
                            device="cpu")
    federation = build_federation(spec, datas)
    history = run_in_process(federation.trainers, spec.strategy_obj(), spec.rounds, rule=rule)
    expected = best_round(history.rows, rule.metric, lower=rule.lower)
    assert history.best_round() == expected == history.result().selected_round
    # the weights kept are those of that round, or none where the rule fell back
    assert history.selected_round in (expected, 0)
    assert history.selected_round == 0 or history.selected_weights
