"""Neighbour poisoning (attacks.graph_attacks): Byzantine nodes at the highest-degree
positions of the communication graph send every receiver its own crafted point, just
inside the receiver's threshold ball around its own message."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import pytest
import torch

import attacks
import defenses
from attacks.graph_attacks import NeighbourPoison
from defenses.threshold_clustering import threshold_clustering
from robust_pfl import Federation
from robust_pfl.engine.graphs import GraphSpec, federation_graph, make_graph
from robust_pfl.engine.seeding import generator
from robust_pfl.engine.tasks import SyntheticLinearRegression
from robust_pfl.engine.types import AttackBase, AttackContext

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
SPARSE = {"kind": "erdos_renyi", "p": 0.3}
PDL = {"lr": 0.01, "alpha": 0.5}


@dataclasses.dataclass(frozen=True)
class RandomlyPlaced(NeighbourPoison):
    """The same messages from Byzantine nodes at random positions."""

    graph_placement: ClassVar[str] = "random"


def task(seed=0, byzantine_total=4):
    return SyntheticLinearRegression(
        clusters=4, clients_per_cluster=8, dim=10, samples_per_client=9,
        validation_samples=2, test_samples=2, scale=10.0,
    ).build(seed, byzantine_total=byzantine_total, dtype=F64)


def federation(data, attack, seed=0, batch_size=None) -> Federation:
    return Federation(data.objective, data.train, data.cluster_ids, data.byzantine, seed, batch_size, attack)


def error(data, fed, algo) -> float:
    honest = ~fed.byzantine
    return float((algo.client_models()[honest] - data.optima[data.cluster_ids[honest]]).pow(2).sum(-1).mean())


class Spy(AttackBase):
    """Forwards to an attack (and its placement) and keeps what it saw and sent."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []
        self.graph_placement = inner.graph_placement

    def __call__(self, messages, context: AttackContext):
        rows = self.inner(messages, context)
        self.calls.append((messages.clone(), context, rows.clone()))
        return rows


@pytest.mark.parametrize(
    "graph", [{"kind": "barabasi_albert", "m": 2}, SPARSE, {"kind": "random_geometric", "radius": 0.35}]
)
def test_byzantine_nodes_take_the_highest_degree_positions(graph):
    data = task()
    spec = GraphSpec(**graph)
    fed = federation(data, NeighbourPoison())
    placed = federation_graph(fed, spec)
    degrees = placed.degrees
    byzantine = fed.byzantine
    assert int(degrees[byzantine].min()) >= int(degrees[~byzantine].max())
    drawn = make_graph(spec, fed.clients, generator(fed.seed, "graph"))
    top = torch.sort(drawn.degrees, descending=True).values[: int(byzantine.sum())]
    assert torch.equal(torch.sort(degrees[byzantine], descending=True).values, top)
    # the algorithm runs on that graph; at random positions client c sits at node c
    algo = defenses.build("pdl_tc", fed, {**PDL, "graph": graph})
    assert torch.equal(algo.graph.adjacency, placed.adjacency)
    assert torch.equal(federation_graph(federation(data, RandomlyPlaced()), spec).adjacency, drawn.adjacency)


def test_each_receiver_gets_its_own_point_just_inside_its_ball():
    """For receiver r with own momentum c, honest neighbourhood H (itself included, h
    points) and b Byzantine neighbours: every Byzantine row it receives is
    c - 0.95 tau unit(c), tau the rank-floor(0.2 (h + b - 1)) distance from c to H;
    it lies inside r's first-round ball (quantile 0.2 over all h + b points)."""
    data = task()
    spy = Spy(NeighbourPoison())
    fed = federation(data, spy, batch_size=4)
    algo = defenses.build("pdl_tc", fed, {**PDL, "graph": SPARSE, "clustering_rounds": 1})
    algo.step(0)
    algo.step(1)
    messages, context, rows = spy.calls[-1]
    byzantine = context.byzantine
    neighbours = context.defense_state["neighbours"]
    assert context.kind == "momentum" and rows.shape == (messages.shape[0], int(byzantine.sum()), 10)
    inside_count = 0
    for r, receiver in enumerate(context.receivers.tolist()):
        c = messages[r, receiver]
        assert torch.equal(c, algo.momenta[receiver])
        honest = neighbours[r] & ~byzantine
        b = int((neighbours[r] & byzantine).sum())
        distances = torch.sort((messages[r, honest] - c).norm(dim=-1)).values
        rank = min(math.floor(0.2 * (len(distances) + b - 1)), len(distances) - 1)
        expected = c - 0.95 * distances[rank] * c / c.norm()
        torch.testing.assert_close(rows[r], expected.expand_as(rows[r]), rtol=1e-12, atol=1e-12)
        if b:  # r's first clustering round, on what it received from its neighbourhood
            points = torch.cat([messages[r, honest], rows[r, neighbours[r][byzantine]]])
            own = int(honest[:receiver].sum())
            ball = threshold_clustering(points, torch.tensor([own]), {"policy": "quantile", "q": 0.2}, 1)
            assert ball.inside[0, -b:].all()
            inside_count += 1
    assert inside_count >= 10
    first, second = rows[0, 0], rows[1, 0]
    assert not torch.equal(first, second)  # its own message for each receiver


def test_flip_sends_each_receiver_minus_scale_times_its_own_message():
    data = task()
    spy = Spy(NeighbourPoison(mode="flip", scale=3.0))
    fed = federation(data, spy, batch_size=4)
    algo = defenses.build("pdl_tc", fed, {**PDL, "graph": SPARSE})
    algo.step(0)
    messages, context, rows = spy.calls[-1]
    own = messages[torch.arange(messages.shape[0]), context.receivers]
    assert torch.equal(rows, (-3.0 * own).unsqueeze(1).expand_as(rows))


def test_away_pushes_from_the_honest_neighbourhood_mean():
    g = torch.Generator().manual_seed(3)
    messages = torch.randn(3, 7, 4, generator=g, dtype=F64) + 2
    byzantine = torch.tensor([False, True, False, False, True, False, False])
    neighbours = torch.rand(3, 7, generator=g) < 0.7
    receivers = torch.tensor([0, 3, 6])
    neighbours[torch.arange(3), receivers] = True
    context = AttackContext(0, "momentum", byzantine, torch.zeros(7, dtype=torch.long), torch.Generator(),
                            receivers=receivers, defense_state={"neighbours": neighbours})
    rows = NeighbourPoison(direction="away")(messages, context)
    for r in range(3):
        c = messages[r, receivers[r]]
        mean = messages[r, neighbours[r] & ~byzantine].mean(0)
        step = rows[r, 0] - c
        cosine = torch.dot(step, c - mean) / (step.norm() * (c - mean).norm())
        assert float(cosine) == pytest.approx(1.0, abs=1e-12) or float(step.norm()) == 0.0


def test_without_receivers_the_target_is_the_honest_mean():
    """At a server (MC, global) every block's target is the mean of its honest rows."""
    g = torch.Generator().manual_seed(4)
    messages = torch.randn(9, 3, generator=g, dtype=F64)
    byzantine = torch.zeros(9, dtype=torch.bool)
    byzantine[[2, 5]] = True
    context = AttackContext(0, "momentum", byzantine, torch.zeros(9, dtype=torch.long), torch.Generator())
    rows = NeighbourPoison()(messages, context)
    mean = messages[~byzantine].mean(0)
    distances = torch.sort((messages[~byzantine] - mean).norm(dim=-1)).values
    tau = distances[math.floor(0.2 * (7 + 2 - 1))]
    torch.testing.assert_close(rows, (mean - 0.95 * tau * mean / mean.norm()).expand(2, 3))


@pytest.mark.parametrize("name", ["mc", "fc", "global", "pfl_tc"])
def test_server_algorithms_run_under_neighbour_poison(name):
    data = task(0, 4)
    fed = federation(data, NeighbourPoison(), batch_size=4)
    algo = defenses.build(name, fed, {"lr": 0.01})
    for t in range(3):
        algo.step(t)
    assert torch.isfinite(algo.client_models()[~fed.byzantine]).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_high_degree_placement_hurts_sparse_pdl_tc_more_than_random_placement(seed):
    """The same crafted messages from the best-connected nodes reach more receivers.
    Measured (Erdos-Renyi p = 0.3, 32 honest + 4 Byzantine, 300 rounds; mean squared
    distance to the cluster optima): seed 0: 114.6 high degree, 91.5 random, 68.4
    without Byzantine clients; seed 1: 154.8, 97.5, 77.7."""

    def train(attack, byzantine):
        data = task(seed, byzantine)
        fed = federation(data, attack, seed)
        algo = defenses.build("pdl_tc", fed, {**PDL, "graph": SPARSE})
        for t in range(300):
            algo.step(t)
        return error(data, fed, algo), fed, algo

    high, fed, algo = train(NeighbourPoison(), 4)
    low, fed_random, algo_random = train(RandomlyPlaced(), 4)
    clean, _, _ = train(None, 0)
    assert high > 1.1 * low > 1.1 * clean

    def reached(fed, algo):  # honest receivers with a Byzantine neighbour
        adjacency = algo.graph.adjacency
        return int((adjacency[~fed.byzantine][:, fed.byzantine].any(-1)).sum())

    assert reached(fed, algo) > reached(fed_random, algo_random)


@pytest.mark.parametrize(
    ("options", "field"),
    [({"mode": "swap"}, "mode"), ({"direction": "up"}, "direction"), ({"eps": 1.0}, "eps"),
     ({"eps": 0.0}, "eps"), ({"quantile": 1.5}, "quantile"), ({"scale": 0.0}, "scale"),
     ({"scale": math.inf}, "scale")],
)
def test_invalid_options_name_the_field(options, field):
    with pytest.raises(ValueError, match=f"neighbour_poison.{field}"):
        attacks.build("neighbour_poison", options)


def test_registered_with_its_placement():
    cls = attacks.REGISTRY["neighbour_poison"]
    assert cls is NeighbourPoison and cls.graph_placement == "high_degree"
    assert cls.needs == {"omniscient", "adaptive"}
