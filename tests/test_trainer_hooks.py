"""The site trainer's one loop: round hooks, the strategy's hooks, BN statistics in one place."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

from fedbn_med.fl.hooks import DPHook, ProximalHook, RoundHook
from fedbn_med.fl.privacy import UpdatePrivacy
from fedbn_med.fl.scaffold import ScaffoldHook
from fedbn_med.fl.strategies import FedAvg, FedBN, FedBNScaffold, FedProx
from fedbn_med.onboarding.bn_adapt import estimate_bn_statistics
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.training.bn_stats import start_bn_statistics
from fedbn_med.training.trainer import SiteTrainer

from .test_driver import _site_data


class Recorder(RoundHook):
    """A hook that counts its calls, marks what is sent and keeps a counter as state."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.steps = 0
        self.rounds = 0

    def begin(self, site, rnd: int, server: Mapping[str, torch.Tensor]) -> None:
        self.calls.append(f"begin {rnd}")

    def after_backward(self, scale: float) -> None:
        self.steps += 1

    def end(self, site, rnd, sent, metrics):
        self.calls.append(f"end {rnd}")
        self.rounds += 1
        metrics["recorded_steps"] = float(self.steps)
        return {k: torch.zeros_like(v) for k, v in sent.items()}

    def state(self):
        return {"recorder/rounds": torch.tensor(self.rounds)}, {"recorder": self.rounds}

    def load(self, tensors, meta) -> None:
        self.rounds = int(meta["recorder"])


def _trainer(strategy=None, **options) -> SiteTrainer:
    torch.manual_seed(0)
    return SiteTrainer("A", AbideMLP(12), _site_data(0.0, 1.0, 0), strategy or FedBN(),
                       batch_size=16,
                       seed=0, device="cpu", **options)


def test_a_hook_runs_at_every_point_of_the_round_and_its_state_survives():
    hook = Recorder()
    trainer = _trainer(hooks=[hook])
    sent, _, metrics = trainer.fit(trainer.shared_weights(), {"round": 1})
    assert hook.calls == ["begin 1", "end 1"]
    assert hook.steps == 3 and metrics["recorded_steps"] == 3.0  # 36 rows, batches of 16
    assert all(not v.any() for v in sent.values())  # what the hook returned is sent
    tensors, meta = trainer.site_state()
    assert set(tensors) == {"recorder/rounds"} and meta["recorder"] == 1
    assert meta["dp_history"] == []
    again = _trainer(hooks=[Recorder()])
    again.load_site_state(tensors, meta)
    assert again.hooks[0].rounds == 1


def test_the_strategy_supplies_its_hooks_in_order():
    assert _trainer(FedBN()).hooks == []
    assert [type(h) for h in _trainer(FedProx()).hooks] == [ProximalHook]
    dp = UpdatePrivacy(clip=1.0, noise=1.0)
    hooks = _trainer(FedBNScaffold(mu=0.01), privacy=dp).hooks
    # DP before SCAFFOLD: the variate is updated from what DP released
    assert [type(h) for h in hooks] == [ProximalHook, DPHook, ScaffoldHook]
    trainer = _trainer(FedAvg())
    assert trainer.privacy is None
    trainer.privacy = dp
    assert trainer.privacy == dp and [type(h) for h in trainer.hooks] == [DPHook]


def test_onboarding_and_training_start_bn_statistics_alike():
    x = _site_data(0.0, 1.0, 0).train[0]
    torch.manual_seed(0)
    a, b = AbideMLP(12, dropout=0.5), AbideMLP(12, dropout=0.5)
    b.load_state_dict(a.state_dict())
    estimate_bn_statistics(a, x, batch_size=16)
    assert start_bn_statistics(b, (x[s:s + 16] for s in range(0, len(x), 16)))
    for (key, left), right in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(left, right), key
    with pytest.raises(ValueError, match="needs at least 2 examples"):
        estimate_bn_statistics(a, x[:1])


def _one_site(strategy, batch_size: int, site: str = "A") -> SiteTrainer:
    torch.manual_seed(0)
    return SiteTrainer(site, AbideMLP(12), _site_data(0.0, 1.0, 0), strategy,
                       batch_size=batch_size, seed=0, device="cpu")


def test_with_one_local_step_fedprox_is_fedavg_and_the_site_is_told_once(caplog,
                                                                         monkeypatch):
    import logging

    from fedbn_med.fl import hooks
    from fedbn_med.fl.feddyn import FedDyn

    monkeypatch.setattr(hooks, "_ONE_STEP_TOLD", set())  # told once per process: start afresh
    # 36 training rows in one batch of 64, one local epoch: one step per round
    site = "OneStepSite"
    fedavg, fedprox = _one_site(FedAvg(), 64, site), _one_site(FedProx(mu=1.0), 64, site)
    with caplog.at_level(logging.WARNING, logger="fedbn_med.fl.hooks"):
        for rnd in (1, 2):
            a, _, _ = fedavg.fit(fedavg.shared_weights(), {"round": rnd})
            p, _, _ = fedprox.fit(fedprox.shared_weights(), {"round": rnd})
            assert all(torch.equal(a[k], p[k]) for k in a)
    told = [r.getMessage() for r in caplog.records if "proximal term" in r.getMessage()]
    assert len(told) == 1 and f"Site {site} took 1 local step in round 1" in told[0]
    again = _one_site(FedProx(mu=1.0), 64, site)  # the same site in a later run: not again
    with caplog.at_level(logging.WARNING, logger="fedbn_med.fl.hooks"):
        again.fit(again.shared_weights(), {"round": 1})
    assert len([r for r in caplog.records if "proximal term" in r.getMessage()]) == 1
    # batches of 16: three steps, the term acts from the second on, and nobody is told
    caplog.clear()
    fedavg, fedprox = _one_site(FedAvg(), 16), _one_site(FedProx(mu=1.0), 16)
    with caplog.at_level(logging.WARNING, logger="fedbn_med.fl.hooks"):
        a, _, _ = fedavg.fit(fedavg.shared_weights(), {"round": 1})
        p, _, _ = fedprox.fit(fedprox.shared_weights(), {"round": 1})
    assert any(not torch.equal(a[k], p[k]) for k in a)
    assert not [r for r in caplog.records if "proximal term" in r.getMessage()]
    # FedDyn's linear term acts from the first step: it trains apart and is not told
    caplog.clear()
    fedavg, feddyn = _one_site(FedAvg(), 64, site), _one_site(FedDyn(mu=0.5), 64, site)
    with caplog.at_level(logging.WARNING, logger="fedbn_med.fl.hooks"):
        for rnd in (1, 2):
            a, _, _ = fedavg.fit(fedavg.shared_weights(), {"round": rnd})
            d, _, _ = feddyn.fit(feddyn.shared_weights(), {"round": rnd})
    assert any(not torch.equal(a[k], d[k]) for k in a)
    assert not [r for r in caplog.records if "proximal term" in r.getMessage()]
    # two local epochs of one batch: two steps, the term acts on the second
    fedavg, fedprox = _one_site(FedAvg(), 64), _one_site(FedProx(mu=1.0), 64)
    a, _, _ = fedavg.fit(fedavg.shared_weights(), {"round": 1, "local_epochs": 2})
    p, _, _ = fedprox.fit(fedprox.shared_weights(), {"round": 1, "local_epochs": 2})
    assert any(not torch.equal(a[k], p[k]) for k in a)


@pytest.mark.parametrize(("n", "batch", "sizes"), [
    (36, 16, [16, 16, 4]),  # a remainder of 4 keeps its own batch
    (35, 16, [16, 19]),  # of 3: it joins the batch before it
    (33, 32, [33]),  # of 1: joins too (it used to be left out)
    (34, 8, [8, 8, 8, 10]),
    (32, 32, [32]), (10, 32, [10]),  # one batch: trained on whole
    (3, 32, [3]), (1, 32, []),  # a split of one example: not trained on
])
def test_a_tiny_last_batch_joins_the_one_before(n, batch, sizes):
    from fedbn_med.training.objective import MIN_LAST_BATCH, BinaryClassification
    from fedbn_med.training.trainer import SiteData

    assert MIN_LAST_BATCH == 4
    x, y = torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n) % 2
    data = SiteData(train=(x, y), val=(x[:0], y[:0]), test=(x[:0], y[:0]))
    got = list(BinaryClassification().batches(data, batch, 2, lambda *_: 0))
    assert [len(b[0]) for b in got] == sizes * 2  # two epochs alike
    for epoch in (got[:len(sizes)], got[len(sizes):]):  # every example once an epoch
        seen = torch.cat([b[0] for b in epoch]).flatten() if epoch else torch.empty(0)
        assert sorted(seen.tolist()) == (list(range(n)) if sizes else [])


@pytest.mark.parametrize(("n", "batch", "sizes"), [(12, 4, [4, 4, 4]), (10, 4, [4, 6]),
                                                   (9, 4, [4, 5]), (3, 4, [3])])
def test_image_batches_follow_the_same_rule_in_the_order_a_shuffled_loader_draws(
        n, batch, sizes):
    from monai.data import DataLoader
    from torch.utils.data import RandomSampler

    from fedbn_med.tasks.imaging.trainer import _Batches

    items = list(range(n))
    plain = DataLoader(items, batch_size=batch, shuffle=True,
                       generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    ours = DataLoader(items, batch_sampler=_Batches(RandomSampler(items, generator=gen), batch),
                      generator=gen)
    for _ in range(2):  # two passes: the generator moves on alike
        drawn = [b.tolist() for b in ours]
        assert [len(b) for b in drawn] == sizes
        assert sum(drawn, []) == sum((b.tolist() for b in plain), [])
