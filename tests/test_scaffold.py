"""SCAFFOLD on the shared weights: control variates, their update, their saved state."""

from __future__ import annotations

import pytest
import torch

from fedbn_med.fl.partition import partition_model
from fedbn_med.fl.rounds import Reply, close_round, update_control
from fedbn_med.fl.scaffold import SiteControl, join_controls, split_controls
from fedbn_med.fl.strategies import FedAvg, FedBN, FedBNScaffold, Scaffold
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.training.inprocess import run_in_process
from fedbn_med.training.trainer import SiteTrainer

from .test_driver import _site_data


def _trainers(strategy, d: int = 12, lr: float = 0.05) -> dict[str, SiteTrainer]:
    specs = {"A": (0.0, 1.0), "B": (3.0, 2.0), "C": (-2.0, 0.5)}
    out = {}
    for i, (site, (shift, scale)) in enumerate(specs.items()):
        torch.manual_seed(0)
        out[site] = SiteTrainer(site, AbideMLP(d), _site_data(shift, scale, i, d=d), strategy,
                                batch_size=16, lr=lr, seed=0, device="cpu")
    return out


def _same(a, b) -> bool:
    return a.rows == b.rows and all(torch.equal(a.global_weights[k], b.global_weights[k])
                                    for k in a.global_weights)


def test_controls_cover_exchanged_parameters_only():
    model = AbideMLP(12)
    part = partition_model(model)
    params = frozenset(n for n, _ in model.named_parameters())
    fedbn = FedBNScaffold().controlled_keys(part, params)
    assert fedbn == part.shared & params and not fedbn & part.private
    full = Scaffold().controlled_keys(part, params)
    assert full == params  # BN scale and shift too, as in the paper; no running statistics
    assert not any("running" in k or "num_batches" in k for k in full)
    assert FedBN().controlled_keys(part, params) == frozenset()


@pytest.mark.parametrize(("scaffold", "plain"), [(Scaffold(), FedAvg()),
                                                 (FedBNScaffold(), FedBN())])
def test_scaffold_with_controls_held_at_zero_equals_its_base(monkeypatch, scaffold, plain):
    reference = run_in_process(_trainers(plain), plain, rounds=2)
    corrected = run_in_process(_trainers(scaffold), scaffold, rounds=2)
    assert not _same(corrected, reference)  # the variates do change training from round 2
    # round 1 starts from zero variates: exactly the base strategy's round
    first = [r for r in corrected.rows if r["round"] == 1]
    assert first == [r for r in reference.rows if r["round"] == 1]

    def held_at_zero(self, start, sent, server, steps, lr):
        self.delta = {k: torch.zeros_like(v) for k, v in self.state.items()}
        return self.delta

    monkeypatch.setattr(SiteControl, "update", held_at_zero)
    assert _same(run_in_process(_trainers(scaffold), scaffold, rounds=2), reference)


def test_site_variate_follows_option_two():
    trainer = _trainers(Scaffold(), lr=0.05)["B"]
    start = trainer.shared_weights()
    server = {k: torch.full_like(v, 0.01) for k, v in trainer.control.state.items()}
    sent, _, _ = trainer.fit(start, {"round": 1}, server)
    steps = 3  # 36 training examples in batches of 16
    for key, c_i in trainer.control.state.items():
        want = (start[key].double() - sent[key].double()) / (steps * 0.05) - 0.01
        torch.testing.assert_close(c_i.double(), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(trainer.control_delta[key], c_i)  # c_i was 0


def test_server_variate_moves_by_the_weighted_mean_of_the_changes():
    c = {"w": torch.tensor([1.0, 2.0])}
    changes = [({"w": torch.tensor([1.0, 0.0])}, 1), ({"w": torch.tensor([0.0, 4.0])}, 3)]
    new = update_control(c, changes, n_sites=4)  # 2 of 4 sites took part
    torch.testing.assert_close(new["w"], torch.tensor([1.0 + 0.5 * 0.25, 2.0 + 0.5 * 3.0]))
    with pytest.raises(ValueError, match="n_sites must count every site"):
        update_control(c, changes, n_sites=1)


def test_close_round_refuses_an_unsound_control_change():
    weights = {"w": torch.zeros(2)}
    control = {"w": torch.zeros(2)}
    good = Reply("A", {"w": torch.ones(2)}, 1, controls={"w": torch.ones(2)})
    bad = Reply("B", {"w": torch.ones(2)}, 1, controls={"w": torch.tensor([1.0, float("nan")])})
    outcome = close_round(Scaffold(), weights, [good, bad], control=control, n_sites=2)
    assert outcome.accepted == ["A"]
    assert "control variate change is unsound" in outcome.refused["B"]
    torch.testing.assert_close(outcome.control["w"], torch.full((2,), 0.5))


def test_variate_and_dp_spent_survive_a_restart(tmp_path):
    from fedbn_med.federation.client_app import SiteRuntime
    from fedbn_med.fl.privacy import UpdatePrivacy

    def runtime() -> SiteRuntime:
        torch.manual_seed(0)
        trainer = SiteTrainer("A", AbideMLP(12), _site_data(0.0, 1.0, 0), FedBNScaffold(),
                              batch_size=16, seed=0, device="cpu",
                              privacy=UpdatePrivacy(clip=1.0, noise=1.0))
        return SiteRuntime(trainer=trainer, state_path=tmp_path / "A.safetensors")

    before = runtime()
    sent, _, metrics = before.trainer.fit(before.trainer.shared_weights(), {"round": 1})
    before.save(1)
    after = runtime()
    assert after.restore() == 1
    for key, value in before.trainer.control.state.items():
        assert torch.equal(after.trainer.control.state[key], value)
    assert after.trainer.dp_releases == 1
    _, _, again = after.trainer.fit(sent, {"round": 2})
    assert again["dp_epsilon"] > metrics["dp_epsilon"]  # counted from 1, not from 0


def test_join_and_split_controls_round_trip():
    weights = {"a": torch.ones(1)}
    controls = {"a": torch.zeros(1)}
    got_w, got_c = split_controls(join_controls(weights, controls))
    assert got_w == weights and got_c == controls
