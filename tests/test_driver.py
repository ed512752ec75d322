from __future__ import annotations

import pytest
import torch
from monai.fl.client import ClientAlgo
from monai.fl.utils.constants import ExtraItems
from monai.fl.utils.exchange_object import ExchangeObject

from fedbn_med.fl.registry import get_strategy
from fedbn_med.fl.strategies import Centralized, FedAvg, FedBN, SingleSet
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.training.clientalgo import FedBNClientAlgo
from fedbn_med.training.inprocess import run_in_process
from fedbn_med.training.trainer import ShapeMismatchError, SiteData, SiteTrainer


def _site_data(shift: float, scale: float, seed: int, n: int = 60, d: int = 12) -> SiteData:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, d, generator=gen)
    x[:, 0] += 1.5 * y  # a label signal shared by every site
    x = x * scale + shift  # a site-specific feature shift
    cut1, cut2 = int(0.6 * n), int(0.8 * n)
    return SiteData(train=(x[:cut1], y[:cut1]), val=(x[cut1:cut2], y[cut1:cut2]),
                    test=(x[cut2:], y[cut2:]))


def _trainers(strategy, d: int = 12) -> dict[str, SiteTrainer]:
    specs = {"A": (0.0, 1.0), "B": (3.0, 2.0), "C": (-2.0, 0.5)}
    out = {}
    for i, (site, (shift, scale)) in enumerate(specs.items()):
        torch.manual_seed(0)  # same initial weights everywhere
        out[site] = SiteTrainer(site, AbideMLP(d), _site_data(shift, scale, i, d=d), strategy,
                                batch_size=16, seed=0, device="cpu")
    return out


def test_fedbn_round_keeps_private_local_and_shared_identical():
    trainers = _trainers(FedBN())
    before = {s: t.private_state() for s, t in trainers.items()}
    history = run_in_process(trainers, FedBN(), rounds=2)
    shared = {s: t.shared_weights() for s, t in trainers.items()}
    for key in trainers["A"].partition.shared:
        torch.testing.assert_close(shared["A"][key], shared["B"][key], rtol=0, atol=0)
        torch.testing.assert_close(shared["A"][key], history.global_weights[key])
    private = {s: t.private_state() for s, t in trainers.items()}
    for key in trainers["A"].partition.private:
        if key.endswith("num_batches_tracked"):
            continue
        assert not torch.equal(private["A"][key], private["B"][key]), key
        assert not torch.equal(private["A"][key], before["A"][key]), key
    assert set(history.global_weights) == trainers["A"].partition.shared


def test_aggregation_leaves_private_tensors_unchanged():
    trainers = _trainers(FedBN())
    config = {"round": 1}
    updates = [t.fit({}, config) for t in trainers.values()]
    private_after_training = {s: t.private_state() for s, t in trainers.items()}
    from fedbn_med.fl.strategies import weighted_average
    global_w = weighted_average([(w, n) for w, n, _ in updates])
    for site, trainer in trainers.items():
        trainer.score(global_w)
        for key, value in trainer.private_state().items():
            assert torch.equal(value, private_after_training[site][key])


def test_fedavg_makes_bn_statistics_identical():
    trainers = _trainers(FedAvg())
    run_in_process(trainers, FedAvg(), rounds=1)
    a, b = trainers["A"].model.state_dict(), trainers["C"].model.state_dict()
    for key in trainers["A"].partition.private:
        torch.testing.assert_close(a[key], b[key])


def test_singleset_exchanges_nothing():
    trainers = _trainers(SingleSet())
    history = run_in_process(trainers, SingleSet(), rounds=2)
    assert history.global_weights == {}
    wa = trainers["A"].model.state_dict()["net.0.weight"]
    wb = trainers["B"].model.state_dict()["net.0.weight"]
    assert not torch.equal(wa, wb)


def test_centralized_pools_and_every_site_evaluates():
    strategy = Centralized()
    trainers = _trainers(strategy)
    parts = [t.data.train for t in trainers.values()]
    pooled_data = SiteData(train=(torch.cat([p[0] for p in parts]),
                                  torch.cat([p[1] for p in parts])),
                           val=trainers["A"].data.val, test=trainers["A"].data.test)
    torch.manual_seed(0)
    pooled = SiteTrainer("pooled", AbideMLP(12), pooled_data, strategy, batch_size=16,
                         device="cpu")
    history = run_in_process(trainers, strategy, rounds=2, pooled=pooled)
    assert set(history.final()) == {"A", "B", "C"}
    assert all("test_accuracy" in m for m in history.final().values())


def test_run_is_deterministic_and_learns():
    h1 = run_in_process(_trainers(FedBN()), FedBN(), rounds=5)
    h2 = run_in_process(_trainers(FedBN()), FedBN(), rounds=5)
    assert h1.rows == h2.rows
    losses = [r["train_loss"] for r in h1.rows if r["site"] == "B"]
    assert losses[-1] < losses[0]


def test_client_algo_contract():
    # MONAI's contract: train -> None, get_weights -> ExchangeObject of weights,
    # evaluate -> ExchangeObject of metrics; FedBN's filter keeps BN out of get_weights.
    trainer = _trainers(FedBN())["A"]
    algo = FedBNClientAlgo(trainer)
    assert isinstance(algo, ClientAlgo)
    algo.initialize({ExtraItems.CLIENT_NAME: "A"})
    incoming = ExchangeObject(weights=algo.get_weights().weights)
    assert algo.train(incoming, {"round": 1}) is None
    out = algo.get_weights()
    assert out.is_valid_weights() and set(out.weights) == trainer.partition.shared
    assert not set(out.weights) & trainer.partition.private
    assert out.statistics["num_examples"] == trainer.data.num_train
    result = algo.evaluate(ExchangeObject(weights=out.weights))
    assert isinstance(result, ExchangeObject) and "test_auc" in result.metrics
    with pytest.raises(TypeError, match="take an ExchangeObject, got dict"):
        algo.train(out.weights)
    private_key = sorted(trainer.partition.private)[0]
    with pytest.raises(ValueError, match="does not exchange"):
        algo.train(ExchangeObject(weights={private_key: torch.zeros(16)}))
    with pytest.raises(ValueError, match="serves site 'A', but the FL system calls it 'B'"):
        algo.initialize({ExtraItems.CLIENT_NAME: "B"})
    algo.abort()
    with pytest.raises(RuntimeError, match="was aborted"):
        algo.train(incoming)
    algo.finalize()


def test_driver_leaves_out_a_bad_update(caplog):
    # The round's checks run in-process too: a site whose update holds NaN is left out.
    trainers = _trainers(FedAvg())
    bad = trainers["C"]
    real_fit = bad.fit

    def poisoned_fit(weights, config):
        out, n, fit = real_fit(weights, config)
        key = sorted(out)[0]
        out[key] = torch.full_like(out[key], float("nan"))
        return out, n, fit

    bad.fit = poisoned_fit
    with caplog.at_level("WARNING"):
        history = run_in_process(trainers, FedAvg(), rounds=1)
    assert "update of site C left out" in caplog.text and "NaN" in caplog.text
    assert all(torch.isfinite(w).all() for w in history.global_weights.values())


def test_refuses_private_keys_and_bad_shapes():
    trainer = _trainers(FedBN())["A"]
    private_key = sorted(trainer.partition.private)[0]
    with pytest.raises(ValueError, match="does not exchange"):
        trainer.fit({private_key: torch.zeros(16)}, {"round": 1})
    with pytest.raises(ShapeMismatchError, match=r"shape \(16, 99\).*shape \(16, 12\)"):
        trainer.fit({"net.0.weight": torch.zeros(16, 99)}, {"round": 1})
    bad = _site_data(0, 1, 0, d=20)
    with pytest.raises(ShapeMismatchError, match=r"shape \(36, 20\).*expects 12 features"):
        SiteTrainer("X", AbideMLP(12), bad, FedBN(), device="cpu")


def test_bad_arguments():
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        run_in_process(_trainers(FedBN()), FedBN(), rounds=0)
    with pytest.raises(ValueError, match="lr must be a positive"):
        SiteTrainer("A", AbideMLP(12), _site_data(0, 1, 0), get_strategy("fedbn"), lr=-1)
    data = _site_data(0, 1, 0)
    data.train[0][0, 0] = float("nan")
    with pytest.raises(ValueError, match="contains NaN"):
        SiteTrainer("A", AbideMLP(12), data, FedBN(), device="cpu")


def test_the_data_check_finds_an_infinity_and_passes_finite_values_whose_sum_overflows():
    data = _site_data(0, 1, 0)
    data.val[0][1, 2] = float("-inf")
    with pytest.raises(ValueError, match="'A' val data contains NaN or Inf"):
        SiteTrainer("A", AbideMLP(12), data, FedBN(), device="cpu")
    large = _site_data(0, 1, 0)
    large.train[0][:, 0] = 3e38  # each finite; their sum is not
    SiteTrainer("A", AbideMLP(12), large, FedBN(), device="cpu")


def test_history_selects_the_round_of_lowest_mean_validation_loss():
    from fedbn_med.evaluation.comparison import best_round

    history = run_in_process(_trainers(FedBN()), FedBN(), rounds=4)
    chosen = history.best_round()
    assert chosen == best_round(history.rows)
    by_round = {}
    for row in history.rows:
        by_round.setdefault(row["round"], []).append(row["val_loss"])
    assert chosen == min(by_round, key=lambda r: (sum(by_round[r]) / 3, r))
    selected = history.selected()
    for row in history.rows:
        if row["round"] == chosen:
            assert selected[row["site"]]["test_accuracy"] == row["test_accuracy"]
    assert set(history.final()) == set(selected) == {"A", "B", "C"}  # final(): the last round
