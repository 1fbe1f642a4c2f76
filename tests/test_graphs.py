"""Communication graphs and per-edge delivery (robust_pfl.engine.graphs, defenses.graph_rounds)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attacks
from attacks._stats import fill_normal
from defenses.graph_rounds import received_from_neighbours, receiver_chunks
from robust_pfl import ClientData, Federation
from robust_pfl.engine.graphs import Graph, GraphSpec, federation_graph, make_graph, place_byzantine
from robust_pfl.engine.objectives import linear_regression
from robust_pfl.engine.types import AttackBase, AttackContext

KINDS = ["complete", "erdos_renyi", "barabasi_albert", "random_geometric"]


def draw(kind: str, n: int, seed: int, **options) -> Graph:
    return make_graph(GraphSpec(kind=kind, **options), n, torch.Generator().manual_seed(seed))


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS), n=st.integers(2, 30), seed=st.integers(0, 2**20))
def test_every_kind_is_a_simple_connected_undirected_graph(kind, n, seed):
    graph = draw(kind, n, seed, p=0.5, radius=0.6)
    a = graph.adjacency
    assert torch.equal(a, a.T) and not bool(a.diagonal().any())
    assert graph.connected()


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS), n=st.integers(1, 25), seed=st.integers(0, 2**20))
def test_metropolis_weights_are_doubly_stochastic_and_uniform_row_stochastic(kind, n, seed):
    graph = draw(kind, n, seed, p=0.5, radius=0.6)
    ones = torch.ones(n, dtype=torch.float64)
    metropolis = graph.mixing_weights("metropolis")
    uniform = graph.mixing_weights("uniform")
    for w in (metropolis, uniform):
        assert bool((w >= 0).all())
        assert torch.allclose(w.sum(dim=1), ones)
        off_graph = ~(graph.adjacency | torch.eye(n, dtype=torch.bool))
        assert bool((w[off_graph] == 0).all())
    assert torch.allclose(metropolis.sum(dim=0), ones)
    assert torch.equal(metropolis, metropolis.T)


def test_uniform_weights_on_a_star_are_not_column_stochastic():
    """Star on 3 nodes (centre 0, degree 2; leaves degree 1): uniform rows are
    (1/3, 1/3, 1/3), (1/2, 1/2, 0), (1/2, 0, 1/2); column 0 sums to 4/3, so averaging
    with them does not keep the network mean (FedSPD's paper vs its proof)."""
    star = Graph(torch.tensor([[False, True, True], [True, False, False], [True, False, False]]))
    w = star.mixing_weights("uniform")
    assert torch.allclose(w.sum(dim=0), torch.tensor([4 / 3, 5 / 6, 5 / 6], dtype=torch.float64))
    m = star.mixing_weights("metropolis")  # edges 1/(1+2) = 1/3
    expected = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [1 / 3, 2 / 3, 0], [1 / 3, 0, 2 / 3]], dtype=torch.float64)
    assert torch.allclose(m, expected)


@pytest.mark.parametrize("n, m", [(10, 1), (30, 2), (12, 3)])
def test_barabasi_albert_edge_count(n, m):
    """A clique on m + 1 seed nodes, then m edges per further node."""
    graph = draw("barabasi_albert", n, 3, m=m)
    assert int(graph.adjacency.sum()) // 2 == m * (m + 1) // 2 + m * (n - m - 1)


def test_erdos_renyi_edge_frequency_matches_p():
    """60 nodes, p = 0.3: 1770 possible edges, mean 531, sd 19.3; the count of 20 draws
    (mean 10620, sd 86) lies within 5 sd."""
    total = sum(int(draw("erdos_renyi", 60, seed, p=0.3).adjacency.sum()) // 2 for seed in range(20))
    assert abs(total - 20 * 1770 * 0.3) < 5 * (20 * 1770 * 0.3 * 0.7) ** 0.5


def test_a_graph_that_is_never_connected_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"graph\.p"):
        draw("erdos_renyi", 50, 0, p=1e-6)
    with pytest.raises(ValueError, match=r"graph\.radius"):
        draw("random_geometric", 50, 0, radius=1e-6)


def test_bad_spec_names_the_field():
    with pytest.raises(ValueError, match="kind"):
        GraphSpec(kind="ring")
    with pytest.raises(ValueError, match="p"):
        GraphSpec(p=1.5)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(4, 25), seed=st.integers(0, 2**20), data=st.data())
def test_high_degree_placement_gives_byzantine_clients_the_top_degrees(n, seed, data):
    graph = draw("barabasi_albert", n, seed)
    count = data.draw(st.integers(1, n - 1))
    chosen = data.draw(st.permutations(range(n)))[:count]
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[list(chosen)] = True
    placed = place_byzantine(graph, byzantine, "high_degree")
    top = torch.sort(graph.degrees, descending=True).values[:count]
    assert torch.equal(torch.sort(placed.degrees[byzantine], descending=True).values, top)
    # the same graph, relabelled: the degree multiset and edge count are kept
    assert torch.equal(torch.sort(placed.degrees).values, torch.sort(graph.degrees).values)
    assert place_byzantine(graph, byzantine, "random") is graph


# -- the run's graph and per-edge delivery ------------------------------------------------


def federation(attack=None, seed: int = 0, byzantine=(5, 6)) -> Federation:
    n, d = 8, 3
    inputs = torch.randn(n, 4, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[list(byzantine)] = True
    return Federation(
        linear_regression(d),
        ClientData(inputs, torch.zeros(n, 4, dtype=torch.float64)),
        torch.arange(n) % 2,
        mask,
        seed=seed,
        attack=attack,
    )


@dataclass(frozen=True)
class PerReceiver(AttackBase):
    """Sends receiver r the row filled with 100 r + (rank of the Byzantine sender)."""

    graph_placement: str = "random"
    seen: list | None = None

    def __call__(self, messages, context: AttackContext):
        if self.seen is not None:
            self.seen.append(context)
        count = int(context.byzantine.sum())
        rows = 100.0 * context.receivers.to(messages.dtype).view(-1, 1, 1) + torch.arange(count).view(1, -1, 1)
        return rows.expand(*messages.shape[:-2], count, messages.shape[-1]).clone()


def test_the_run_graph_is_seeded_and_dynamic_graphs_change_per_round():
    spec = GraphSpec(kind="erdos_renyi", p=0.5)
    fed = federation()
    assert torch.equal(federation_graph(fed, spec).adjacency, federation_graph(federation(), spec).adjacency)
    assert not torch.equal(federation_graph(fed, spec).adjacency, federation_graph(federation(seed=1), spec).adjacency)
    dynamic = spec.model_copy(update={"dynamic": True})
    rounds = [federation_graph(fed, dynamic, t).adjacency for t in range(4)]
    assert any(not torch.equal(rounds[0], other) for other in rounds[1:])
    assert torch.equal(rounds[2], federation_graph(fed, dynamic, 2).adjacency)


def test_the_attack_decides_the_placement():
    spec = GraphSpec(kind="barabasi_albert", m=1)
    fed = federation(PerReceiver(graph_placement="high_degree"))
    graph = federation_graph(fed, spec)
    top = torch.sort(graph.degrees, descending=True).values[:2]
    assert torch.equal(torch.sort(graph.degrees[fed.byzantine], descending=True).values, top)


def test_every_receiver_gets_its_own_byzantine_messages_and_the_honest_broadcast():
    seen: list = []
    fed = federation(PerReceiver(seen=seen))
    broadcast = torch.randn(8, 3, dtype=torch.float64)
    receivers = torch.tensor([0, 3, 7])
    received = received_from_neighbours(fed, broadcast, 4, "model", receivers)
    honest = ~fed.byzantine
    assert torch.equal(received[:, honest], broadcast[honest].expand(3, -1, -1))
    for r, receiver in enumerate(receivers.tolist()):
        assert torch.equal(received[r, 5], torch.full((3,), 100.0 * receiver, dtype=torch.float64))
        assert torch.equal(received[r, 6], torch.full((3,), 100.0 * receiver + 1, dtype=torch.float64))
    assert torch.equal(seen[0].receivers, receivers) and seen[0].kind == "model"


def test_without_an_attack_messages_arrive_as_sent():
    fed = federation()
    broadcast = torch.randn(8, 3, dtype=torch.float64)
    received = received_from_neighbours(fed, broadcast, 0, "model", torch.arange(8))
    assert torch.equal(received, broadcast.expand(8, -1, -1))
    assert torch.equal(fed.deliver(broadcast, 0, "model", byzantine_only=True), broadcast[fed.byzantine])


NEEDED = torch.tensor([[True, False], [False, False], [True, True]])  # receivers 0, 3, 7; senders 5, 6


def test_needed_rows_are_exactly_the_rows_of_the_full_delivery_they_mark():
    """A per-receiver attack (rows not drawn apart) and no attack: asking for the
    needed pairs gives the full delivery's rows at those pairs, in row-major order."""
    broadcast = torch.randn(8, 3, dtype=torch.float64)
    receivers = torch.tensor([0, 3, 7])
    for attack in (PerReceiver(), None):
        full = received_from_neighbours(federation(attack), broadcast, 4, "model", receivers, byzantine_only=True)
        picked = received_from_neighbours(
            federation(attack), broadcast, 4, "model", receivers, byzantine_only=True, needed=NEEDED
        )
        assert torch.equal(picked, full[NEEDED])
    by_hand = received_from_neighbours(  # receiver 0 from sender 5, receiver 7 from 5 and 6
        federation(PerReceiver()), broadcast, 4, "model", receivers, byzantine_only=True, needed=NEEDED
    )
    assert torch.equal(by_hand, torch.tensor([[0.0] * 3, [700.0] * 3, [701.0] * 3], dtype=torch.float64))


@pytest.mark.parametrize("attack", [attacks.LargeGradient(mean=3.0, std=2.0), attacks.GaussianNoise(std=5.0)])
def test_attacks_that_draw_rows_apart_draw_only_the_needed_rows(attack):
    """Rows drawn apart (i.i.d.): only the P needed rows are drawn, as one ``[P, d]``
    block from the attack stream, so they equal that block drawn by hand."""
    broadcast = torch.randn(8, 3, dtype=torch.float64)
    fed = federation(attack, seed=3)
    picked = received_from_neighbours(fed, broadcast, 0, "model", torch.tensor([0, 3, 7]), byzantine_only=True,
                                      needed=NEEDED)
    by_hand = torch.empty(3, 3, dtype=torch.float64)
    mean = getattr(attack, "mean", 0.0)
    fill_normal(by_hand, federation(attack, seed=3)._attack_rng, mean, attack.std)
    assert torch.equal(picked, by_hand)


def test_needed_without_byzantine_only_or_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="byzantine_only"):
        federation(PerReceiver()).deliver(torch.zeros(8, 3), 0, "model", needed=NEEDED)
    received = torch.zeros(3, 8, 3)
    for wrong in (NEEDED[0], NEEDED[:2], torch.ones(3, 3, dtype=torch.bool)):
        with pytest.raises(ValueError, match=r"needed must be shaped \(3, 2\)"):
            federation(PerReceiver()).deliver(received, 0, "model", receivers=torch.tensor([0, 3, 7]),
                                              byzantine_only=True, needed=wrong)


def test_loss_reports_are_changed_only_by_attacks_that_forge_losses():
    losses = torch.rand(8, 2, dtype=torch.float64)
    plain = federation(PerReceiver())
    assert torch.equal(plain.deliver(losses, 0, "loss"), losses)

    @dataclass(frozen=True)
    class Forger(PerReceiver):
        forges_losses: bool = True

        def __call__(self, messages, context):
            return torch.zeros(int(context.byzantine.sum()), messages.shape[-1], dtype=messages.dtype)

    forged = federation(Forger()).deliver(losses, 0, "loss")
    assert bool((forged[5:7] == 0).all()) and torch.equal(forged[:5], losses[:5])


def test_receiver_chunks_cover_every_receiver_once_within_the_budget():
    chunks = list(receiver_chunks(10, 1000, budget_mb=0.1))  # 40 kB per receiver: 2 per chunk
    assert torch.equal(torch.cat(chunks), torch.arange(10))
    assert max(c.numel() for c in chunks) == 2
