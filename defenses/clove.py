"""CLoVE: Clustering of Loss Vector Embeddings (Alg. 1 of "CLoVE: Personalized
Federated Learning through Clustering of Loss Vector Embeddings").

K cluster models.  Every round every client evaluates its loss on each of the K
models (Alg. 1 lines 6-7) and reports the loss vector to the server; the server
clusters the vectors into K groups (line 9: k-means, or agglomerative clustering as
in the paper's ablation, Sec. 5.3), matches the groups to the models by a
minimum-cost bipartite matching whose edge weight is the summed loss of the group's
members on the model (line 10), and every client trains the model matched to its
group: Option I, model averaging after local steps (lines 11, 14), or Option II,
gradient averaging (lines 12, 15).  A client's personalised model is its matched
model.  The paper's theory (Sec. 4, Theorem 4.1) clusters square roots of the losses
("SLV"), an option here.

Attack surface: the loss vectors are unverified.  They pass through
``Federation.deliver(..., "loss")``, where an attack that forges loss reports
(``forges_losses = True``, e.g. ``forged_loss``) can place its clients in any cluster;
the models (or gradients) then pass through ``deliver`` as usual.

Robustness (none of it is in the paper): a reported loss vector with a non-finite
entry, or whose squared norm overflows, is never clustered and never enters a
matching cost; such a client takes the model of its lowest finite reported loss (as
in IFCA), or keeps its previous model when no entry is finite.  Model and gradient
means take admissible rows only (:func:`defenses.ifca.admissible_group_mean`), and a
cluster whose clients sent none keeps its model.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from defenses.base import AlgorithmParams, register
from defenses.ifca import ClusterChoice, lowest_reported
from defenses.kmeans_init import kmeans
from defenses.optimiser import HeavyBall
from robust_pfl.engine import defense_state
from robust_pfl.engine.rows import admissible_points
from defenses.round_buffers import LocalStart, run_local_steps
from robust_pfl.engine.data import Batch
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import RoundRecord

# Loss evaluations per forward pass when the loss vectors use the full local data
# (model x client x sample rows): bounds the activations of a pass.
_LOSS_ROWS = 1 << 18


class CLoVEParams(AlgorithmParams):
    """CLoVE's options.  ``lr`` is the local (model averaging) or server (gradient
    averaging) step size; ``heavy_ball`` the momentum of the SGD steps."""

    clusters: int | None = Field(None, ge=1, description="K models (default: the task's K)")
    aggregation: Literal["model", "gradient"] = Field(
        "model",
        description="model: average local models after local_steps (Alg. 1 Option I); "
        "gradient: average gradients (Option II)",
    )
    local_steps: int = Field(5, ge=1, description="local steps per round with aggregation = 'model' (tau)")
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd",
        description="local optimiser with aggregation = 'model': heavy-ball SGD, or Adam (the paper's, "
        "betas 0.9/0.999, eps 1e-8, state reset every round)",
    )
    embedding: Literal["loss", "sqrt_loss"] = Field(
        "loss", description="client embedding: the loss vector (Alg. 1) or its square roots (SLV, Sec. 4)"
    )
    clustering: Literal["kmeans", "agglomerative"] = Field(
        "kmeans", description="clustering of the embeddings: k-means (Alg. 1) or agglomerative (Sec. 5.3 ablation)"
    )
    linkage: Literal["ward", "average", "complete", "single"] = Field(
        "ward", description="linkage of agglomerative clustering (scikit-learn's default: ward)"
    )
    kmeans_restarts: int = Field(10, ge=1, le=1000, description="k-means++ starts; the lowest-inertia result is kept")
    kmeans_iterations: int = Field(100, ge=1, le=10_000, description="at most this many Lloyd iterations per start")
    loss_data: Literal["train", "batch"] = Field(
        "train",
        description="data of the loss vectors: each client's whole training set (Alg. 1 line 6) "
        "or the round's batch",
    )

    @model_validator(mode="after")
    def _adam_alone(self) -> "CLoVEParams":
        if self.optimizer == "adam" and self.heavy_ball != 0:
            raise ValueError("heavy_ball must be 0 with optimizer = 'adam' (Adam has its own moments)")
        if self.optimizer == "adam" and self.aggregation != "model":
            raise ValueError("optimizer = 'adam' is the local optimiser: it needs aggregation = 'model'")
        return self


@register
class CLoVE(ClusterChoice):
    """CLoVE (Alg. 1): loss-vector embeddings, k-means (or agglomerative) clustering,
    min-cost matching of clusters to models, per-cluster model or gradient averaging.

    Each round:

    1. every client computes ``L_i = (f_i(theta_1), ..., f_i(theta_K))`` (line 6) and
       the server receives ``fed.deliver(L [N, K], t, "loss")``;
    2. the admissible reports are embedded (``loss``: ``L_i``; ``sqrt_loss``:
       ``sqrt(max(L_i, 0))``) and clustered into at most K groups (line 9);
    3. group ``c`` is matched to model ``m`` by :func:`min_cost_matching` on
       ``cost[c, m] = sum_{i in c} L_i[m]`` (reported losses, line 10);
    4. Option I (``aggregation = "model"``): every client runs ``local_steps`` steps
       from its matched model (the first on the round's batch, each further one on a
       fresh batch) and sends its local model; model ``m`` becomes the mean of the
       admissible local models of its clients (line 14).  Option II
       (``"gradient"``): every client sends its gradient at its matched model; model
       ``m`` takes a heavy-ball step with the mean admissible gradient (line 15).

    The paper weights means by sample counts ``n_i``; every client here holds the
    same number of samples, so the weights are equal.  The record's ``updates`` are
    the per-cluster pseudo-gradients ``(theta_old - theta_new) / lr`` (model
    averaging) or the mean gradients (gradient averaging); ``gradients`` the honest
    gradients at the matched models on the round's batch.
    """

    name = "clove"
    published_state = defense_state.CLOVE

    flower = True

    flower_node_attacks = False
    summary = "CLoVE: k-means of clients' loss vectors on K models, min-cost matching, per-cluster averaging"
    reference = "CLoVE (Clustering of Loss Vector Embeddings), Alg. 1; SLV embedding Sec. 4; ablations Sec. 5.3"
    Params = CLoVEParams
    _local: LocalStart | None = None  # made on first use (checkpoints leave its buffers out)
    init_stream = "clove-init"

    def __init__(self, federation: Federation, params: CLoVEParams, initial_models: Tensor | None = None) -> None:
        super().__init__(federation, params, initial_models)
        self.generator = federation.rng("clove-kmeans")
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)  # gradient averaging

    # -- the round ----------------------------------------------------------------------
    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        batch = fed.sample_batch()
        losses = self._losses(batch)  # [K, N], honest
        reported = fed.deliver(losses.T.contiguous(), round_index, "loss", defense_state=self._loss_state())
        self.assignment = self._assign(reported, self.generator, self.assignment)
        if self.params.aggregation == "model":
            gradients, cluster_updates = self._model_round(round_index, batch)
        else:
            gradients, cluster_updates = self._gradient_round(round_index, batch)
        record = self._record(round_index, gradients, cluster_updates)
        record.extras["reported_losses"] = self.kept(reported)
        return record

    def _losses(self, batch: Batch) -> Tensor:
        """Honest ``f_i(theta_m)``, ``[K, N]``: on each client's training set
        (``loss_data = "train"``, in chunks of clients) or on the round's batch."""
        fed = self.federation
        if self.params.loss_data == "batch":
            return fed.cross_losses(self.models, batch)
        data = fed.train
        per_client = self.models.shape[0] * data.samples_per_client
        rows = torch.arange(fed.clients, device=fed.device)
        chunks = fed.chunks(rows, per_client, _LOSS_ROWS)
        return torch.cat([fed.cross_losses(self.models, data.select(chunk)) for chunk in chunks], dim=1)

    def _model_round(self, round_index: int, batch: Batch) -> tuple[Tensor, Tensor]:
        """Option I: local steps from the matched models, then per-cluster means."""
        fed, params = self.federation, self.params
        if self._local is None:
            self._local = LocalStart()
        local = self._local.rows(self.models, self.assignment)  # a copy: one row per client
        if params.optimizer == "adam":
            step: _LocalAdam | HeavyBall = _LocalAdam(params.lr, local)
        else:
            step = self._local.optimizer(params.lr, params.heavy_ball, local)
        first = self.kept(run_local_steps(fed, local, batch, step, params.local_steps, self._local.buffers))
        received = fed.deliver(local, round_index, "model", defense_state=self._defense_state())
        means, sizes = self._cluster_means(received)
        active = (sizes > 0) & admissible_points(means)
        previous = self.models.clone()
        self.models[active] = means[active]
        return first, (previous - self.models) / params.lr

    def _gradient_round(self, round_index: int, batch: Batch) -> tuple[Tensor, Tensor]:
        """Option II: gradients at the matched models, per-cluster means, one step."""
        fed = self.federation
        grads = fed.gradients(self.models[self.assignment], batch)
        received = fed.deliver(grads, round_index, "gradient", defense_state=self._defense_state())
        means, sizes = self._cluster_means(received)
        active = sizes > 0
        self.optimizer.apply(self.models, means[active], rows=active.nonzero().squeeze(-1))
        return grads, means

    # -- clustering and matching --------------------------------------------------------
    def _assign(self, reported: Tensor, generator: torch.Generator, previous: Tensor) -> Tensor:
        """Every client's model ``[N]`` from the reported losses ``[N, K]`` (Alg. 1
        lines 9-10), drawing the k-means starts from ``generator``."""
        k = self.models.shape[0]
        wide = reported.double()
        clustered = admissible_points(reported) & admissible_points(wide) & torch.isfinite(wide).all(-1)
        assignment = lowest_reported(wide, previous)
        rows = clustered.nonzero().squeeze(-1)
        if rows.numel() == 0:
            return assignment
        losses = wide[rows]
        points = losses.clamp_min(0).sqrt() if self.params.embedding == "sqrt_loss" else losses
        if self.params.clustering == "kmeans":
            labels = kmeans_labels(points, k, generator, self.params.kmeans_restarts, self.params.kmeans_iterations)
        else:
            labels = agglomerative(points, k, self.params.linkage)
        groups = int(labels.max()) + 1
        cost = torch.zeros(groups, k, dtype=torch.float64, device=losses.device).index_add_(0, labels, losses)
        model_of = min_cost_matching(cost)
        assignment[rows] = model_of.to(assignment.device)[labels]
        return assignment

    # -- what an adaptive attack sees ---------------------------------------------------
    def _loss_state(self) -> dict[str, Any]:
        """At the loss reports: the models, last round's assignment, and ``assign``,
        the assignment the server would make from candidate reports ``[N, K]`` (on a
        copy of the k-means generator, so probing never changes the run)."""

        def assign(reports: Tensor) -> Tensor:
            return self._assign(reports, _copy(self.generator), self.assignment)

        return {"models": self.models, "assignment": self.assignment, "assign": assign}



# -- the pieces, as functions -------------------------------------------------------------
def kmeans_labels(points: Tensor, k: int, generator: torch.Generator, restarts: int = 10, iterations: int = 100) -> Tensor:
    """Labels ``[n]`` in ``[0, C)`` of k-means (:func:`defenses.kmeans_init.kmeans`:
    k-means++ seedings, Lloyd iterations, the restart of lowest cost) on finite
    ``points[n, D]``, renumbered so that every id has a member.  With ``n <= k``
    every point is its own cluster."""
    n = points.shape[0]
    if n <= k:
        return torch.arange(n, device=points.device)
    return _compact(kmeans(points, k, generator, restarts, iterations).labels)


def agglomerative(points: Tensor, k: int, method: str = "ward") -> Tensor:
    """Labels ``[n]`` of agglomerative clustering (``scipy.cluster.hierarchy``) cut
    into at most ``k`` clusters; with ``n <= k`` every point is its own cluster."""
    n = points.shape[0]
    if n <= k:
        return torch.arange(n, device=points.device)
    # scipy's clustering is slow to import, so only this option imports it
    # (benchmarks/README.md, "Kernel choices")
    from scipy.cluster.hierarchy import (
        fcluster,
        linkage,
    )

    tree = linkage(points.double().cpu().numpy(), method=method)
    labels = fcluster(tree, t=k, criterion="maxclust") - 1
    return _compact(torch.as_tensor(labels.astype(np.int64), device=points.device))


def min_cost_matching(cost: Tensor) -> Tensor:
    """``[C]``: the model matched to each of the ``C <= K`` groups by the min-cost
    bipartite matching of ``cost[C, K]`` (Hungarian method, ``scipy``'s
    ``linear_sum_assignment``; every group gets a distinct model).  Non-finite costs
    (which admissible reports cannot produce) count as the largest float."""
    values = torch.nan_to_num(cost.double(), nan=np.finfo(np.float64).max).cpu().numpy()
    rows, columns = linear_sum_assignment(values)
    model_of = torch.empty(cost.shape[0], dtype=torch.long)
    model_of[torch.as_tensor(rows)] = torch.as_tensor(columns, dtype=torch.long)
    return model_of.to(cost.device)


def _compact(labels: Tensor) -> Tensor:
    """Labels renumbered ``0..C-1`` in order of first appearance of their ids' values
    (``unique`` order), so that every id in ``[0, C)`` has a member."""
    _, inverse = torch.unique(labels, return_inverse=True)
    return inverse


def _copy(generator: torch.Generator) -> torch.Generator:
    copy = torch.Generator(device=generator.device)
    copy.set_state(generator.get_state())
    return copy


class _LocalAdam:
    """Per-row Adam (Kingma & Ba; betas 0.9 / 0.999, eps 1e-8, bias-corrected), the
    CLoVE paper's local optimiser; a fresh instance every round.  Like
    :class:`HeavyBall`, a row whose update or new parameters are not finite keeps its
    parameters and moments."""

    beta1, beta2, eps = 0.9, 0.999, 1e-8

    def __init__(self, lr: float, like: Tensor) -> None:
        self.lr = lr
        self.first = torch.zeros_like(like)
        self.second = torch.zeros_like(like)
        self.steps = 0

    def apply(self, params: Tensor, update: Tensor) -> None:
        self.steps += 1
        first = torch.lerp(self.first, update, 1 - self.beta1)
        second = torch.lerp(self.second, update * update, 1 - self.beta2)
        corrected = first / (1 - self.beta1**self.steps)
        scale = (second / (1 - self.beta2**self.steps)).sqrt_().add_(self.eps)
        moved = params - self.lr * corrected / scale
        ok = (torch.isfinite(update.sum(-1)) & torch.isfinite(moved.sum(-1))).unsqueeze(-1)
        self.first = torch.where(ok, first, self.first)
        self.second = torch.where(ok, second, self.second)
        params.copy_(torch.where(ok, moved, params))

