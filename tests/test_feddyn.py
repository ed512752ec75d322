"""FedDyn: a strategy added as one module and one registry entry, with a stateful site hook."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fedbn_med.fl.feddyn import STATE_PREFIX, DynamicHook, FedDyn
from fedbn_med.fl.hooks import DPHook, ProximalHook
from fedbn_med.fl.privacy import UpdatePrivacy
from fedbn_med.fl.registry import STRATEGIES, get_strategy
from fedbn_med.fl.strategies import FedProx, weighted_average
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.training.inprocess import run_in_process
from fedbn_med.training.trainer import SiteTrainer

from .test_driver import _site_data, _trainers

ROOT = Path(__file__).resolve().parent.parent


def _trainer(strategy=None, **options) -> SiteTrainer:
    torch.manual_seed(0)
    return SiteTrainer("A", AbideMLP(12), _site_data(0.0, 1.0, 0), strategy or FedDyn(),
                       batch_size=16, seed=0, device="cpu", **options)


def test_the_strategy_lives_in_its_own_module_and_the_registry_only():
    """No engine, server, trainer or command line names FedDyn: adding it touched two files."""
    named = sorted(str(p.relative_to(ROOT)) for folder in ("fedbn_med", "pipelines")
                   for p in (ROOT / folder).rglob("*.py")
                   if re.search(r"feddyn|FedDyn|DynamicHook", p.read_text()))
    assert named == ["fedbn_med/fl/feddyn.py", "fedbn_med/fl/registry.py"]
    assert STRATEGIES["feddyn"] is FedDyn and get_strategy("FedDyn", mu=0.1).mu == 0.1


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_alpha_must_be_a_positive_number(alpha):
    with pytest.raises(ValueError, match="alpha .* must be a positive number"):
        FedDyn(mu=alpha)


def test_hooks_run_proximal_then_dynamic_then_dp():
    """The correction is applied before DP clips and noises what is released."""
    trainer = _trainer(privacy=UpdatePrivacy(clip=1.0, noise=0.5, seeded=True))
    kinds = [type(h) for h in trainer.hooks]
    assert kinds == [ProximalHook, DynamicHook, DPHook]
    dyn = trainer.hooks[1]
    assert isinstance(dyn, DynamicHook)
    params = {name for name, _ in trainer.model.named_parameters()}
    assert set(dyn.grad) == params & trainer.exchanged and dyn.grad  # no buffer


def test_first_round_sends_twice_the_step_and_records_the_gradient_estimate():
    trainer = _trainer()
    start = trainer.shared_weights()
    sent, _, _ = trainer.fit(start, {"round": 1})
    trained = trainer.shared_weights()
    dyn = next(h for h in trainer.hooks if isinstance(h, DynamicHook))
    moved = 0
    for key, g in dyn.grad.items():
        step = trained[key] - start[key]
        moved += int(float(step.abs().max()) > 0)  # a bias before BN has no gradient
        torch.testing.assert_close(g, -0.01 * step)
        # w_i - g_i / alpha = w_i + (w_i - w_global)
        torch.testing.assert_close(sent[key], trained[key] + step)
    assert moved >= len(dyn.grad) // 2
    for key in set(sent) - set(dyn.grad):  # buffers go as trained
        assert torch.equal(sent[key], trained[key])


def test_the_linear_term_pulls_against_the_gradient_estimate():
    trainer = _trainer()
    trainer.fit(trainer.shared_weights(), {"round": 1})
    dyn = next(h for h in trainer.hooks if isinstance(h, DynamicHook))
    dyn.begin(trainer, 2, {})
    trainer.model.zero_grad()
    term = dyn.penalty(trainer.model)
    assert term is not None
    term.backward()
    for name, param in trainer.model.named_parameters():
        if name in dyn.grad:
            expected = -dyn.grad[name]
            got = torch.zeros_like(expected) if param.grad is None else param.grad
            torch.testing.assert_close(got, expected)


def test_plain_average_of_what_sites_send_is_the_papers_server_step():
    """With every site in every round, averaging ``w_i - g_i/alpha`` equals FedDyn's server
    (``h`` updated from the sites' steps, ``w = mean(w_i) - h/alpha``), round after round."""
    alpha, sites, keys = 0.05, ("A", "B", "C"), {"w": (3,), "b": (1,)}
    gen = torch.Generator().manual_seed(7)
    template = {k: torch.zeros(s) for k, s in keys.items()}
    hooks = {s: DynamicHook(template, keys, alpha) for s in sites}
    ours = {k: torch.zeros(s) for k, s in keys.items()}
    paper, h = dict(ours), {k: torch.zeros(s) for k, s in keys.items()}
    for rnd in range(1, 6):
        trained = {s: {k: paper[k] + torch.randn(sh, generator=gen) for k, sh in keys.items()}
                   for s in sites}
        sent = []
        for s in sites:
            hooks[s]._start = {k: ours[k].clone() for k in keys}
            sent.append((hooks[s].end(None, rnd, dict(trained[s]), {}), 1))  # type: ignore[arg-type]
        ours = weighted_average(sent)
        for k in keys:
            mean = torch.stack([trained[s][k] for s in sites]).mean(0)
            h[k] = h[k] - alpha * (mean - paper[k])
            paper[k] = mean - h[k] / alpha
            torch.testing.assert_close(ours[k], paper[k], rtol=1e-5, atol=1e-5)


def test_an_in_process_federation_trains_and_differs_from_fedprox():
    dyn = run_in_process(_trainers(FedDyn()), FedDyn(), rounds=3)
    prox = run_in_process(_trainers(FedProx(mu=0.01)), FedProx(mu=0.01), rounds=3)
    losses = [float(row["train_loss"]) for row in dyn.rows]
    assert dyn.rounds == 3 and len(losses) == 9
    assert all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(dyn.global_weights[k], prox.global_weights[k])
               for k in dyn.global_weights)


def test_gradient_estimate_survives_a_restart_and_bad_state_is_refused(tmp_path):
    from fedbn_med.federation.client_app import SiteRuntime

    def runtime() -> SiteRuntime:
        return SiteRuntime(trainer=_trainer(), state_path=tmp_path / "A.safetensors")

    before = runtime()
    before.trainer.fit(before.trainer.shared_weights(), {"round": 1})
    before.save(1)
    after = runtime()
    assert after.restore() == 1
    old = next(h for h in before.trainer.hooks if isinstance(h, DynamicHook))
    new = next(h for h in after.trainer.hooks if isinstance(h, DynamicHook))
    assert old.grad.keys() == new.grad.keys()
    for key, g in old.grad.items():
        assert torch.equal(new.grad[key], g)
    assert any(bool(g.abs().sum() > 0) for g in new.grad.values())

    key = next(iter(new.grad))
    with pytest.raises(ValueError, match="holds keys"):
        new.load({STATE_PREFIX + "nope": torch.zeros(1)}, {})
    with pytest.raises(ValueError, match=f"'{re.escape(key)}' has shape"):
        new.load({**{STATE_PREFIX + k: v for k, v in new.grad.items()},
                  STATE_PREFIX + key: torch.zeros(99)}, {})
    with pytest.raises(ValueError, match="NaN or infinity"):
        new.load({**{STATE_PREFIX + k: v for k, v in new.grad.items()},
                  STATE_PREFIX + key: torch.full_like(new.grad[key], float("nan"))}, {})
