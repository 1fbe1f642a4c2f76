"""Clustered Federated Learning, CFL (Sattler, Mueller, Samek 2021, IEEE TNNLS 32(8),
Alg. 1 with the optimal bipartition of its Alg. 2).

Start with one cluster holding every client and run FedAvg inside each current
cluster.  When a cluster has come near a stationary point of its FedAvg objective
(the norm of its mean update is below ``eps1``) while some member's own update is
still large (max norm above ``eps2``), its members' data disagree: the cluster is
cut in two by the cosine similarity of the members' updates,

    alpha_ij = <u_i, u_j> / (||u_i|| ||u_j||),
    c1, c2 = argmin over bipartitions c1 + c2 = c of  max_{i in c1, j in c2} alpha_ij,

and each part continues as a cluster of its own (recursively, over rounds).  Clusters
are never merged again: a wrong cut is permanent (Werner et al. 2023, Sec. 2.1 and
``docs/cfl.md``).

What the papers leave open, as built here (``docs/cfl.md``):

* the updates ``u_i`` compared with ``eps1``/``eps2`` are pseudo-gradients: the
  gradient itself with ``local_steps = 0`` (gradient FedAvg), ``(x_c - x_i)/lr``
  after ``local_steps >= 1`` local SGD steps (Sattler's weight update divided by the
  learning rate, so the thresholds have the same units in both modes; cosine
  similarities are unchanged);
* ``linkage = "single"`` cuts the maximum-similarity spanning tree at its weakest
  edge, which is exactly the argmin above (Alg. 2 merges pairs in order of decreasing
  similarity until two groups are left); ``"complete"`` is the authors' notebook
  (scikit-learn's complete-linkage agglomerative clustering), which can cut elsewhere;
* the split is decided on this round's updates and the two parts then aggregate this
  round's updates separately (as the authors' notebook); a cluster is only split
  with at least ``min_split_size`` members (notebook: more than 2) and from round
  ``split_after`` on (notebook: after 20 rounds); ``gamma_max`` is Alg. 1's optional
  check ``sqrt((1 - alpha_cross_max) / 2) > gamma_max`` (None: no check, as the
  notebook).

Robustness: a row is admissible when its coordinates and squared norm are finite
(:func:`defenses.threshold_clustering.admissible_points`).  Inadmissible rows enter no
mean, no norm and no similarity; a client that sent one keeps its current cluster
id when that cluster is split (it stays with the part holding the cluster's
lowest-index admissible member).  A cluster model is only moved by a finite step
(:class:`defenses.base.HeavyBall`), so NaN, Inf or overflowing rows never reach it.
CFL is not a robust aggregator: admissible Byzantine rows (large gradients) enter the
cluster means and can stop splits (the mean norm stays above ``eps1``).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from defenses.base import Algorithm, AlgorithmParams, register
from defenses.optimiser import HeavyBall
from defenses.primitives import admissible_group_mean
from robust_pfl.engine import defense_state
from robust_pfl.engine.rows import admissible_points
from defenses.round_buffers import RoundBuffers, run_local_steps
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import RoundRecord


class CFLParams(AlgorithmParams):
    eps1: float = Field(
        0.4, gt=0, description="split only when the norm of a cluster's mean update is below eps1 (near stationary)"
    )
    eps2: float = Field(
        1.6, ge=0, description="split only when some member's update norm is above eps2 (its members disagree)"
    )
    split_after: int = Field(20, ge=0, description="no split before this round (0-based; the notebook: 20)")
    min_split_size: int = Field(
        3, ge=2, description="a cluster is split only with at least this many members (the notebook: more than 2)"
    )
    max_clusters: int | None = Field(None, ge=1, description="no split once there are this many clusters (None: no limit)")
    local_steps: int = Field(
        0, ge=0, description="0: clients send gradients (gradient FedAvg); k >= 1: k local SGD steps, clients send models"
    )
    linkage: Literal["single", "complete"] = Field(
        "single",
        description="bipartition: single = Alg. 2's optimal bipartition (min over cuts of the max cross "
        "similarity); complete = the authors' notebook (complete-linkage agglomerative clustering)",
    )
    gamma_max: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Alg. 1's check: split only when sqrt((1 - max cross similarity) / 2) > gamma_max (None: no check)",
    )


@register
class ClusteredFL(Algorithm):
    """Clustered Federated Learning (Sattler et al. 2021, Alg. 1; bipartition Alg. 2).

    Every round each client computes its update at its cluster's model: the gradient
    (``local_steps = 0``, sent with kind ``"gradient"``) or its model after
    ``local_steps`` SGD steps (kind ``"model"``, local heavy-ball momentum when
    ``heavy_ball > 0``, restarted every round).  The server forms each client's
    pseudo-gradient ``u_i`` (the gradient, or ``(x_c - x_i)/lr``), splits every
    cluster that meets the criterion (module docstring), and moves each cluster's
    model by the mean admissible ``u_i`` of its members after the split (server
    heavy-ball momentum in gradient mode; a new cluster inherits its parent's model and
    momentum).  A client's personalised model is its cluster's model.

    Record: ``gradients`` honest gradients at the cluster models (first local step),
    ``updates`` the mean pseudo-gradient each client's cluster applied, ``centres`` the
    cluster models after the round, ``assignment`` the cluster ids after the round's
    splits, ``extras["splits"]`` the ``(parent, new)`` cluster ids split this round.
    """

    name = "cfl"
    published_state = defense_state.CFL

    flower = True

    flower_node_attacks = False
    summary = "Clustered FL: FedAvg per cluster, bi-partition a stationary cluster by update cosine similarity"
    reference = "Sattler, Mueller, Samek 2021 (IEEE TNNLS), Clustered Federated Learning, Alg. 1 and Alg. 2"
    Params = CFLParams
    forms_clusters = True
    _round: RoundBuffers | None = None  # made on first use; checkpoints leave the contents out

    def __init__(self, federation: Federation, params: CFLParams) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).clone()  # [C, d]: one cluster, Global's initial model
        self.assignment = torch.zeros(federation.clients, dtype=torch.long, device=federation.device)
        # gradient mode: server momentum on the cluster models; model mode: momentum is local
        momentum = params.heavy_ball if params.local_steps == 0 else 0.0
        self.optimizer = HeavyBall(params.lr, momentum, self.models)

    # -- what adaptive attacks see -----------------------------------------------------
    def _defense_state(self) -> dict[str, Any]:
        """The cluster models, the assignment and the server's per-client aggregate
        ``[..., N, d] -> [..., N, d]`` (mean admissible message of the client's cluster,
        before this round's splits)."""
        assignment, count = self.assignment, self.models.shape[0]

        def aggregate(messages: Tensor) -> Tensor:
            return admissible_group_mean(messages, assignment, count)[0][..., assignment, :]

        return {"models": self.models, "assignment": self.assignment, "aggregate": aggregate}

    # -- one round -----------------------------------------------------------------------
    def _pseudo_gradients(self, round_index: int) -> tuple[Tensor, Tensor]:
        """``(u[N, d], honest first gradients[N, d])``: what the server received, as
        pseudo-gradients."""
        fed = self.federation
        batch = fed.sample_batch()
        if self._round is None:
            self._round = RoundBuffers()
        start = self._round.gather(self.models, self.assignment, "start")  # a copy: one row per client
        if self.params.local_steps == 0:
            gradients, received = self._round.delivered_gradients(fed, start, batch, round_index, self._defense_state())
            return received, gradients
        local = start.clone()
        optimizer = HeavyBall(self.params.lr, self.params.heavy_ball, local)
        gradients = run_local_steps(fed, local, batch, optimizer, self.params.local_steps)
        received = fed.deliver(local, round_index, "model", defense_state=self._defense_state())
        return (start - received) / self.params.lr, gradients

    def step(self, round_index: int) -> RoundRecord:
        updates, gradients = self._pseudo_gradients(round_index)
        admissible = admissible_points(updates)
        splits = self._split(round_index, updates, admissible)
        means, sizes = admissible_group_mean(updates, self.assignment, self.models.shape[0])
        active = (sizes > 0).nonzero().squeeze(-1)
        self.optimizer.apply(self.models, means[active], rows=active)
        return RoundRecord(
            round_index,
            gradients=self.kept(gradients),
            updates=self.per_client(means, self.assignment),
            cluster_updates=means,
            centres=self.models.clone(),
            assignment=self.assignment.clone(),
            extras={"splits": splits},
        )

    def _split(self, round_index: int, updates: Tensor, admissible: Tensor) -> list[tuple[int, int]]:
        """Alg. 1's branching step on this round's updates; returns the ``(parent,
        new)`` ids of the clusters split.  Criteria are batched over clusters; the loop
        runs over the clusters that meet them."""
        p = self.params
        if round_index < p.split_after:
            return []
        count = self.models.shape[0]
        means, sizes = admissible_group_mean(updates, self.assignment, count)
        mean_norm = torch.linalg.vector_norm(means.double(), dim=-1)
        norms = torch.linalg.vector_norm(updates, dim=-1, dtype=torch.float64)  # no float64 copy of the rows
        norms = torch.where(admissible, norms, 0.0)
        max_norm = torch.zeros(count, dtype=norms.dtype, device=norms.device)
        max_norm = max_norm.scatter_reduce(0, self.assignment, norms, "amax")
        members = torch.bincount(self.assignment, minlength=count)
        ready = (mean_norm < p.eps1) & (max_norm > p.eps2) & (members >= p.min_split_size) & (sizes >= 2)
        splits: list[tuple[int, int]] = []
        for cluster in ready.nonzero().squeeze(-1).tolist():
            if p.max_clusters is not None and self.models.shape[0] >= p.max_clusters:
                break
            clients = ((self.assignment == cluster) & admissible).nonzero().squeeze(-1)
            first, second, cross = bipartition(updates[clients], p.linkage)
            if p.gamma_max is not None and not np.sqrt((1.0 - cross) / 2.0) > p.gamma_max:
                continue
            # the part with the lowest-index admissible member (and every inadmissible
            # member) keeps the id; the other part becomes a new cluster
            moved = clients[torch.as_tensor(second, device=clients.device)]
            new = self.models.shape[0]
            self.assignment[moved] = new
            self.models = torch.cat([self.models, self.models[cluster : cluster + 1]])
            self.optimizer.buffer = torch.cat([self.optimizer.buffer, self.optimizer.buffer[cluster : cluster + 1]])
            splits.append((cluster, new))
        return splits

    def client_models(self) -> Tensor:
        return self.models[self.assignment]


def cosine_similarities(updates: Tensor) -> np.ndarray:
    """``[M, M]`` cosine similarities of the rows of ``updates[M, d]`` (float64; a zero
    row has similarity 0 with every row, as the notebook's ``+1e-12``)."""
    rows = updates.double()
    norms = torch.linalg.vector_norm(rows, dim=-1, keepdim=True)
    unit = torch.where(norms > 0, rows / norms.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    return (unit @ unit.T).clamp(-1.0, 1.0).cpu().numpy()


def bipartition(updates: Tensor, method: Literal["single", "complete"] = "single") -> tuple[list[int], list[int], float]:
    """Cut the rows of ``updates[M, d]`` (``M >= 2``) in two by cosine similarity:
    ``(first, second, cross)`` with the row indices of each part (the part holding
    row 0 first, each sorted) and ``cross``, the largest similarity across the cut.

    ``"single"``: agglomerative clustering on ``1 - alpha`` with single linkage, cut at
    the last merge.  Single linkage merges the most similar pair of groups each time,
    as Alg. 2 does, so its last merge splits the maximum-similarity spanning tree at its
    weakest edge: the cut minimising the largest cross similarity (Sattler et al.
    Alg. 1's argmin).  ``"complete"``: complete linkage, the authors' notebook."""
    similarity = cosine_similarities(updates)
    distance = np.clip(1.0 - similarity, 0.0, 2.0)
    np.fill_diagonal(distance, 0.0)
    # scipy's clustering is slow to import, so it is imported when a split happens
    # (benchmarks/README.md, "Kernel choices")
    from scipy.cluster.hierarchy import (
        linkage,
        to_tree,
    )
    from scipy.spatial.distance import squareform

    tree = to_tree(linkage(squareform(distance, checks=False), method=method))
    first, second = sorted(tree.get_left().pre_order()), sorted(tree.get_right().pre_order())
    if 0 not in first:
        first, second = second, first
    cross = float(similarity[np.ix_(first, second)].max())
    return first, second, cross
