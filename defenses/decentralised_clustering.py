"""The workshop version of threshold clustering (Werner et al., "Personalized federated
and decentralized learning with threshold clustering", workshop paper): PFL-TC
(Alg. 2) and PDL-TC (Alg. 3), both built on Threshold-Clustering (its Alg. 1, eq. 1;
Alg. 3 / eq. 24 of the journal version).

* **PFL-TC** is Momentum-Clustering with an *Option 2*: after ``m`` local SGD steps
  from ``x`` the client sends the pseudo-gradient ``(x - y^m) / eta`` instead of its
  gradient.  The paper prints ``(y^m - x) / eta`` (the sign is flipped: with ``m = 1``
  it would be ``-g``) and ``m = alpha g - (1 - alpha) m`` (a typo for ``+``, as its
  own Sec. 3 and Assumption 6 write it); both are corrected here.  Option 1
  (``local_steps = 0``) is exactly ``mc`` with the same ``warm_start``.
* **PDL-TC** has no server: every client ``j`` computes its momentum at its own model
  and sends it to its neighbours (the paper: every other client); client ``i`` runs
  Threshold-Clustering with one centre, started at its own momentum, on what it
  received plus its own momentum, and steps ``x_i -= eta v_i``.  On a sparse graph
  (an extension; the paper's graph is complete) client ``i`` clusters its
  neighbourhood only, and eq. 1's ``1/N`` becomes ``1/(deg_i + 1)``
  (:func:`neighbourhood_clustering`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from defenses.ball_membership import inside_ball, next_spread, tie_tolerance
from defenses.base import Algorithm, RoundWork, register
from defenses.clustering_algorithms import (
    ClusteringParams,
    MomentumClustering,
    MomentumClusteringParams,
    MomentumStartParams,
    round_alpha,
)
from defenses.graph_rounds import received_from_neighbours
from defenses.optimiser import HeavyBall
from robust_pfl.engine import defense_state
from robust_pfl.engine.rows import admissible_points, euclidean_distances, squared_norms
from defenses.radius import (
    OFFICIAL_QUANTILE_FACTOR,
    FixedRadius,
    QuantileRadius,
    RadiusPolicy,
    RadiusSpec,
    TheoryRadius,
    make_radius,
)
from defenses.threshold_clustering import ClusteringResult, threshold_clustering
from robust_pfl.engine.devices import memory_budget_mb
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.graphs import Graph, GraphSpec, federation_graph
from robust_pfl.engine.types import RoundRecord

# float16 / bfloat16 points are clustered in float32 (as threshold_clustering does)
_WIDENED = (torch.float16, torch.bfloat16)


# -- Threshold-Clustering on neighbourhoods of different sizes ------------------------------
def neighbourhood_radius(policy: RadiusPolicy, distances: Tensor, present: Tensor, round_index: int) -> Tensor:
    """The radius ``tau[R, 1]`` of each receiver's ball from ``distances[R, 1, P]``,
    where only the ``present`` (``[R, P]``) columns are the receiver's real points
    (its neighbours and itself); absent columns hold ``inf``.

    The radius is the policy's radius of the receiver's ``n_r`` present points alone
    (inadmissible neighbours included, at ``inf``, as every point counts in
    :func:`~defenses.threshold_clustering.threshold_clustering`): a quantile is read
    at position ``q (n_r - 1)`` (or the official rule's ``int(q n_r)``) of them,
    vectorised over receivers; a fixed or theory radius ignores the distances; any
    other policy (cd) is applied to the present distances of the receivers with
    ``n_r`` points, one call per distinct ``n_r`` (a loop over neighbourhood sizes,
    not clients).  With every point present this is the policy's own radius, bit
    for bit."""
    if isinstance(policy, (FixedRadius, TheoryRadius)):
        return policy(distances, round_index)
    count = present.sum(-1)  # [R]
    if isinstance(policy, QuantileRadius):
        return _neighbourhood_quantile(policy, distances, count.view(-1, 1, 1))
    if bool((count == present.shape[-1]).all()):
        return policy(distances, round_index)
    tau = distances.new_empty(distances.shape[:-1])
    # the present columns first, in their order (a stable sort of the absent flags)
    order = torch.sort((~present).to(torch.int8), dim=-1, stable=True).indices.unsqueeze(1)
    compact = distances.gather(-1, order)
    for size in torch.unique(count).tolist():
        rows = (count == size).nonzero().squeeze(-1)
        tau[rows] = policy(compact[rows, :, :size], round_index)
    return tau


def _neighbourhood_quantile(policy: QuantileRadius, distances: Tensor, count: Tensor) -> Tensor:
    """:class:`QuantileRadius` of the first ``count[R, 1, 1]`` sorted distances of
    every row (absent and inadmissible points, at ``inf``, sort last), with
    :func:`defenses.radius._quantile_of_sorted`'s arithmetic."""
    ordered = distances.sort(dim=-1).values
    if policy.rule == "official":
        # the official code's float product, truncated; capped at n - 1 (QuantileRadius._ranks)
        rank = torch.minimum((count.double() * policy.q).floor().long(), count - 1).clamp_min(0)
        return OFFICIAL_QUANTILE_FACTOR * ordered.gather(-1, rank).squeeze(-1)
    position = policy.q * (count - 1).clamp_min(0).double()  # float64, as Python's q * (n - 1)
    lo, hi = position.floor(), position.ceil()
    low, high = ordered.gather(-1, lo.long()), ordered.gather(-1, hi.long())
    frac = (position - lo).to(ordered.dtype)
    # low where frac == 0 or low is infinite
    between = torch.where(torch.isfinite(low), low + frac * (high - low), low)
    quantile = torch.where((frac == 0) | (lo == hi), low, between)
    return policy.factor * quantile.squeeze(-1)


def neighbourhood_clustering(
    points: Tensor, present: Tensor, start: Tensor, radius: RadiusSpec, rounds: int = 10
) -> ClusteringResult:
    """Threshold-Clustering with one centre per receiver, each on its own set of points.

    ``points[R, P, d]`` holds receiver ``r``'s points in the columns where
    ``present[R, P]`` is True (the rest is padding and is never read: absent rows may
    hold anything, NaN included); ``start[R]`` is the column of the receiver's own row,
    where its centre starts.  With ``n_r = present[r].sum()`` (its degree + 1) every
    round is eq. 24 over the receiver's points::

        v_l = (1 - |inside| / n_r) v_{l-1} + (1 / n_r) sum_{j inside} z_j

    with the radius from :func:`neighbourhood_radius` (a quantile over the receiver's
    points only).  An inadmissible point (non-finite, or overflowing squared norm) is
    never inside, as in :func:`~defenses.threshold_clustering.threshold_clustering`; an
    inadmissible start is returned unchanged and captures nothing.  With every column
    present this equals ``threshold_clustering(points, start[:, None], radius, rounds,
    method="direct")`` bit for bit (the direct evaluation's arithmetic, with ``N``
    replaced by ``n_r``).  Returns centres ``[R, 1, d]``, inside ``[R, 1, P]`` and
    radius ``[R, 1]``."""
    if points.dtype in _WIDENED:
        wide = neighbourhood_clustering(points.float(), present, start, radius, rounds)
        return ClusteringResult(wide.centres.to(points.dtype), wide.inside, wide.radius.to(points.dtype))
    if points.dim() != 3 or present.shape != points.shape[:2] or start.shape != points.shape[:1]:
        raise ValueError(
            f"neighbourhood_clustering needs points [R, P, d], present [R, P] and start [R]; got "
            f"{tuple(points.shape)}, {tuple(present.shape)} and {tuple(start.shape)}"
        )
    policy = make_radius(radius)
    rows = torch.arange(points.shape[0], device=points.device)
    v0 = points[rows, start].unsqueeze(1)  # [R, 1, d]: the receiver's own row
    admissible = present & admissible_points(points)
    clean = torch.where(admissible.unsqueeze(-1), points, 0.0)  # padding and garbage never enter a sum
    live = admissible_points(v0)  # [R, 1]
    v = torch.where(live.unsqueeze(-1), v0, 0.0)
    excluded = ~admissible.unsqueeze(1)  # [R, 1, P]
    n = present.sum(-1).to(points.dtype).view(-1, 1, 1)  # deg + 1 (eq. 24's N)
    lengths = torch.where(admissible, squared_norms(clean).sqrt(), 0.0)
    spread = torch.linalg.vector_norm(v, dim=-1)  # [R, 1]
    inside = torch.zeros(points.shape[0], 1, points.shape[1], dtype=torch.bool, device=points.device)
    tau = points.new_zeros(points.shape[0], 1)
    for round_index in range(rounds):
        distances = euclidean_distances(v, clean)
        distances = distances.masked_fill(excluded | torch.isnan(distances), torch.inf)
        tau = neighbourhood_radius(policy, distances, present, round_index)
        inside = inside_ball(distances, tau, policy.strict, tie_tolerance(lengths, spread))
        spread = next_spread(spread, inside, lengths, n.view(-1, 1))
        weights = inside.to(points.dtype)
        keep = 1 - weights.sum(-1, keepdim=True) / n
        v = keep * v + torch.bmm(weights, clean) / n
    return ClusteringResult(torch.where(live.unsqueeze(-1), v, v0), inside & live.unsqueeze(-1), tau)


def neighbourhoods(adjacency: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every client's closed neighbourhood (itself and its neighbours) as padded index
    rows: ``(index[N, P], present[N, P], own[N])`` with ``P = max degree + 1``; row
    ``i`` lists ``i``'s neighbourhood in increasing client order, then padding
    (``present`` False, index repeating a real member); ``own[i]`` is the column of
    ``i`` itself.  No loop: one stable sort of the membership mask."""
    n = adjacency.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=adjacency.device)
    member = adjacency | eye
    width = int(member.sum(-1).max()) if n else 0
    order = torch.sort((~member).to(torch.int8), dim=-1, stable=True).indices[:, :width]
    present = member.gather(1, order)
    index = torch.where(present, order, order[:, :1])  # padding points at a real member
    own = (index == torch.arange(n, device=adjacency.device).unsqueeze(-1)).int().argmax(-1)
    return index, present, own


# -- PDL-TC ------------------------------------------------------------------------------------
PDL_TC_CPU_BUDGET_MB = 1024


class PDLTCParams(ClusteringParams, MomentumStartParams):
    alpha: float = Field(
        0.1, gt=0, le=1, description="momentum weight on the new gradient, m = alpha g + (1 - alpha) m"
    )
    graph: GraphSpec = Field(
        default_factory=GraphSpec,
        description="communication graph: complete (the paper, all-to-all) | erdos_renyi (p) | "
        "barabasi_albert (m) | random_geometric (radius); dynamic = true redraws it every round",
    )
    memory_budget_mb: int | None = Field(
        None,
        ge=1,
        description=f"working-set bound of the received [receivers, N, d] messages per chunk (default: "
        f"{PDL_TC_CPU_BUDGET_MB} on the CPU, a quarter of the free memory on CUDA)",
    )


@register
class PersonalizedDecentralizedTC(Algorithm):
    """PDL-TC (workshop paper, Alg. 3): decentralised momentum clustering.

    Round ``t``: every client computes ``m_j = alpha g_j(x_j) + (1 - alpha) m_j`` at its
    own model (``m_j`` starts at 0) and sends it to its neighbours; client ``i`` runs
    Threshold-Clustering (Alg. 1 / eq. 24) with ``K = 1``, centre started at ``m_i``,
    on ``{m_j : j neighbour of i} + {m_i}``, and applies ``x_i -= eta v_i`` (with the
    optional heavy-ball momentum of every algorithm here).

    The graph is ``params.graph`` (:func:`robust_pfl.engine.graphs.federation_graph`, so an
    attack's ``graph_placement`` decides where the Byzantine clients sit).  Complete
    (the paper): :func:`~defenses.threshold_clustering.threshold_clustering` on all
    ``N`` messages, any distance evaluation.  Sparse (an extension): each client
    clusters its closed neighbourhood with eq. 24's ``1/N`` read as
    ``1/(deg_i + 1)`` and a quantile radius over the neighbourhood only
    (:func:`neighbourhood_clustering`, the direct evaluation); on the complete graph
    both give the same centres.

    A Byzantine client may send each neighbour a different message
    (:func:`defenses.graph_rounds.received_from_neighbours`).  The attack sees
    ``centres`` (the receivers' own momenta, ``[R, 1, d]``), ``radius_policy``,
    ``neighbours`` (``[R, N]`` bool, each receiver's closed neighbourhood) and
    ``aggregate`` (``[R, N, d]`` messages -> the ``[R, 1, d]`` centres the receivers
    would apply).  Byzantine clients' own models are never updated.
    """

    name = "pdl_tc"
    published_state = defense_state.PDL_TC
    summary = "PDL-TC: decentralised, each client clusters its neighbours' momenta around its own (workshop Alg. 3)"
    reference = "Werner et al., threshold-clustering workshop paper, Alg. 3"
    Params = PDLTCParams
    sends_momenta = True

    @classmethod
    def round_work(cls, params: PDLTCParams, clients: int, task_clusters: int, model_dim: int) -> RoundWork:
        """One momentum per client; every client clusters up to N received momenta
        for ``clustering_rounds``."""
        return RoundWork(1.0, float(clients) * clients * (params.clustering_rounds + 2),
                         serial_steps=float(params.clustering_rounds))

    def __init__(self, federation: Federation, params: PDLTCParams) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).expand(federation.clients, -1).clone()
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)
        self.policy = params.radius_policy()
        self.momenta = torch.zeros_like(self.models)
        self.graph: Graph | None = None if params.graph.dynamic else federation_graph(federation, params.graph)
        # every client's closed neighbourhood as padded index rows (see neighbourhoods)
        self._layout = None if self.graph is None else neighbourhoods(self.graph.adjacency)
        # [N, d] own gradients and updates, reused every round (fresh ones page-fault)
        self._own = torch.zeros_like(self.models)
        self._updates = torch.zeros_like(self.models)
        self._received: Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A checkpoint leaves out the round's scratch (overwritten before it is read)."""
        return {**self.__dict__, "_own": None, "_updates": None, "_received": None}

    @property
    def budget_mb(self) -> int:
        """``memory_budget_mb``, or the device's default."""
        return self.params.memory_budget_mb or memory_budget_mb(self.federation.device, PDL_TC_CPU_BUDGET_MB)

    def _workspace(self, rows: int) -> Tensor:
        """A reused ``[rows, N, d]`` buffer for a receiver chunk's messages (a fresh
        one per chunk page-faults)."""
        n, d = self.models.shape
        if self._received is None or self._received.shape[0] < rows:
            self._received = self.models.new_empty(rows, n, d)
        return self._received[:rows]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._received = None
        self._own = torch.zeros_like(self.models)
        self._updates = torch.zeros_like(self.models)

    @property
    def complete(self) -> bool:
        return self.params.graph.kind == "complete"

    def _cluster(
        self, messages: Tensor, receivers: Tensor, layout: tuple[Tensor, Tensor, Tensor]
    ) -> ClusteringResult:
        """Each receiver's Alg. 1 with K = 1 on ``messages[R, N, d]`` (what receiver ``r``
        got from every client), centre started at its own row."""
        rounds = self.params.clustering_rounds
        if self.complete:
            method = self.params.distance_method(messages)
            return threshold_clustering(messages, receivers.unsqueeze(1), self.policy, rounds, method=method)
        index, present, own = (part[receivers] for part in layout)
        rows = messages.gather(1, index.unsqueeze(-1).expand(-1, -1, messages.shape[-1]))
        return neighbourhood_clustering(rows, present, own, self.policy, rounds)

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        graph, layout = self.graph, self._layout
        if graph is None or layout is None:  # a dynamic graph: this round's
            graph = federation_graph(fed, self.params.graph, round_index)
            layout = neighbourhoods(graph.adjacency)
        batch = fed.sample_batch(reuse=True)  # consumed at once
        own = fed.gradients(self.models, batch, out=self._own, skip_unread=True)
        # alpha g + (1 - alpha) m, in place
        self.momenta.lerp_(own, round_alpha(self.params.alpha, self.params.first_alpha, round_index))
        updates = self._updates.zero_()
        ball = torch.zeros(fed.clients, dtype=torch.long, device=self.models.device)
        n, d = self.models.shape
        receivers = fed.honest.nonzero().squeeze(-1)
        row_bytes = (n + layout[0].shape[1]) * d * self.models.element_size()
        for chunk in fed.chunks(receivers, row_bytes, self.budget_mb << 20):
            neighbours = (graph.adjacency[chunk] | (torch.arange(n, device=chunk.device) == chunk.unsqueeze(-1)))

            def aggregate(messages: Tensor, chunk: Tensor = chunk) -> Tensor:
                return self._cluster(messages, chunk, layout).centres

            state = {
                "centres": self.momenta[chunk].unsqueeze(1),
                "radius_policy": self.policy,
                "neighbours": neighbours,
                "aggregate": aggregate,
            }
            workspace = self._workspace(chunk.numel())
            received = received_from_neighbours(fed, self.momenta, round_index, "momentum", chunk, state, workspace)
            result = self._cluster(received, chunk, layout)
            updates[chunk] = result.centres[:, 0]
            ball[chunk] = result.inside[:, 0].sum(-1)
        # Every row is stepped: a Byzantine client's row has a zero update and keeps its
        # parameters exactly; non-finite rows are skipped by HeavyBall.
        self.optimizer.apply(self.models, updates)
        return RoundRecord(
            round_index,
            gradients=self.kept(own),
            momenta=self.kept(self.momenta),
            updates=self.kept(updates),
            extras={"ball_size": ball, "degree": graph.degrees},
        )

    def client_models(self) -> Tensor:
        return self.models


# -- PFL-TC ------------------------------------------------------------------------------------
class PFLTCParams(MomentumClusteringParams):
    # PFL-TC re-seeds by k-means++ every round (Assumption 7), so it keeps the printed
    # algorithm's seeding and momentum weight.
    alpha: float = Field(0.1, gt=0, le=1, description="momentum weight on the new gradient (Alg. 2, step 3)")
    seed_from: Literal["all", "dense"] = Field("all", description="which received vectors seed the centres")
    reseed: Literal["never", "merged", "challenger"] = Field(
        "never", description="re-seed collapsed warm-started centres")
    centre_update: Literal["ball", "cell"] = Field("ball", description="how a centre moves (ball: Alg. 3)")
    switch_margin: float = Field(0.0, ge=0, lt=1, description="hysteresis of the assignment (0: nearest centre)")
    local_steps: int = Field(
        0, ge=0, description="m local SGD steps per round: 0 = Option 1 (send g_i(x_i), exactly mc); "
        "m > 0 = Option 2 (send (x - y^m) / eta)"
    )
    local_lr: float | None = Field(
        None, gt=0, description="eta of the local steps and of (x - y^m) / eta (default: lr)"
    )
    warm_start: bool = Field(
        False,
        description="False (default): k-means++ seeds the centres every round, as Assumption 7's remark "
        "says (initial centres v_{k,0}^t of round t); True: last round's centres (Alg. 4, mc's default)",
    )


@register
class PersonalizedFederatedTC(MomentumClustering):
    """PFL-TC (workshop paper, Alg. 2): Momentum-Clustering with Option 2.

    Option 1 (``local_steps = 0``) sends ``g_i(x_i)`` and is ``mc`` with the same
    ``warm_start`` exactly (same centre stream, same arithmetic).  Option 2 (``local_steps = m > 0``): client ``i``
    runs ``y^l = y^{l-1} - eta g_i(y^{l-1})`` from ``y^0 = x_i`` (the first step on the
    round's batch, every further step on a fresh batch) and blends the pseudo-gradient
    ``(x_i - y^m) / eta`` into its momentum, ``m_i = alpha g~_i + (1 - alpha) m_i``
    (the paper prints ``(y^m - x)/eta`` and ``- (1 - alpha) m``: a flipped sign and a
    typo).  The server clusters the momenta (K centres, seeded by k-means++ every
    round by default, Assumption 7; ``warm_start = true`` as ``mc``) and sends each client its nearest centre; ``x_i -= eta v_{k_i}``.
    Records carry the pseudo-gradients as ``gradients``.
    """

    name = "pfl_tc"

    flower = True

    flower_node_attacks = False
    summary = "PFL-TC: momentum clustering of local-SGD pseudo-gradients (x - y^m)/eta (workshop Alg. 2)"
    reference = "Werner et al., threshold-clustering workshop paper, Alg. 2"
    Params = PFLTCParams

    def __init__(self, federation: Federation, params: PFLTCParams) -> None:
        super().__init__(federation, params)
        # Option 1 is Alg. 4: the same centre stream as mc, so that it is mc exactly
        self._init_rng = federation.rng("mc-centres")

    def _pseudo_gradients(self) -> Tensor:
        """``(x - y^m) / eta`` of every client after ``m`` local SGD steps, in a reused
        buffer.  Byzantine rows the attack overwrites unread are not computed."""
        fed = self.federation
        eta = self.params.local_lr or self.params.lr
        local = self._buffer("local_models")
        local.copy_(self.models)
        gradients = self._buffer("local_gradients")
        for _ in range(self.params.local_steps):
            batch = fed.sample_batch(reuse=True)  # the round's batch, then fresh ones
            fed.gradients(local, batch, out=gradients, skip_unread=True)
            local.add_(gradients, alpha=-eta)
        pseudo = self._buffer("gradients")
        return torch.sub(self.models, local, out=pseudo).div_(eta)

    def step(self, round_index: int) -> RoundRecord:
        if self.params.local_steps == 0:
            return super().step(round_index)
        pseudo = self._pseudo_gradients()
        self.momenta.lerp_(pseudo, round_alpha(self.params.alpha, self.params.first_alpha, round_index))
        updates = self._cluster_and_update(round_index, self.momenta)
        return RoundRecord(
            round_index,
            gradients=self.kept(pseudo),
            momenta=self.kept(self.momenta),
            updates=self.kept(updates),
            centres=self.centres,
            assignment=self.assignment,
        )


__all__: list[str] = [
    "PersonalizedDecentralizedTC",
    "PersonalizedFederatedTC",
    "neighbourhood_clustering",
    "neighbourhood_radius",
    "neighbourhoods",
]
