"""IFCA (Ghosh et al. 2020): gradient averaging (Option I) and model averaging
(Option II).

K cluster models.  Each round every client evaluates all K models on its batch and
picks the one with the lowest loss (the losses are reported to the server through
``deliver``, kind ``"loss"``, so a loss-forging attack can choose its clients'
models).  Option I: the server averages the gradients of the clients that picked
model k and updates model k.  Option II: every client runs
local SGD from the model it picked and sends its local model; the server sets model k
to the mean of the local models of the clients that picked it.  A client's
personalised model is the model it picked.  Werner et al. Sec. 2.1 (Fig. 1b) shows
IFCA can stay stuck forever.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from defenses.base import Algorithm, AlgorithmParams, register
from defenses.optimiser import HeavyBall
from defenses.primitives import admissible_group_mean
from robust_pfl.engine import defense_state
from robust_pfl.engine.rows import admissible_points
from defenses.round_buffers import LocalStart, RoundBuffers, run_local_steps
from robust_pfl.engine.data import Batch
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import RoundRecord


class IFCAParams(AlgorithmParams):
    clusters: int | None = Field(None, ge=1, description="K models (default: the task's K)")


class IFCAModelAveragingParams(IFCAParams):
    local_steps: int = Field(5, ge=1, description="local SGD steps from the picked model per round (tau)")


class ClusterChoice(Algorithm):
    """What both IFCA options share: K models, the lowest-loss choice, the server's
    per-cluster mean of the admissible messages, the round record and the personalised
    models.  Subclasses define :meth:`step`."""

    forms_clusters = True
    init_stream: ClassVar[str] = "ifca-init"  # the seeded stream of the K initial models

    @classmethod
    def reported_loss_models(cls, params: AlgorithmParams, task_clusters: int) -> int | None:
        return params.clusters or task_clusters  # as __init__ picks K

    def __init__(self, federation: Federation, params: IFCAParams, initial_models: Tensor | None = None) -> None:
        super().__init__(federation, params)
        k = params.clusters or federation.clusters
        if initial_models is None:
            initial_models = federation.init_params(k, stream=self.init_stream)
        self.models = initial_models.to(federation.device, federation.dtype).clone()
        self.assignment = torch.zeros(federation.clients, dtype=torch.long, device=federation.device)

    def _choose(self, batch: Batch, round_index: int) -> None:
        """Every client picks the model with the lowest loss on its batch, as it
        *reports* it: the ``[N, K]`` losses pass through ``deliver`` (kind ``"loss"``),
        where an attack that forges loss reports can pick any model for its clients.
        NaN and +-Inf reported entries are ignored; a client whose report has no finite
        entry keeps its previous model (model 0 in the first round)."""
        losses = self.federation.cross_losses(self.models, batch)  # [K, N], honest
        reported = self.federation.deliver(
            losses.T.contiguous(), round_index, "loss", defense_state=self._defense_state()
        )
        self.assignment = lowest_reported(reported, self.assignment)

    def _cluster_means(self, messages: Tensor) -> tuple[Tensor, Tensor]:
        """Per-model mean of the admissible ``messages[..., N, d]`` of the clients that
        picked it: ``(means[..., K, d], sizes[..., K])`` (see :func:`admissible_group_mean`)."""
        return admissible_group_mean(messages, self.assignment, self.models.shape[0])

    def _defense_state(self) -> dict[str, Any]:
        """What adaptive attacks see: the models, the choice, and the server's
        per-client aggregate ``[..., N, d] -> [..., N, d]``."""

        def aggregate(messages: Tensor) -> Tensor:
            return self._cluster_means(messages)[0][..., self.assignment, :]

        return {"models": self.models, "assignment": self.assignment, "aggregate": aggregate}

    def _record(self, round_index: int, gradients: Tensor, cluster_updates: Tensor) -> RoundRecord:
        return RoundRecord(
            round_index,
            gradients=gradients,
            updates=self.per_client(cluster_updates, self.assignment),
            cluster_updates=cluster_updates,
            centres=self.models.clone(),
            assignment=self.assignment,
        )

    def client_models(self) -> Tensor:
        return self.models[self.assignment]


@register
class IFCA(ClusterChoice):
    """IFCA with gradient averaging (Ghosh et al., Alg. 1 Option I).

    Model k moves by the mean of the admissible received gradients (finite squared
    norm, as in :func:`defenses.threshold_clustering.admissible_points`) of the clients
    that picked it; a model whose clients sent none stays unchanged, so one NaN, Inf or
    overflowing row cannot stop a model's training."""

    name = "ifca"
    published_state = defense_state.IFCA

    flower = True

    flower_node_attacks = False
    summary = "IFCA: K models, each client picks its lowest-loss model, gradient averaging"
    reference = "Ghosh, Chung, Yin, Ramchandran 2020 (NeurIPS), IFCA, Alg. 1 Option I"
    Params = IFCAParams

    @classmethod
    def reported_loss_models(cls, params: AlgorithmParams, task_clusters: int) -> int | None:
        return params.clusters or task_clusters  # as __init__ picks K

    def __init__(self, federation: Federation, params: IFCAParams, initial_models: Tensor | None = None) -> None:
        super().__init__(federation, params, initial_models)
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)
        self._round = RoundBuffers()

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        batch = fed.sample_batch()
        self._choose(batch, round_index)
        grads, received = self._round.delivered_gradients(
            fed, self._round.gather(self.models, self.assignment), batch, round_index, self._defense_state()
        )
        means, sizes = self._cluster_means(received)
        active = sizes > 0
        self.optimizer.apply(self.models, means[active], rows=active.nonzero().squeeze(-1))
        return self._record(round_index, self.kept(grads), means)


@register
class IFCAModelAveraging(ClusterChoice):
    """IFCA with model averaging (Ghosh et al., Alg. 1 Option II).

    Each round every client picks its lowest-loss model on the round's batch and runs
    ``local_steps`` SGD steps from it (``x <- x - lr g_i(x)``; with ``heavy_ball > 0``
    local heavy-ball SGD whose buffer starts at zero every round): the first step on
    the round's batch, every further step on a fresh batch.  The clients send their
    local models through ``deliver`` (kind ``"model"``); model k becomes the mean of
    the admissible received models (finite squared norm, as in
    :func:`defenses.threshold_clustering.admissible_points`) of the clients that
    picked k.  A model nobody picked, or whose clients all sent inadmissible models,
    stays unchanged, so no NaN, Inf or overflowing row ever becomes a cluster model.

    With ``local_steps = 1`` this is Option I with plain SGD: the mean of
    ``x_k - lr g_i`` is ``x_k - lr mean g_i``.  The record's ``updates`` are the
    per-cluster pseudo-gradients ``(x_k^old - x_k^new) / lr`` (Option I's mean
    gradient when ``local_steps = 1``); ``gradients`` are the honest first-step
    gradients at the picked models.
    """

    name = "ifca_model_avg"
    published_state = defense_state.IFCA

    flower = True

    flower_node_attacks = False
    summary = "IFCA: K models, each client picks its lowest-loss model, local SGD, model averaging"
    reference = "Ghosh, Chung, Yin, Ramchandran 2020 (NeurIPS), IFCA, Alg. 1 Option II"
    Params = IFCAModelAveragingParams
    _local: LocalStart | None = None  # made on first use (checkpoints leave its buffers out)

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        batch = fed.sample_batch()
        self._choose(batch, round_index)
        if self._local is None:
            self._local = LocalStart()
        local = self._local.rows(self.models, self.assignment)  # a copy: one row per client
        optimizer = self._local.optimizer(self.params.lr, self.params.heavy_ball, local)
        first = run_local_steps(fed, local, batch, optimizer, self.params.local_steps, self._local.buffers)
        received = fed.deliver(local, round_index, "model", defense_state=self._defense_state())
        means, sizes = self._cluster_means(received)
        active = (sizes > 0) & admissible_points(means)
        previous = self.models.clone()
        self.models[active] = means[active]
        return self._record(round_index, self.kept(first), (previous - self.models) / self.params.lr)


def lowest_reported(reported: Tensor, previous: Tensor) -> Tensor:
    """``[N]``: the model of each row's lowest *finite* reported loss
    (``reported[N, K]``; NaN and +-Inf entries ignored), or ``previous`` for a row
    without a finite entry.  With finite reports it is ``reported.argmin(-1)``."""
    finite = torch.isfinite(reported)
    masked = torch.where(finite, reported, torch.full_like(reported, float("inf")))
    return torch.where(finite.any(-1), masked.argmin(dim=-1), previous.to(reported.device))
