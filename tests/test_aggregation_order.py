"""The aggregate must not depend on the order in which the sites' replies arrive.

Over Flower, replies arrive in a different order from round to round and run to run.
Floating-point sums depend on their order, and on small real sites a one-bit difference
in round 1 grows into different predictions by round 50 (measured on four real ABIDE dev
sites). So :func:`fedbn_med.fl.rounds.close_round` must give the same bits for every order.
"""

from __future__ import annotations

import itertools

import torch

from fedbn_med.fl.registry import get_strategy
from fedbn_med.fl.rounds import Reply, close_round


def _replies(n_sites: int, size: int, seed: int) -> tuple[dict[str, torch.Tensor], list[Reply]]:
    gen = torch.Generator().manual_seed(seed)
    start = {"net.0.weight": torch.randn(size, generator=gen)}
    replies = []
    for i in range(n_sites):
        step = 1e-2 * torch.randn(size, generator=gen)
        # Odd, unequal example counts, as real sites have: the weights n/total are inexact.
        weights = {"net.0.weight": start["net.0.weight"] + step}
        replies.append(Reply(site=f"SITE{i}", weights=weights, num_examples=17 + 6 * i))
    return start, replies


def test_every_arrival_order_gives_the_same_bits() -> None:
    strategy = get_strategy("fedavg")
    start, replies = _replies(n_sites=4, size=200_000, seed=3)
    first = close_round(strategy, start, replies).global_weights["net.0.weight"]
    for order in itertools.permutations(replies):
        got = close_round(strategy, start, list(order)).global_weights["net.0.weight"]
        assert torch.equal(got, first), [r.site for r in order]


def test_sums_in_another_order_do_differ() -> None:
    # Why the test above can fail: the same average summed in two orders differs in
    # some bits, so an engine that sums in arrival order is not reproducible.
    _, replies = _replies(n_sites=4, size=200_000, seed=3)
    total = sum(int(r.num_examples) for r in replies)

    def summed(order: list[Reply]) -> torch.Tensor:
        acc = torch.zeros(200_000, dtype=torch.float64)
        for r in order:
            acc += r.weights["net.0.weight"].to(torch.float64) * (int(r.num_examples) / total)
        return acc.to(torch.float32)

    base = summed(replies)
    assert any(not torch.equal(summed(list(o)), base)
               for o in itertools.permutations(replies))


def test_the_selected_round_and_its_scores_do_not_depend_on_the_order_of_site_rows() -> None:
    import math

    import numpy as np

    from fedbn_med.evaluation.comparison import best_round, scores_at

    losses = (0.1, 0.2, 0.3, 0.7)  # summed left to right, two orders differ in the last bit
    assert len({float(np.mean(p)) for p in itertools.permutations(losses)}) > 1
    sites = ("NYU", "UM", "USM", "UCLA")
    picks, means = set(), set()
    for order in itertools.permutations(range(4)):
        rows = [{"round": 1, "site": s, "val_loss": v, "test_auc": v}
                for s, v in zip(sites, losses)]
        # round 2 ties round 1 exactly; its rows arrive in this order
        rows += [{"round": 2, "site": sites[i], "val_loss": losses[i], "test_auc": losses[i]}
                 for i in order]
        picks.add(best_round(rows))
        means.add(scores_at(rows, 2, "auc")["mean"])
    assert picks == {1}  # the earliest of the tied rounds, in every order
    assert means == {math.fsum(losses) / 4}
