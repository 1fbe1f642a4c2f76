"""FC's engine options change cost, never results: receiver chunking (memory budget,
with the reused workspace and in-place attack delivery) and the distance method."""

from __future__ import annotations

import pytest
import torch

import attacks
from defenses import build
from defenses.clustering_algorithms import FederatedClusteringParams
from robust_pfl import ClientData, Federation, mlp


HIDDEN = (256,)  # d = 6147: one receiver row (10 senders, float64, x2) is ~0.94 MB


def _federation(dtype: torch.dtype) -> Federation:
    g = torch.Generator().manual_seed(11)
    clients, samples = 10, 6
    data = ClientData(
        torch.rand(clients, samples, 20, generator=g, dtype=dtype),
        torch.randint(0, 3, (clients, samples), generator=g),
    )
    ids = torch.arange(clients) % 2
    byzantine = torch.zeros(clients, dtype=torch.bool)
    byzantine[[3, 8]] = True
    return Federation(
        mlp(20, HIDDEN, 3), data, ids, byzantine, seed=5, batch_size=4,
        attack=attacks.build("large_gradient", {"mean": 50.0, "std": 5.0}),
    )


def _train(options: dict, dtype: torch.dtype = torch.float64, rounds: int = 4) -> tuple[torch.Tensor, list[int]]:
    """Honest models after ``rounds`` FC rounds, and the receiver-chunk sizes used."""
    fed = _federation(dtype)
    chunk_sizes: list[int] = []
    original = fed.cross_gradients

    def spy(params, batch, out=None):
        chunk_sizes.append(params.shape[0])
        return original(params, batch, out=out)

    fed.cross_gradients = spy
    fc = build("fc", fed, {"lr": 0.05, "radius": {"policy": "quantile", "q": 0.4}, **options})
    for t in range(rounds):
        fc.step(t)
    return fc.client_models()[fed.honest], chunk_sizes


def test_memory_budget_does_not_change_results():
    """One receiver per chunk (a 1 MB budget here) and all receivers in one chunk give
    the same honest models: chunks are independent problems, the workspace is fully
    overwritten, and the attack's in-place rows never leak into the next chunk."""
    one_by_one, small_chunks = _train({"memory_budget_mb": 1})
    together, large_chunks = _train({"memory_budget_mb": 4096})
    assert set(small_chunks) == {1} and set(large_chunks) == {8}  # 8 honest receivers
    torch.testing.assert_close(one_by_one, together, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["gram", "pairwise"])
def test_inner_product_and_direct_methods_train_the_same_models(method):
    """The inner-product ("gram", "pairwise") and direct evaluations of eq. 24 give the
    same FC trajectory (to rounding) under attack."""
    direct, _ = _train({"method": "direct"})
    other, _ = _train({"method": method})
    torch.testing.assert_close(direct, other, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("points", "dim", "expected"),
    [(10, 1024, "direct"), (500, 10, "direct"), (64, 1025, "pairwise"), (96, 159010, "pairwise"), (97, 1025, "gram")],
)
def test_auto_method_follows_the_documented_rule(points, dim, expected):
    """``method = "auto"``: exact differences while d <= 1024; above, the Gram matrix
    ("pairwise") up to 96 points per clustering and lazily kept products ("gram")
    beyond, as docs/config.md, docs/design.md and the field's description state."""
    params = FederatedClusteringParams()
    assert params.distance_method(torch.empty(3, points, dim, device="meta")) == expected


def test_attacked_rows_are_fresh_each_round():
    """The large-gradient attack draws new noise per delivery: two rounds' Byzantine
    rows differ, so a workspace reused in place cannot replay stale attack rows."""
    fed = _federation(torch.float64)
    messages = torch.zeros(2, fed.clients, 4, dtype=torch.float64)
    first = fed.deliver(messages.clone(), 0, "cross_gradient", inplace=True)
    second = fed.deliver(messages.clone(), 1, "cross_gradient", inplace=True)
    assert not torch.equal(first[:, fed.byzantine], second[:, fed.byzantine])
    assert torch.equal(first[:, fed.honest], messages[:, fed.honest])


def test_skipping_unread_byzantine_gradients_does_not_change_results(call_path_attack):
    """With an attack that overwrites the Byzantine rows unread, FC computes only the
    honest senders' gradients; the trained models are bit-identical to computing all
    of them (the rows are overwritten either way)."""
    def train(wrap: bool) -> tuple[torch.Tensor, list[int]]:
        fed = _federation(torch.float64)
        if wrap:
            fed.attack = call_path_attack(fed.attack, reads_messages=True)
        senders: list[int] = []
        original = fed.cross_gradients

        def spy(params, batch, out=None):
            senders.append(batch.inputs.shape[0])
            return original(params, batch, out=out)

        fed.cross_gradients = spy
        fc = build("fc", fed, {"lr": 0.05, "radius": {"policy": "quantile", "q": 0.4}})
        for t in range(3):
            fc.step(t)
        return fc.client_models()[fed.honest], senders

    skipped, skipped_senders = train(wrap=False)
    computed, computed_senders = train(wrap=True)
    assert set(skipped_senders) == {8} and set(computed_senders) == {10}
    assert torch.equal(skipped, computed)


def test_honest_first_is_a_stable_partition():
    fed = _federation(torch.float64)  # Byzantine clients 3 and 8
    order = fed.honest_first(torch.tensor([8, 0, 3, 5, 1]))
    assert order.tolist() == [0, 5, 1, 8, 3]
