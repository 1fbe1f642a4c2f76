"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): a FedAvg global model plus one personal
model per client pulled towards it."""

from __future__ import annotations

import torch
from pydantic import ConfigDict, Field
from torch import Tensor

from defenses.base import Algorithm, AlgorithmParams, register
from defenses.fedavg_step import FedAvgModel
from defenses.optimiser import HeavyBall
from defenses.round_buffers import RoundBuffers
from robust_pfl.engine import defense_state
from robust_pfl.engine.data import Batch
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import RoundRecord


class DittoParams(AlgorithmParams):
    model_config = ConfigDict(populate_by_name=True)

    lam: float = Field(
        1.0,
        ge=0,
        alias="lambda",
        description="lambda: weight of the proximal term (lambda/2)||v_i - w||^2 (0: Local, "
        "large: stay at the global model; plain SGD is stable for lr * lambda < 2)",
    )
    personal_steps: int = Field(1, ge=1, description="SGD steps on the personal model per round")
    personal_lr: float | None = Field(None, gt=0, description="step size of the personal model (default: lr)")


@register
class Ditto(Algorithm):
    """Ditto (Li et al. 2021, Alg. 1; objective eq. 2).

    The global model ``w`` is trained by FedAvg with gradient averaging (every client's
    ``g_i(w)`` through ``deliver``, their mean, a heavy-ball step: exactly ``global``
    with the ``mean`` aggregator).  Every client also keeps a personal model ``v_i``
    minimising ``f_i(v) + lambda/2 ||v - w||^2``: each round it makes
    ``personal_steps`` steps ``v_i -= personal_lr * (g_i(v_i) + lambda (v_i - w))`` with
    the ``w`` it received this round (before the server's update).  The first
    personal step uses the round's batch (the one ``g_i(w)`` is computed on), every
    further step a fresh batch, so with ``personal_steps = 1`` the batch stream is that
    of ``local`` and ``global``: ``lambda = 0`` reproduces ``local`` on ``v`` exactly,
    and ``w`` is always ``global``'s model.  Personal models never leave the client
    (no message, nothing to attack); the personalised model of client i is ``v_i``.

    The record's ``gradients`` are the honest ``g_i(w)``; ``updates`` the personal
    update ``g_i(v_i) + lambda (v_i - w)`` of the last personal step; ``extras`` hold
    the global update (``"global_update"``, ``[d]``).
    """

    name = "ditto"
    published_state = defense_state.AGGREGATE

    flower = True

    flower_node_attacks = True
    summary = "Ditto: FedAvg global model plus personal models with penalty (lambda/2)||v_i - w||^2"
    reference = "Li, Hu, Beirami, Smith 2021 (ICML), Ditto: fair and robust federated learning, Alg. 1"
    Params = DittoParams

    # personal-update buffers, made on first use (checkpoints leave their contents out)
    _round: RoundBuffers | None = None

    def __init__(self, federation: Federation, params: DittoParams) -> None:
        super().__init__(federation, params)
        self.fedavg = FedAvgModel(federation, params.lr, params.heavy_ball)
        self.models = self.fedavg.model.expand(federation.clients, -1).clone()
        self.personal = HeavyBall(params.personal_lr or params.lr, params.heavy_ball, self.models)

    def personal_update(self, global_model: Tensor, batch: Batch) -> Tensor:
        """``g_i(v_i) + lambda (v_i - w)`` for every client: the gradient of
        ``f_i(v) + lambda/2 ||v - w||^2`` at ``v_i`` (eq. 2), ``[N, d]``."""
        if self._round is None:
            self._round = RoundBuffers()
        shape = tuple(self.models.shape)
        grads = self.federation.gradients(self.models, batch, out=self._round.scratch("gradients", shape, self.models))
        difference = torch.sub(self.models, global_model, out=self._round.scratch("difference", shape, self.models))
        return grads.add_(difference, alpha=self.params.lam)

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        batch = fed.sample_batch()
        received = self.fedavg.model.clone()  # w^t, as the clients received it
        update = self.personal_update(received, batch)
        self.personal.apply(self.models, update)
        for _ in range(self.params.personal_steps - 1):
            update = self.personal_update(received, fed.sample_batch())
            self.personal.apply(self.models, update)
        grads, global_update = self.fedavg.step(round_index, batch)
        return RoundRecord(
            round_index, gradients=self.kept(grads), updates=self.kept(update), extras={"global_update": global_update[0]}
        )

    def global_model(self) -> Tensor:
        """The global model ``w``, ``[d]``."""
        return self.fedavg.model[0]

    def client_models(self) -> Tensor:
        return self.models
