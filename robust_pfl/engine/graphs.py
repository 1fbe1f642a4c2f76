"""Communication graphs for decentralised systems (FedSPD, PDL-TC on sparse graphs).

A graph is a symmetric boolean adjacency ``[N, N]`` without self-loops.  The kinds are
the ones FedSPD's experiments use (Erdos-Renyi, Barabasi-Albert, random geometric)
plus the complete graph of PDL-TC (workshop paper, Alg. 3).  Random kinds are redrawn
until connected, since a disconnected graph splits a decentralised run into runs that
never meet.

Where Byzantine clients sit on the graph is part of the threat model: an attack may
declare ``graph_placement = "high_degree"`` (neighbour poisoning), and
:func:`federation_graph` then gives the Byzantine clients the highest-degree positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from robust_pfl.engine.seeding import generator as make_generator

GraphKind = Literal["complete", "erdos_renyi", "barabasi_albert", "random_geometric"]
MixingRule = Literal["uniform", "metropolis"]
Placement = Literal["random", "high_degree"]

# Redraws of a random graph before giving up on connectivity.
MAX_DRAWS = 1000


class GraphSpec(BaseModel):
    """A communication graph's kind and parameters (TOML: ``graph = { kind = ... }``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: GraphKind = Field("complete", description="complete | erdos_renyi | barabasi_albert | random_geometric")
    p: float = Field(0.06, gt=0, le=1, description="Erdos-Renyi edge probability (FedSPD: 0.06 at N = 100)")
    m: int = Field(2, ge=1, description="Barabasi-Albert: edges from each new node")
    radius: float = Field(0.3, gt=0, description="random geometric: connection radius in the unit square")
    dynamic: bool = Field(False, description="redraw the graph every round")
    weights: MixingRule = Field(
        "uniform",
        description="mixing weights: uniform (1/(deg+1), row-stochastic, as FedSPD's paper) | "
        "metropolis (1/(1+max(deg_i, deg_j)), doubly stochastic, as its proof assumes)",
    )


@dataclass(frozen=True)
class Graph:
    """An undirected graph: ``adjacency[i, j]`` is True when i and j exchange messages."""

    adjacency: Tensor

    def __post_init__(self) -> None:
        a = self.adjacency
        if a.dim() != 2 or a.shape[0] != a.shape[1] or a.dtype != torch.bool:
            raise ValueError(f"adjacency must be a square bool tensor, got {tuple(a.shape)} {a.dtype}")
        if not bool((a == a.T).all()) or bool(a.diagonal().any()):
            raise ValueError("adjacency must be symmetric with no self-loops")

    @property
    def n(self) -> int:
        return self.adjacency.shape[0]

    @property
    def degrees(self) -> Tensor:
        return self.adjacency.sum(dim=1)

    def connected(self) -> bool:
        """Whether every node reaches every other (breadth-first over the adjacency)."""
        if self.n == 0:
            return True
        seen = torch.zeros(self.n, dtype=torch.bool)
        seen[0] = True
        frontier = seen.clone()
        adjacency = self.adjacency.cpu()
        while bool(frontier.any()):
            reached = adjacency[frontier].any(dim=0) & ~seen
            seen |= reached
            frontier = reached
        return bool(seen.all())

    def mixing_weights(self, rule: MixingRule = "uniform", dtype: torch.dtype = torch.float64) -> Tensor:
        """``W[N, N]`` with ``W[i, j] > 0`` only for ``j = i`` or a neighbour of ``i``.

        ``uniform``: ``1 / (deg_i + 1)`` on i and each neighbour (rows sum to 1;
        FedSPD's experiments).  ``metropolis``: ``1 / (1 + max(deg_i, deg_j))`` on each
        edge and the rest on the diagonal: symmetric, so rows and columns sum to 1
        (the doubly stochastic matrix FedSPD's convergence proof assumes; Xiao & Boyd's
        Metropolis-Hastings weights)."""
        a = self.adjacency.to(dtype)
        deg = a.sum(dim=1)
        if rule == "uniform":
            return (a + torch.eye(self.n, dtype=dtype, device=a.device)) / (deg + 1).unsqueeze(-1)
        if rule == "metropolis":
            w = a / (1 + torch.maximum(deg.unsqueeze(0), deg.unsqueeze(1)))
            return w + torch.diag(1 - w.sum(dim=1))
        raise ValueError(f"graph.weights must be 'uniform' or 'metropolis', got {rule!r}")

    def relabelled(self, position: Tensor) -> "Graph":
        """The same graph with client ``c`` at node ``position[c]``: the new adjacency
        is ``A[position][:, position]``."""
        return Graph(self.adjacency[position][:, position])


def make_graph(spec: GraphSpec, n: int, generator: torch.Generator) -> Graph:
    """A graph of ``spec.kind`` on ``n`` nodes, drawn from ``generator`` (CPU);
    random kinds are redrawn until connected."""
    if spec.kind == "complete":
        return Graph(~torch.eye(n, dtype=torch.bool))
    if spec.kind == "barabasi_albert":
        return Graph(_barabasi_albert(n, spec.m, generator))  # connected by construction
    draw = _erdos_renyi if spec.kind == "erdos_renyi" else _random_geometric
    value = spec.p if spec.kind == "erdos_renyi" else spec.radius
    for _ in range(MAX_DRAWS):
        graph = Graph(draw(n, value, generator))
        if graph.connected():
            return graph
    field = "graph.p" if spec.kind == "erdos_renyi" else "graph.radius"
    raise ValueError(
        f"{field} = {value} gives no connected {spec.kind} graph on {n} nodes in {MAX_DRAWS} draws; raise it"
    )


def _symmetric(upper: Tensor) -> Tensor:
    upper = torch.triu(upper, diagonal=1)
    return upper | upper.T


def _erdos_renyi(n: int, p: float, generator: torch.Generator) -> Tensor:
    """Each of the ``n (n - 1) / 2`` edges independently with probability ``p``."""
    return _symmetric(torch.rand(n, n, generator=generator) < p)


def _random_geometric(n: int, radius: float, generator: torch.Generator) -> Tensor:
    """Nodes uniform in the unit square, an edge when their distance is <= radius."""
    points = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    close = torch.cdist(points, points) <= radius
    return close & ~torch.eye(n, dtype=torch.bool)


def _barabasi_albert(n: int, m: int, generator: torch.Generator) -> Tensor:
    """Preferential attachment: the first ``m + 1`` nodes form a clique (a connected
    seed), then each new node links to ``m`` distinct existing nodes drawn with
    probability proportional to their degree.  A loop over nodes: once per run, or
    once per round for a dynamic graph (N small draws, no client computation)."""
    a = torch.zeros(n, n, dtype=torch.bool)
    seed = min(n, m + 1)
    a[:seed, :seed] = ~torch.eye(seed, dtype=torch.bool)
    for node in range(seed, n):
        degrees = a[:node, :node].sum(dim=1).double()
        targets = torch.multinomial(degrees, min(m, node), replacement=False, generator=generator)
        a[node, targets] = True
        a[targets, node] = True
    return a


def place_byzantine(graph: Graph, byzantine: Tensor, placement: Placement) -> Graph:
    """``graph`` with the clients placed on its nodes.

    ``"random"``: client ``c`` sits at node ``c`` (the graph was drawn at random, so
    this is a uniformly random placement).  ``"high_degree"``: the Byzantine clients
    take the nodes of highest degree (ties: lower node first), the honest clients the
    remaining nodes in order."""
    if placement == "random" or not bool(byzantine.any()):
        return graph
    if placement != "high_degree":
        raise ValueError(f"graph placement must be 'random' or 'high_degree', got {placement!r}")
    order = torch.sort(graph.degrees.cpu(), descending=True, stable=True).indices  # nodes, best first
    bad = byzantine.cpu().bool()
    position = torch.empty(graph.n, dtype=torch.long)
    count = int(bad.sum())
    position[bad] = order[:count]
    position[~bad] = torch.sort(order[count:]).values
    return graph.relabelled(position)


def federation_graph(federation, spec: GraphSpec, round_index: int = 0) -> Graph:
    """The communication graph of ``federation``'s run (of round ``round_index`` when
    ``spec.dynamic``), on the federation's device.

    Drawn from the run's ``graph`` stream (``graph/<round>`` for dynamic graphs), so
    the same seed gives the same graphs and adding an attack never changes them.  The
    Byzantine clients are placed as the attack's ``graph_placement`` says (default
    ``"random"``)."""
    stream = f"graph/{round_index}" if spec.dynamic else "graph"
    graph = make_graph(spec, federation.clients, make_generator(federation.seed, stream))
    placement = "random" if federation.attack is None else federation.attack.graph_placement
    graph = place_byzantine(graph, federation.byzantine, placement)
    return Graph(graph.adjacency.to(federation.device))

