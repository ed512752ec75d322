"""A site's dropout draws from its own generator; sites that train at once give the same numbers."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

from fedbn_med.fl.strategies import FedBN, FedProx
from fedbn_med.numerics.cores import CORES_ENV_VAR
from fedbn_med.tasks.abide.model import AbideLinear, AbideMLP
from fedbn_med.training.inprocess import run_in_process
from fedbn_med.training.rng import dropout_only, seed_round
from fedbn_med.training.trainer import SiteData, SiteTrainer


def test_a_sites_generator_draws_the_masks_of_the_process_generator():
    model = AbideMLP(40, dropout=0.5).train()
    twin = copy.deepcopy(model)
    x = torch.randn(16, 40)
    torch.manual_seed(7)
    expected = model(x)
    expected.square().sum().backward()
    seed_round(twin, 7)
    torch.manual_seed(123)  # the process's generator moves on: the site's does not use it
    torch.rand(5)
    got = twin(x)
    got.square().sum().backward()
    assert torch.equal(got, expected)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a.grad, b.grad), name
    twin.eval()  # no draw when scoring
    assert torch.equal(twin(x), model.eval()(x))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("shape", [(1, 1), (32, 6105), (7, 3, 5)])
def test_the_linear_models_input_dropout_draws_what_bernoulli_draws(p, shape):
    # the mask is drawn as rand(float64) < 1 - p, not with bernoulli_: the same mask, the
    # generator left in the same state, so every later draw is the same too
    layer = nn.Dropout(p).train()
    x = torch.randn(shape)
    seed_round(nn.Sequential(nn.Linear(1, 1), layer), 11)
    got, after = layer(x), torch.rand(3, generator=layer.forward.generator)
    gen = torch.Generator().manual_seed(11)
    mask = torch.empty_like(x).bernoulli_(1 - p, generator=gen)
    assert torch.equal(got, x * mask.div_(1 - p))
    assert torch.equal(after, torch.rand(3, generator=gen))
    torch.manual_seed(11)  # and the process generator's own dropout, as before
    assert torch.equal(got, nn.functional.dropout(x, p, training=True))


@pytest.mark.parametrize(("model", "expected"), [
    (AbideMLP(10, dropout=0.5), True), (AbideLinear(10, dropout=0.2), True),
    (nn.Sequential(nn.Linear(4, 4), nn.Dropout2d(0.5)), False),
    (nn.Sequential(nn.Linear(4, 4), nn.RReLU()), False),
])
def test_only_a_model_whose_sole_randomness_is_dropout_gets_its_own_generator(model, expected):
    assert dropout_only(model) is expected
    seed_round(model, 3)
    assert any("forward" in vars(m) for m in model.modules()) is expected


def _site_data(seed: int, n: int = 70, d: int = 12) -> SiteData:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, d, generator=gen) * (1 + seed) + seed
    x[:, 0] += 1.5 * y
    return SiteData(train=(x[:40], y[:40]), val=(x[40:55], y[40:55]), test=(x[55:], y[55:]))


def _run(strategy, cores: int, monkeypatch) -> tuple[list, dict]:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
    monkeypatch.delenv(CORES_ENV_VAR, raising=False)  # the suite caps it (tests/one_thread)
    trainers = {}
    for i, site in enumerate("ABC"):
        torch.manual_seed(0)
        trainers[site] = SiteTrainer(site, AbideMLP(12, dropout=0.5), _site_data(i), strategy,
                                     batch_size=8, seed=1, device="cpu", threads=1,
                                     bn_init="data")
    history = run_in_process(trainers, strategy, rounds=4)
    return history.rows, history.global_weights


@pytest.mark.parametrize("strategy", [FedBN(), FedProx(mu=0.01)])
def test_sites_at_once_give_the_numbers_of_sites_one_after_the_other(strategy, monkeypatch):
    rows, weights = _run(strategy, 1, monkeypatch)
    rows_at_once, weights_at_once = _run(strategy, 2, monkeypatch)
    assert rows_at_once == rows
    assert weights_at_once.keys() == weights.keys()
    for key, tensor in weights.items():
        assert torch.equal(weights_at_once[key], tensor), key
