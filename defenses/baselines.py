"""Reference baselines of Werner et al. Sec. 4: Local, Global (FedAvg) and GroundTruth
(oracle clusters)."""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from defenses.base import Algorithm, AlgorithmParams, HeavyBall, group_mean, register
from robust_pfl.federation import Federation
from robust_pfl.types import RoundRecord


@register
class Local(Algorithm):
    """Every client runs SGD on its own data alone: ``x_i -= eta * g_i(x_i)``."""

    name = "local"
    summary = "each client trains alone on its own data"

    def __init__(self, federation: Federation, params: AlgorithmParams) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).expand(federation.clients, -1).clone()
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)

    def step(self, round_index: int) -> RoundRecord:
        grads = self.federation.gradients(self.models, self.federation.sample_batch())
        self.optimizer.apply(self.models, grads)
        return RoundRecord(round_index, gradients=grads, updates=grads)

    def client_models(self) -> Tensor:
        return self.models


@register
class Global(Algorithm):
    """FedAvg with gradient averaging: one shared model, ``x -= eta * mean_j g_j(x)``
    over all received gradients (Byzantine ones included: this is the undefended
    baseline of Fig. 6)."""

    name = "global"
    summary = "FedAvg: one shared model, mean of all received gradients"

    def __init__(self, federation: Federation, params: AlgorithmParams) -> None:
        super().__init__(federation, params)
        self.model = federation.init_params(1)
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.model)

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        shared = self.model.expand(fed.clients, -1)
        grads = fed.gradients(shared, fed.sample_batch())
        received = fed.deliver(grads, round_index, "gradient")
        update = received.mean(dim=0, keepdim=True)
        self.optimizer.apply(self.model, update)
        return RoundRecord(round_index, gradients=grads, updates=update.expand(fed.clients, -1))

    def client_models(self) -> Tensor:
        return self.model.expand(self.federation.clients, -1)


class GroundTruthParams(AlgorithmParams):
    exclude_byzantine: bool = Field(
        True, description="the oracle also knows who is Byzantine and leaves them out"
    )


@register
class GroundTruth(Algorithm):
    """Oracle clusters: one model per true cluster, updated with the mean gradient of
    that cluster's clients (GT in Werner et al. Fig. 3 and Table 1)."""

    name = "ground_truth"
    summary = "oracle clusters: FedAvg within each true cluster"
    Params = GroundTruthParams
    forms_clusters = True

    def __init__(self, federation: Federation, params: GroundTruthParams) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).expand(federation.clusters, -1).clone()
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        at_own_cluster = self.models[fed.cluster_ids]
        grads = fed.gradients(at_own_cluster, fed.sample_batch())
        received = fed.deliver(grads, round_index, "gradient")
        include = fed.honest if self.params.exclude_byzantine else None
        means, sizes = group_mean(received, fed.cluster_ids, fed.clusters, include)
        active = sizes > 0
        self.optimizer.apply(self.models, means[active], rows=active.nonzero().squeeze(-1))
        return RoundRecord(
            round_index, gradients=grads, updates=means[fed.cluster_ids], assignment=fed.cluster_ids
        )

    def client_models(self) -> Tensor:
        return self.models[self.federation.cluster_ids]
