"""The threshold-clustering family of Werner et al.: Federated-Clustering (Alg. 2),
Momentum-Clustering (Alg. 4) and Myopic-Clustering (Alg. 1), all built on
:func:`defenses.threshold_clustering.threshold_clustering` (Alg. 3)."""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, ClassVar, Literal

import torch
from pydantic import BaseModel, Field, field_validator, model_validator
from torch import Tensor

from defenses.ball_diagnostics import ball_rows
from defenses.base import Algorithm, AlgorithmParams, RoundWork, register
from defenses.centre_rules import collapsed, relabelled, sticky_assignment, trimmed_cost
from defenses.kmeans_init import dense_rows, density_sample, kmeans, kmeans_plus_plus
from defenses.optimiser import HeavyBall
from robust_pfl.engine import defense_state
from robust_pfl.engine.rows import admissible_points, squared_from_products
from defenses.radius import RadiusPolicy, make_radius
from defenses.threshold_clustering import ClusteringResult, Method, threshold_clustering
from robust_pfl.engine.data import Batch
from robust_pfl.engine.devices import engine, memory_budget_mb
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import RoundRecord

# Points per clustering up to which ``auto`` uses the "pairwise" evaluation: it beats
# "gram" on small problems, but its N^2 d product grows faster than "gram"'s few passes
# over the points, so "gram" wins on larger ones (the crossover: benchmarks/README.md,
# "Kernel choices").
PAIRWISE_MAX_POINTS = 96
# The same bound on the batched engine (an accelerator).  A problem of N points costs
# "pairwise" 2 N^2 d FLOPs at the GEMM rate F and "gram" about ten passes over its
# ``[N, d]`` rows at the memory bandwidth W, which are equal near N = 20 F / W: about
# 200 for float32 on an H100 or H200 (50-60 TFLOP/s, 3.3-4.8 TB/s).  FC's problems
# (250 senders at the Fig. 6 scale, 63 in a group of 16 at N = 1,000) take the
# Gram matrix; MC's one problem of thousands of clients takes "gram".
PAIRWISE_MAX_POINTS_BATCHED = 256


class ClusteringParams(AlgorithmParams):
    """Threshold-Clustering settings shared by FC, MC and Myopic."""

    # Written as a number or {policy = ..., ...}; validated into its policy once, here
    # (defenses.radius.make_radius, which names the bad field: radius.q ...), and held
    # as that object: the algorithms use it as it is.
    radius: Any = Field(
        default_factory=lambda: {"policy": "quantile", "q": 0.2},
        validate_default=True,
        description="fixed radius, or {policy = fixed|theory|quantile|cd, ...}; quantile: q, rule = "
        "interpolated (default, with factor = 1, strict = false) | official (0.99 * sorted(d)[int(q N)], "
        "d <= tau); cd: fit = lloyd (default, iterations = 25) | kmeans++ (the optimal 3-means, as the "
        "official code's KMeans)",
    )
    clustering_rounds: int = Field(10, ge=0, description="Threshold-Clustering rounds M")
    method: Literal["auto", "direct", "gram", "pairwise"] = Field(
        "auto",
        description="distance evaluation; auto: direct when d <= 1024, else pairwise for "
        "at most 96 points per clustering, else gram",
    )

    @field_validator("radius", mode="before")
    @classmethod
    def _radius_policy(cls, value: Any) -> RadiusPolicy:
        return make_radius(value)  # raises ValueError naming the bad field

    def radius_policy(self) -> RadiusPolicy:
        """The radius policy (``radius``, parsed when the parameters were validated)."""
        return self.radius

    def distance_method(self, points: Tensor) -> Method:
        """The evaluation for ``points[..., N, d]``.  ``auto`` picks exact differences
        for small models and inner products for large ones: the points' Gram matrix
        ("pairwise") up to ``PAIRWISE_MAX_POINTS`` points (``PAIRWISE_MAX_POINTS_BATCHED``
        on the batched engine of :func:`robust_pfl.engine.devices.engine`), lazily kept
        products ("gram") beyond."""
        if self.method != "auto":
            return self.method
        if points.shape[-1] <= 1024:
            return "direct"
        batched = engine(points.device) == "batched"
        most = PAIRWISE_MAX_POINTS_BATCHED if batched else PAIRWISE_MAX_POINTS
        return "pairwise" if points.shape[-2] <= most else "gram"


FC_CPU_BUDGET_MB = 1024


class FederatedClusteringParams(ClusteringParams):
    groups: int = Field(1, ge=1, description="random subgroups per round (paper's MNIST: 16)")
    record_balls: bool = Field(
        False, description="diagnostics: record what each centre's ball holds at the end of every round (own "
        "cluster, other honest, Byzantine messages; defenses.ball_diagnostics), for reading a run against Thm 3.1",
    )
    subgroup_split: Literal["balanced", "chunks"] = Field(
        "balanced",
        description="how the round's shuffle of all clients is cut into groups: balanced (default): "
        "`groups` parts whose sizes differ by at most one; chunks: the official code's consecutive "
        "chunks of ceil(N / groups), the last shorter (300 clients, 16 groups: 15 x 19 + 15), which "
        "can make fewer groups (10 clients, 6 groups: 5 x 2)",
    )
    # On the CPU, 1024 MB: three receivers per chunk at the Fig. 6 scale, whose
    # clustering then shares its per-call costs (benchmarks/README.md).  Results do not
    # depend on it.
    memory_budget_mb: int | None = Field(
        None,
        ge=1,
        description=f"working-set bound for cross gradients (default: {FC_CPU_BUDGET_MB} on the CPU, "
        "a quarter of the free memory on CUDA)",
    )


@register
class FederatedClustering(Algorithm):
    """Federated-Clustering (Werner et al., Alg. 2).

    Every client ``i`` receives ``g_j(x_i)`` from every client ``j`` (of its subgroup)
    and runs Threshold-Clustering on them with one centre started at its own
    ``g_i(x_i)``; then ``x_i -= eta * v_i`` (with optional heavy-ball momentum, as the
    official code does).  ``O(N^2)`` gradient evaluations per round, computed as
    batched chunks of receivers whose working set stays under ``memory_budget_mb``.
    Byzantine clients' own models are never updated (only their messages matter).
    All clients of a subgroup use the same batch for every receiver in a round.

    Besides the ball (``centres``, ``radius_policy``, ``aggregate``) and last round's
    balls (``assignment[R, N]``: 0 where a client's row was inside the receiver's ball
    at the last iteration of last round's clustering, else -1), the attack sees
    ``client_gradient(c)``: client ``c``'s honest gradient at its own model on this
    round's batch, ``g_c(x_c)`` (``[d]``; for a Byzantine or unknown ``c``, the honest
    client of lowest index), which bit flip's ``"client_model"`` source sends.
    """

    name = "fc"
    published_state = defense_state.FC

    flower = True

    flower_node_attacks = True
    summary = "Federated-Clustering: cluster everyone's gradients at my model (Alg. 2)"
    reference = "Werner et al. 2023, Alg. 2"
    Params = FederatedClusteringParams

    @classmethod
    def round_work(cls, params: FederatedClusteringParams, clients: int, task_clusters: int, model_dim: int) -> RoundWork:
        """Each client evaluates its gradient at every model of its group (about
        ``N / groups``) and clusters the group's gradients for ``clustering_rounds``."""
        group = math.ceil(clients / params.groups)
        return RoundWork(float(group), float(clients) * group * (params.clustering_rounds + 2),
                         serial_steps=float(params.clustering_rounds))

    @classmethod
    def client_count_problems(cls, params: FederatedClusteringParams, clients: int) -> list[tuple[str, str]]:
        if params.groups > clients:
            return [("groups", f"must be at most the number of clients (a group needs one), got {params.groups}")]
        return []

    def __init__(self, federation: Federation, params: FederatedClusteringParams) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).expand(federation.clients, -1).clone()
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)
        self.policy = params.radius_policy()
        self._groups_rng = federation.rng("fc-groups")
        self._buffers: dict[int, Tensor] = {}
        # [N, d] own gradients and updates, reused every round (fresh ones page-fault)
        self._own = torch.zeros_like(self.models)
        self._updates = torch.zeros_like(self.models)
        # [N, N] bool, receiver x sender: inside the receiver's ball at the last iteration
        # of the latest round's clustering (None before the first).  Only published
        # (defense_state "assignment"); a checkpoint keeps it, so that a resumed run
        # publishes what the uninterrupted one does.
        self.inside: Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A checkpoint leaves out the round's scratch (the cross-gradient workspace, up
        to ``memory_budget_mb``, and the ``[N, d]`` own-gradient and update buffers):
        each is overwritten before it is read."""
        return {**self.__dict__, "_buffers": {}, "_own": None, "_updates": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.pop("_buffer", None)  # a checkpoint of a version with one workspace
        # a checkpoint written before the balls were kept: none known until the next round
        self.__dict__.setdefault("inside", None)
        self._buffers = {}
        self._own = torch.zeros_like(self.models)
        self._updates = torch.zeros_like(self.models)

    @property
    def budget_mb(self) -> int:
        """``memory_budget_mb``, or the device's default."""
        return self.params.memory_budget_mb or memory_budget_mb(self.federation.device, FC_CPU_BUDGET_MB)

    def _cluster(self, messages: Tensor, starts: Tensor) -> ClusteringResult:
        """Alg. 3 on ``messages[M, S, d]``, each problem's centre starting at the row
        ``starts[M, 1]`` of its messages (the receiver's own gradient)."""
        method = self.params.distance_method(messages)
        return threshold_clustering(messages, starts, self.policy, self.params.clustering_rounds, method=method)

    def _subgroups(self) -> list[Tensor]:
        """This round's groups: a seeded shuffle of all clients (Byzantine ones
        included) cut as ``subgroup_split`` says."""
        n = self.federation.clients
        if self.params.groups == 1:
            return [torch.arange(n, device=self.federation.device)]
        order = torch.randperm(n, generator=self._groups_rng, device=self._groups_rng.device)
        if self.params.subgroup_split == "chunks":
            parts = torch.split(order, math.ceil(n / self.params.groups))
        else:
            parts = torch.tensor_split(order, self.params.groups)
        return [part.to(self.federation.device) for part in parts]

    def _client_gradients(self, batch: Batch) -> Callable[[int], Tensor]:
        """``c -> g_c(x_c)`` on ``batch`` (this round's), computed when first asked
        and kept for the round; a Byzantine or unknown ``c`` gives the honest client
        of lowest index."""
        fed = self.federation
        kept: dict[int, Tensor] = {}

        def client_gradient(client: int) -> Tensor:
            honest = fed.honest
            if not 0 <= client < fed.clients or not bool(honest[client]):
                if not bool(honest.any()):
                    raise ValueError("client_gradient: the federation has no honest client")
                client = int(honest.nonzero()[0, 0])
            if client not in kept:
                rows = torch.tensor([client], device=self.models.device)
                kept[client] = fed.cross_gradients(self.models[rows], batch.select(rows))[0, 0]
            return kept[client]

        return client_gradient

    def _workspace(self, rows: int, senders: int, slot: int = 0) -> Tensor:
        """A reused ``[rows, senders, d]`` cross-gradient workspace; ``slot`` keeps
        apart the workspaces of groups whose clusterings wait together (:class:`_Pending`)."""
        shape = (rows, senders, self.models.shape[1])
        buffers = self._buffers
        if slot not in buffers or buffers[slot].numel() < rows * senders * shape[2]:
            buffers[slot] = self.models.new_empty(shape)
        return buffers[slot].view(-1)[: rows * senders * shape[2]].view(shape)

    def _rows_by_size(self, groups: list[tuple[Tensor, int, Tensor]], row_bytes: int) -> dict[int, int]:
        """Per group size, the workspace rows :class:`_Pending` gathers before it
        clusters: the receivers of all groups of that size, at most what an equal
        share of the budget holds (the workspaces of all sizes wait at once)."""
        receivers: dict[int, int] = {}
        for members, _, group_receivers in groups:
            receivers[members.numel()] = receivers.get(members.numel(), 0) + group_receivers.numel()
        share = (self.budget_mb << 20) // max(1, len(receivers))
        return {size: max(1, min(count, share // (row_bytes * size))) for size, count in receivers.items()}

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        batch = fed.sample_batch()
        d = self.models.shape[1]
        updates, own = self._updates.zero_(), self._own.zero_()
        row_bytes = 2 * d * self.models.element_size()
        client_gradient = self._client_gradients(batch)
        # last round's balls are published; this round's are filled as its clusterings run
        last, self.inside = self.inside, torch.zeros(fed.clients, fed.clients, dtype=torch.bool, device=fed.device)
        groups = []
        for members in self._subgroups():
            # Honest senders first: when the attack overwrites the Byzantine rows unread,
            # only the leading honest block is computed (Threshold-Clustering does not
            # depend on the order of its points).
            members = fed.honest_first(members)
            computed = members.numel() if fed.byzantine_rows_read else int((~fed.byzantine[members]).sum())
            receivers = (fed.honest[members]).nonzero().squeeze(-1)  # positions in group
            groups.append((members, computed, receivers))
        pending = _Pending(self, updates, engine(fed.device) == "batched", self._rows_by_size(groups, row_bytes))
        for members, computed, receivers in groups:
            group_batch = batch.select(members[:computed])
            for chunk in fed.chunks(receivers, row_bytes * members.numel(), self.budget_mb << 20):
                clients = members[chunk]
                grads = pending.workspace(chunk.numel(), members.numel())
                fed.cross_gradients(self.models[clients], group_batch, out=grads[:, :computed])
                rows = torch.arange(chunk.numel(), device=grads.device)
                start = grads[rows, chunk]  # g_i(x_i), the initial centre (a copy)
                own[clients] = start
                starts = chunk.unsqueeze(1)  # the same rows, by index

                def aggregate(messages: Tensor, starts: Tensor = starts) -> Tensor:
                    return self._cluster(messages, starts).centres

                state = {
                    "centres": start.unsqueeze(1),
                    "radius_policy": self.policy,
                    "assignment": None if last is None else torch.where(last[clients], 0, -1),
                    "aggregate": aggregate,
                    "client_gradient": client_gradient,
                }
                received = fed.deliver(
                    grads,
                    round_index,
                    "cross_gradient",
                    receivers=clients,
                    defense_state=state,
                    senders=members,
                    inplace=True,
                )
                pending.add(clients, starts, received, members)
        pending.flush()
        # Every row is stepped: a row that received nothing (a Byzantine client's, whose
        # model is never read) has a zero update and keeps its parameters exactly; the
        # whole-tensor step reuses its scratch instead of gathering the honest rows.
        self.optimizer.apply(self.models, updates)
        extras = {"balls": torch.cat(pending.balls)} if pending.balls else {}
        return RoundRecord(round_index, gradients=self.kept(own), updates=self.kept(updates), extras=extras)

    def ball_rows(self, received: Tensor, centres: Tensor, clients: Tensor, senders: Tensor) -> Tensor:
        """:func:`defenses.ball_diagnostics.ball_rows` of receivers ``clients[M]`` whose
        messages ``received[M, S, d]`` came from ``senders[M, S]``, around their
        ``centres[M, 1, d]``: a receiver's own cluster is its true cluster."""
        fed = self.federation
        byzantine = fed.byzantine[senders]
        own = (fed.cluster_ids[senders] == fed.cluster_ids[clients].unsqueeze(-1)) & ~byzantine
        return ball_rows(received, centres, self.policy, max(self.params.clustering_rounds - 1, 0), byzantine,
                         own.unsqueeze(-2))

    def client_models(self) -> Tensor:
        return self.models


class _Pending:
    """FC's clusterings of one round, run as its chunks are delivered (the CPU's
    blocked engine: one chunk's workspace reused, cache-sized work) or, on an
    accelerator (``together``), gathered across groups: every chunk of one group size
    is written into that size's workspace, and all of them are clustered in one
    batched call when it fills or the round ends.  With 16 groups that is one or two
    Threshold-Clustering calls a round instead of sixteen, each a few hundred small
    kernels (issue 45).  The problems are independent, so the centres are those of
    separate calls; the deliveries (and the attack's draws) keep their order."""

    def __init__(self, algorithm: FederatedClustering, updates: Tensor, together: bool,
                 rows_by_size: dict[int, int]) -> None:
        """``rows_by_size``: per group size, how many workspace rows its chunks may
        fill before they are clustered (the budget's rows, at most the round's
        receivers in groups of that size)."""
        self.algorithm, self.updates, self.together = algorithm, updates, together
        self.rows_by_size = rows_by_size
        # by group size: the workspace, its rows used, the waiting chunks' clients and starts
        self.waiting: dict[int, tuple[Tensor, int, list[Tensor], list[Tensor]]] = {}
        self.senders: dict[int, list[Tensor]] = {}  # by group size: the waiting chunks' senders (record_balls)
        self.balls: list[Tensor] = []  # the round's ball rows, with record_balls

    def workspace(self, rows: int, senders: int) -> Tensor:
        """The ``[rows, senders, d]`` block a chunk's cross gradients go to (a full
        workspace is clustered first)."""
        if not self.together:
            return self.algorithm._workspace(rows, senders)
        slot = sorted(self.rows_by_size).index(senders)
        if senders not in self.waiting:
            self.waiting[senders] = (self.algorithm._workspace(self.rows_by_size[senders], senders, slot), 0, [], [])
        workspace, used, _, _ = self.waiting[senders]
        if used + rows > workspace.shape[0]:
            self._cluster(senders)
            used = 0
        if rows > workspace.shape[0]:  # a chunk larger than the planned rows: room for it alone
            workspace = self.algorithm._workspace(rows, senders, slot)
            self.waiting[senders] = (workspace, 0, [], [])
        return workspace[used : used + rows]

    def add(self, clients: Tensor, starts: Tensor, received: Tensor, members: Tensor) -> None:
        """A delivered chunk: ``received[M, S, d]`` (its workspace block) for the
        receivers ``clients[M]`` from the senders ``members[S]``, each centre starting at
        row ``starts[M, 1]``."""
        senders = members.expand(clients.numel(), -1)
        if not self.together:
            result = self.algorithm._cluster(received, starts)
            self.updates[clients] = result.centres[:, 0]
            self._note(received, result, clients, senders)
            return
        self.senders.setdefault(received.shape[1], []).append(senders)
        workspace, used, waiting_clients, waiting_starts = self.waiting[received.shape[1]]
        self.waiting[received.shape[1]] = (
            workspace, used + clients.numel(), [*waiting_clients, clients], [*waiting_starts, starts]
        )

    def flush(self) -> None:
        for senders in list(self.waiting):
            self._cluster(senders)

    def _cluster(self, senders: int) -> None:
        workspace, used, clients, starts = self.waiting[senders]
        if used:
            result = self.algorithm._cluster(workspace[:used], torch.cat(starts))
            self.updates[torch.cat(clients)] = result.centres[:, 0]
            self._note(workspace[:used], result, torch.cat(clients), torch.cat(self.senders.pop(senders)))
        self.waiting[senders] = (workspace, 0, [], [])
        self.senders.pop(senders, None)

    def _note(self, received: Tensor, result: ClusteringResult, clients: Tensor, senders: Tensor) -> None:
        """Which senders ``senders[M, S]`` ended inside the balls of receivers
        ``clients[M]`` (the algorithm's ``inside``, published next round), and the
        chunk's ball rows with ``record_balls``."""
        self.algorithm.inside[clients.unsqueeze(-1), senders] = result.inside[:, 0]
        if self.algorithm.params.record_balls:
            self.balls.append(self.algorithm.ball_rows(received, result.centres, clients, senders))


class CentreClusteringParams(ClusteringParams):
    clusters: int | None = Field(None, ge=1, description="K centres (default: the task's K)")
    record_balls: bool = Field(
        False, description="diagnostics: record what each centre's ball holds at the end of every round (own "
        "cluster, other honest, Byzantine messages; defenses.ball_diagnostics), for reading a run against Thm 3.1",
    )
    init: Literal["kmeans++", "random_clients", "kmeans"] = Field(
        "kmeans++",
        description="how centres are seeded: kmeans++ (D^2 sampling) | random_clients | kmeans (k-means++ then "
        "Lloyd iterations, best of 10 seedings)",
    )
    warm_start: bool = Field(
        True, description="start from last round's centres (Alg. 4); False: seed afresh each round"
    )
    seed_from: Literal["all", "dense"] = Field(
        "all",
        description="which received vectors seed the centres: all | dense (those whose distance to their "
        "neighbours is at most the median, defenses.kmeans_init.dense_rows: an isolated far message, such as a "
        "large-gradient attacker's, seeds no centre)",
    )
    reseed: Literal["never", "merged", "challenger"] = Field(
        "never",
        description="never: warm-started centres are kept whatever happens (Alg. 4 as printed); merged: when two "
        "centres end closer than merge_tolerance times the points' median distance to their nearest centre, or a "
        "centre is nearest to no point, the round is clustered again from freshly seeded centres; challenger: every "
        "round a freshly seeded clustering challenges the warm-started one and replaces it when its trimmed cost "
        "is lower by challenger_margin (defenses.centre_rules)",
    )
    merge_tolerance: float = Field(
        0.5, gt=0, description="reseed = merged: centres closer than this times the median point-to-centre distance "
        "count as merged",
    )
    challenger_margin: float = Field(
        0.1, ge=0, lt=1, description="reseed = challenger: the fresh clustering replaces the warm-started one when "
        "its trimmed cost is below (1 - challenger_margin) times the warm-started one's",
    )
    trim: int | None = Field(
        None, ge=0, description="reseed = challenger: messages left out of the trimmed cost, the farthest from "
        "their centres (default: the run's Byzantine count)",
    )
    centre_update: Literal["ball", "cell"] = Field(
        "ball",
        description="ball: each centre moves by its whole ball (Alg. 3; balls may overlap); cell: by the part of "
        "its ball in its cell (the clients assigned to it last round, or nearest to it after a fresh seeding), so "
        "that two centres never share a point",
    )
    switch_margin: float = Field(
        0.0, ge=0, lt=1, description="a client assigned last round leaves its centre only for one at most "
        "(1 - switch_margin) times as far (0: the nearest centre, Alg. 4)",
    )


class _ServerClustering(Algorithm):
    """Shared server side of Myopic- and Momentum-Clustering: cluster the N received
    vectors into K centres warm-started from last round, assign each client to its
    nearest centre, and send it that centre."""

    forms_clusters = True
    message_kind = "gradient"

    @classmethod
    def round_work(cls, params: CentreClusteringParams, clients: int, task_clusters: int, model_dim: int) -> RoundWork:
        """One gradient per client; ``clustering_rounds`` passes of K centres over the N
        received vectors, and the nearest-centre assignment."""
        centres = params.clusters or task_clusters
        return RoundWork(1.0, float(clients) * centres * (params.clustering_rounds + 1) + 4.0 * clients,
                         serial_steps=float(params.clustering_rounds))

    def __init__(self, federation: Federation, params: CentreClusteringParams) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).expand(federation.clients, -1).clone()
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)
        self.policy = params.radius_policy()
        self.k = params.clusters or federation.clusters
        self.centres: Tensor | None = None
        self.assignment = torch.zeros(federation.clients, dtype=torch.long, device=federation.device)
        self.balls: Tensor | None = None  # this round's ball rows, with record_balls
        self._init_rng = federation.rng(f"{self.name}-centres")
        self._start_reseed_count()
        # [N, d] buffers reused every round (fresh ones cost page faults): own
        # gradients, delivered messages, and the centre each client applies.
        self._buffers: dict[str, Tensor] = {}
        # K free rows just ahead of each buffer, by the buffer's address (see _buffer)
        self._centre_slots: dict[int, Tensor] = {}

    def _buffer(self, name: str) -> Tensor:
        if name not in self._buffers:
            self._buffers[name] = self._rows_with_centre_slot()
        return self._buffers[name]

    def _rows_with_centre_slot(self) -> Tensor:
        """A zeroed ``[N, d]`` buffer whose storage keeps ``K`` free rows just ahead
        of it.  When it is clustered, :meth:`_cluster` puts the starting centres there,
        and the pairwise evaluation then takes their products with the points in the
        points' own Gram product (:func:`defenses.pairwise_clustering._stacked_ahead`)."""
        whole = self.models.new_zeros(self.k + self.models.shape[0], self.models.shape[1])
        rows = whole[self.k :]
        self._centre_slots[rows.data_ptr()] = whole[: self.k]
        return rows

    def _centres_in_slot(self, received: Tensor, centres: Tensor) -> Tensor:
        """``centres``, copied into the free rows ahead of ``received`` when it is one
        of this algorithm's buffers (else returned as they are)."""
        slot = self._centre_slots.get(received.data_ptr())
        if slot is None or received.shape != self.models.shape or centres.shape != slot.shape:
            return centres
        return slot.copy_(centres)

    def _start_reseed_count(self) -> None:
        """The run's re-seed count (:attr:`RoundRecord.reseeds`), the last round that
        re-seeded, and whether a run of consecutive re-seeds was warned of."""
        self.reseeds = 0
        self._last_reseed: int | None = None
        self._storm_warned = False

    @property
    def trim(self) -> int:
        """Messages the challenger's trimmed cost leaves out: ``trim``, else the run's
        Byzantine count."""
        return int(self.federation.byzantine.sum()) if self.params.trim is None else self.params.trim

    def _count_reseed(self, round_index: int, reseeded: bool) -> None:
        """Count a re-seed; warn once per run when two consecutive rounds re-seed (a
        storm: clients would get a different centre every round)."""
        if not reseeded:
            return
        if self._last_reseed == round_index - 1 and not self._storm_warned:
            warnings.warn(
                f"{self.name}: the centres were re-seeded in consecutive rounds ({round_index} and "
                f"{round_index + 1}); clients may be getting a different centre every round (reseed = "
                f"{self.params.reseed!r}; docs/mc.md)", RuntimeWarning, stacklevel=3)
            self._storm_warned = True
        self.reseeds += 1
        self._last_reseed = round_index

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (a checkpoint) moves every buffer: the slots are keyed afresh by
        the address of the buffer each lies just ahead of.  A checkpoint written before
        re-seeds were counted resumes with the count at 0."""
        self.__dict__.update(state)
        for name, value in (("reseeds", 0), ("_last_reseed", None), ("_storm_warned", False), ("balls", None)):
            self.__dict__.setdefault(name, value)
        self._centre_slots = {
            slot.data_ptr() + slot.numel() * slot.element_size(): slot for slot in self._centre_slots.values()
        }

    def _own_gradients(self, into: Tensor | None = None, blend: float | None = None) -> Tensor:
        """``g_i(x_i)`` of every client this round, in a reused buffer (or blended into
        ``into`` as ``lerp(into, g, blend)``).  Byzantine rows that the attack
        overwrites unread are not computed (they stay as they were)."""
        fed = self.federation
        out = self._buffer("gradients") if into is None else into
        batch = fed.sample_batch(reuse=True)  # consumed at once
        return fed.gradients(self.models, batch, out=out, skip_unread=True, blend=blend)

    def _initial_centres(self, received: Tensor, generator: torch.Generator) -> Tensor:
        """K seeds from ``received`` (from its dense rows with ``seed_from = "dense"``)."""
        if self.params.seed_from == "dense":
            received = received[dense_rows(received, self.k, generator)]
        return self._seeds(received, generator)

    def _seeds(self, pool: Tensor, generator: torch.Generator) -> Tensor:
        """K seeds among the rows of ``pool`` by ``init``."""
        if self.params.init == "kmeans++":
            return kmeans_plus_plus(pool, self.k, generator)
        if self.params.init == "kmeans":
            return kmeans(pool, self.k, generator).centres.to(pool.dtype)
        pool = pool[admissible_points(pool)]
        if pool.shape[0] == 0:
            return pool.new_zeros(self.k, pool.shape[-1])
        pick = torch.randint(pool.shape[0], (self.k,), generator=generator, device=generator.device)
        if pool.shape[0] >= self.k:
            pick = torch.randperm(pool.shape[0], generator=generator, device=generator.device)[: self.k]
        return pool[pick.to(pool.device)]

    def _challenger(self, received: Tensor, generator: torch.Generator, norms: Tensor) -> tuple[Tensor, Tensor]:
        """``reseed = "challenger"``'s fresh clustering: seeded (from the dense rows with
        ``seed_from = "dense"``) and clustered by Alg. 3 within the density sample of at
        most :data:`~defenses.kmeans_init.DENSITY_SAMPLE` messages, then every
        message's distance to its centres ``[N, K]``: one pass over the N messages
        (``norms``: their squared norms, float64)."""
        rows, dense = density_sample(received, self.k, generator)
        sample = received[rows]
        seeds = self._seeds(sample[dense] if self.params.seed_from == "dense" else sample, generator)
        cells = "nearest" if self.params.centre_update == "cell" else None
        result = threshold_clustering(sample, seeds, self.policy, self.params.clustering_rounds,
                                      method=self._method(sample, cells), cells=cells)
        return result.centres, self._distances(received, result.centres, norms)

    def _method(self, points: Tensor, cells: Tensor | str | None) -> Method:
        """The evaluation of Alg. 3 on ``points``: the parameters' choice, except that
        cell balls take "gram" where that is "pairwise" (which has no cells)."""
        method = self.params.distance_method(points)
        return "gram" if cells is not None and method == "pairwise" else method

    @staticmethod
    def _distances(received: Tensor, centres: Tensor, norms: Tensor) -> Tensor:
        """``[N, K]`` distances of every message to every centre through inner
        products (``||z||^2 + ||v||^2 - 2 <z, v>`` with ``norms = ||z||^2`` in float64;
        one pass over the messages), which decide assignments and the challenger's cost
        (no ball membership, whose ties the Threshold-Clustering evaluations settle
        from coordinates).  An inadmissible message or centre is infinitely far."""
        products = (received @ centres.transpose(0, 1)).double()
        middles = torch.linalg.vector_norm(centres, dim=-1).double().square()
        squared = squared_from_products(norms, middles, products)
        finite = torch.isfinite(norms).unsqueeze(-1) & torch.isfinite(middles).unsqueeze(0) & torch.isfinite(products)
        return torch.where(finite, squared.sqrt(), math.inf)

    @staticmethod
    def _squared_norms(received: Tensor) -> Tensor:
        """``||z||^2`` of every message in float64 (``inf`` for a non-finite one)."""
        return torch.linalg.vector_norm(received, dim=-1).double().square()

    def _cluster(self, received: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, bool]:
        """Alg. 3 from warm-started (or freshly seeded) centres, then the assignment
        (nearest centre, or :func:`~defenses.centre_rules.sticky_assignment`) and the
        ``reseed`` rule: ``(centres[K, d], assignment[N], re-seeded)``."""
        params = self.params
        norms = self._squared_norms(received)
        if self.centres is None or not params.warm_start:
            centres, assignment = self._fresh_clustering(received, generator, norms)
            if params.reseed == "merged" and collapsed(received, centres, assignment, params.merge_tolerance):
                centres, assignment = self._fresh_clustering(received, generator, norms)
                return centres, assignment, True
            return centres, assignment, False
        previous = self.assignment
        centres, distances = self._threshold_clustering(
            received, self.centres, norms, previous if params.centre_update == "cell" else None)
        assignment = sticky_assignment(distances, previous, params.switch_margin)
        if params.reseed == "merged" and collapsed(received, centres, assignment, params.merge_tolerance):
            centres, assignment = self._fresh_clustering(received, generator, norms)
            return centres, assignment, True
        if params.reseed == "challenger":
            fresh, fresh_distances = self._challenger(received, generator, norms)
            fresh_assignment = fresh_distances.argmin(dim=-1)
            incumbent_cost = trimmed_cost(distances, assignment, self.trim)
            if trimmed_cost(fresh_distances, fresh_assignment, self.trim) < (1 - params.challenger_margin) * incumbent_cost:
                order = relabelled(centres, fresh)
                labels = torch.empty_like(order)
                labels[order] = torch.arange(order.numel(), device=order.device)
                return fresh[order], labels[fresh_assignment], True
        return centres, assignment, False

    def _fresh_clustering(self, received: Tensor, generator: torch.Generator, norms: Tensor) -> tuple[Tensor, Tensor]:
        """Alg. 3 from freshly seeded centres and the nearest-centre assignment."""
        cells = "nearest" if self.params.centre_update == "cell" else None
        centres, distances = self._threshold_clustering(received, self._initial_centres(received, generator), norms,
                                                        cells)
        return centres, distances.argmin(dim=-1)

    def _threshold_clustering(self, received: Tensor, centres: Tensor, norms: Tensor,
                              cells: Tensor | str | None = None) -> tuple[Tensor, Tensor]:
        """Alg. 3 from ``centres`` (each ball restricted to its cell with ``cells``),
        then every point's distance to every final centre ``[N, K]`` (an
        inadmissible point is infinitely far from all)."""
        method = self._method(received, cells)
        if method == "pairwise":
            centres = self._centres_in_slot(received, centres)
        result = threshold_clustering(received, centres, self.policy, self.params.clustering_rounds, method=method,
                                      cells=cells)
        return result.centres, self._distances(received, result.centres, norms)

    def _ball_rows(self, received: Tensor) -> Tensor:
        """:func:`defenses.ball_diagnostics.ball_rows` around this round's centres (each
        restricted to its clients with ``centre_update = "cell"``): a centre's own
        cluster is the true cluster most of its honest clients belong to."""
        fed = self.federation
        honest = fed.honest
        clusters = fed.cluster_ids
        count = int(clusters.max()) + 1
        assigned = torch.nn.functional.one_hot(self.assignment, self.centres.shape[0]).bool() & honest.unsqueeze(-1)
        votes = (assigned.unsqueeze(-1) & torch.nn.functional.one_hot(clusters, count).bool().unsqueeze(1)).sum(0)
        dominant = torch.where(votes.sum(-1) > 0, votes.argmax(-1), -1)  # [K]
        own = (clusters.unsqueeze(0) == dominant.unsqueeze(-1)) & honest.unsqueeze(0)  # [K, N]
        cells = None
        if self.params.centre_update == "cell":
            cells = self.assignment.unsqueeze(0) == torch.arange(self.centres.shape[0], device=own.device).unsqueeze(-1)
        return ball_rows(received.unsqueeze(0), self.centres.unsqueeze(0), self.policy,
                         max(self.params.clustering_rounds - 1, 0), fed.byzantine.unsqueeze(0), own.unsqueeze(0),
                         None if cells is None else cells.unsqueeze(0))

    def _ball_extras(self) -> dict[str, Tensor]:
        """The round record's ``extras`` with ``record_balls``."""
        return {} if self.balls is None else {"balls": self.balls}

    def _probe(self, messages: Tensor) -> Tensor:
        """What every client would apply if ``messages`` were received (for adaptive
        attacks); uses a copy of the seeding generator, so probing changes nothing."""
        copy = torch.Generator(device=self._init_rng.device)
        copy.set_state(self._init_rng.get_state())
        centres, assignment, _ = self._cluster(messages, copy)
        return centres[assignment]

    def _defense_state(self) -> dict[str, Any]:
        """What adaptive attacks see at this round's delivery (``defense_state.SERVER_CLUSTERING``):
        last round's centres and assignment (both ``None`` before the first clustering;
        the zeros the assignment starts as were never a clustering's), the radius
        policy and the probe.  Read-only: nothing here changes the round."""
        assignment = None if self.centres is None else self.assignment
        return {"centres": self.centres, "radius_policy": self.policy, "assignment": assignment,
                "aggregate": self._probe}

    def _cluster_and_update(self, round_index: int, vectors: Tensor) -> Tensor | None:
        fed = self.federation
        state = self._defense_state()
        # An attack that reads nothing overwrites the Byzantine rows in place: those rows
        # of ``vectors`` carry nothing honest to keep (see Federation.byzantine_rows_read).
        unread = not fed.byzantine_rows_read
        received = fed.deliver(
            vectors,
            round_index,
            self.message_kind,
            defense_state=state,
            inplace=unread,
            out=None if unread else self._buffer("received"),
        )
        self.centres, self.assignment, reseeded = self._cluster(received, self._init_rng)
        self._count_reseed(round_index, reseeded)
        self.balls = self._ball_rows(received) if self.params.record_balls else None
        # Every row is stepped: Byzantine clients' own models are never read, and
        # gathering the honest rows would cost two extra [N, d] copies.  The applied
        # rows (centres[assignment]) are gathered only for records that keep them.
        out = self._buffer("updates") if self.snapshot_records else None
        return self.optimizer.apply_gathered(self.models, self.centres, self.assignment, out)

    def client_models(self) -> Tensor:
        return self.models


class MyopicParams(CentreClusteringParams):
    warm_start: bool = Field(
        False, description="Alg. 1 clusters each round's gradients afresh (k-means++ seeding)"
    )


@register
class MyopicClustering(_ServerClustering):
    """Myopic-Clustering (Werner et al., Alg. 1): the server clusters the N gradients
    ``g_i(x_i)`` of this round (centres seeded afresh by default) and sends each client
    its nearest centre; ``x_i -= eta * v_{k_i}``.  Fails on the constructed example of
    Sec. 2.1 (Fig. 1a)."""

    name = "myopic"
    published_state = defense_state.SERVER_CLUSTERING

    flower = True

    flower_node_attacks = True
    summary = "Myopic-Clustering: server clusters the N gradients (Alg. 1)"
    reference = "Werner et al. 2023, Alg. 1"
    Params = MyopicParams

    def step(self, round_index: int) -> RoundRecord:
        grads = self._own_gradients()
        updates = self._cluster_and_update(round_index, grads)
        return RoundRecord(
            round_index,
            gradients=self.kept(grads),
            updates=self.kept(updates),
            centres=self.centres,
            assignment=self.assignment,
            reseeds=self.reseeds,
            extras=self._ball_extras(),
        )


class MomentumStartParams(BaseModel):
    """The momentum's first round, shared by the methods that send momenta (eq. 29:
    ``m_i = alpha g_i + (1 - alpha) m_i`` from ``m_i = 0``)."""

    first_alpha: float | None = Field(
        None, gt=0, le=1,
        description="momentum weight on the gradient in round 1 only (default: alpha); 1 makes m_1 = g_1, the "
        "start the workshop's proofs assume (A.1, Assumptions, item 2: m_0 = 0 and alpha = 1 at t = 1), so that "
        "momenta are as far apart as the gradients from the first round",
    )


def round_alpha(alpha: float, first_alpha: float | None, round_index: int) -> float:
    """The momentum weight of round ``round_index`` (0-based): ``first_alpha`` in the
    first round when set, else ``alpha``."""
    return first_alpha if round_index == 0 and first_alpha is not None else alpha


#: The rules Alg. 4 prints (or implies where it is silent): k-means++ seeds from every
#: message, warm-started centres kept for ever, Alg. 3's overlapping balls and the
#: nearest centre.  The theorems are about these, not about MC's defaults.
ALG4_PRINTED_RULES: dict[str, Any] = {"seed_from": "all", "reseed": "never", "centre_update": "ball",
                                      "switch_margin": 0.0}
#: Alg. 4 as printed, with alpha 0.1 (the paper gives no value): the option set tables
#: label "MC, Alg. 4 as printed".
ALG4_AS_PRINTED: dict[str, Any] = {"alpha": 0.1, **ALG4_PRINTED_RULES}


class MomentumClusteringParams(CentreClusteringParams, MomentumStartParams):
    """MC's defaults are the choices that make it cluster (docs/mc.md): Alg. 4 as printed
    is ``alpha = 0.1``-like momenta with ``seed_from = "all"`` and ``reseed = "never"``."""

    # checkpoints written before the cell balls and hysteresis existed ran Alg. 3's balls
    # and the nearest centre
    values_before_the_field_existed: ClassVar[dict[str, Any]] = {"centre_update": "ball", "switch_margin": 0.0}

    alpha: float = Field(
        0.01, gt=0, le=1,
        description="momentum weight on the new gradient (eq. 29); small keeps the clusters' early gradients in "
        "the momenta, which separates them after the gradients themselves have shrunk (docs/mc.md)",
    )
    seed_from: Literal["all", "dense"] = Field(
        "dense", description="which received vectors seed the centres (all: Alg. 4 as printed; dense: see "
        "CentreClusteringParams)",
    )
    reseed: Literal["never", "merged", "challenger"] = Field(
        "challenger", description="what replaces warm-started centres (never: Alg. 4 as printed; merged, "
        "challenger: see CentreClusteringParams)",
    )
    centre_update: Literal["ball", "cell"] = Field(
        "cell", description="how a centre moves (ball: Alg. 3; cell: see CentreClusteringParams)",
    )
    switch_margin: float = Field(
        0.3, ge=0, lt=1, description="hysteresis of the assignment (0: nearest centre, Alg. 4; see "
        "CentreClusteringParams)",
    )
    bias_correction: bool = Field(
        False,
        description="send m_t / (1 - (1 - alpha)^t) instead of m_t: the momentum started at 0 is (1 - alpha)^t "
        "short of the gradients' scale in round t (as Adam's first moment); the clustering is unchanged (every "
        "message scaled alike), the applied step is not",
    )

    @model_validator(mode="after")
    def _one_start_correction(self) -> "MomentumClusteringParams":
        if self.bias_correction and self.first_alpha is not None:
            raise ValueError("bias_correction and first_alpha both change the momentum's start; set one "
                             "(first_alpha = 1 already starts the momenta at the gradients' scale)")
        return self


@register
class MomentumClustering(_ServerClustering):
    """Momentum-Clustering (Werner et al., Alg. 4): each client sends
    ``m_i = alpha g_i(x_i) + (1 - alpha) m_i`` (eq. 29, ``m_i`` starts at 0); the
    server clusters the momenta with K centres warm-started from the previous round
    and sends each client its nearest centre; ``x_i -= eta * v_{k_i}``."""

    name = "mc"
    published_state = defense_state.SERVER_CLUSTERING

    flower = True

    flower_node_attacks = True
    summary = "Momentum-Clustering: server clusters the N momenta, warm-started (Alg. 4)"
    reference = "Werner et al. 2023, Alg. 4"
    Params = MomentumClusteringParams
    message_kind = "momentum"
    sends_momenta = True

    def __init__(self, federation: Federation, params: MomentumClusteringParams) -> None:
        super().__init__(federation, params)
        self.momenta = self._rows_with_centre_slot()

    def step(self, round_index: int) -> RoundRecord:
        alpha = round_alpha(self.params.alpha, self.params.first_alpha, round_index)
        if self.snapshot_records:  # the record keeps this round's gradients
            grads = self._own_gradients()
            self.momenta.lerp_(grads, alpha)  # alpha g + (1 - alpha) m, in place
        else:  # blended into the momenta as they are produced: one pass fewer
            grads = None
            self._own_gradients(into=self.momenta, blend=alpha)
        sent = self.momenta
        if self.params.bias_correction:
            sent = torch.div(self.momenta, 1 - (1 - alpha) ** (round_index + 1), out=self._buffer("corrected"))
        updates = self._cluster_and_update(round_index, sent)
        return RoundRecord(
            round_index,
            gradients=None if grads is None else self.kept(grads),
            momenta=self.kept(self.momenta),
            updates=self.kept(updates),
            centres=self.centres,
            assignment=self.assignment,
            reseeds=self.reseeds,
            extras=self._ball_extras(),
        )
