"""KNN-Per (Marfoq, Neglia, Vidal, Kameni, Zhang, ICML 2022): a FedAvg global model
whose predictions each client mixes with a k-nearest-neighbour vote over its own
training data in the global model's feature space."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import ConfigDict, Field
from torch import Tensor

from defenses.base import Algorithm, AlgorithmParams, register
from defenses.fedavg_step import FedAvgModel
from robust_pfl.engine import defense_state
from robust_pfl.engine.data import Batch
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import RoundRecord

# Entries of one [N, chunk, n] distance block computed at once (a loop over query
# chunks, never over clients).
_DISTANCE_BUDGET = 1 << 24


class KNNPerParams(AlgorithmParams):
    model_config = ConfigDict(populate_by_name=True)

    lam: float = Field(
        0.5,
        ge=0,
        le=1,
        alias="lambda",
        description="lambda: weight of the k-NN distribution in the mixture (0: the global model alone)",
    )
    k: int = Field(10, ge=1, description="neighbours from the client's own training set (capped at its size)")
    weighting: Literal["uniform", "distance"] = Field(
        "uniform", description="neighbour votes: uniform, or proportional to exp(-distance / temperature)"
    )
    temperature: float = Field(1.0, gt=0, description="temperature of the distance weighting")


@register
class KNNPer(Algorithm):
    """KNN-Per (Marfoq et al. 2022, Sec. 3, eq. 5-6).

    Training is FedAvg with gradient averaging (exactly ``global`` with the ``mean``
    aggregator, the same helper as Ditto's global model).  At prediction time client i
    builds a datastore of its own training set in the global model's feature space
    (penultimate activations; the inputs for a network without hidden layer) and
    predicts ``p_i(y|x) = lambda p_knn,i(y|x) + (1 - lambda) softmax(h_w(x))_y``, where
    ``p_knn,i`` is the (uniform or ``exp(-dist / temperature)``-weighted) vote of the
    ``k`` nearest training points of client i.  :meth:`predict_log_proba` returns its
    log; :meth:`client_models` is ``w`` for every client.  Classification only.
    """

    name = "knn_per"
    published_state = defense_state.AGGREGATE
    summary = "KNN-Per: FedAvg model mixed with a k-NN vote over the client's own data (classification)"
    reference = "Marfoq, Neglia, Vidal, Kameni, Zhang 2022 (ICML), Personalized FL through local memorization"
    Params = KNNPerParams
    requires_classification = True  # the conformance suite must give it a classification federation

    def __init__(self, federation: Federation, params: KNNPerParams) -> None:
        if federation.num_classes is None:
            raise ValueError(
                "knn_per needs a classification task (federation.num_classes is None: a regression task)"
            )
        super().__init__(federation, params)
        self.fedavg = FedAvgModel(federation, params.lr, params.heavy_ball)
        self._datastore: Tensor | None = None  # training features under the current w

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        grads, update = self.fedavg.step(round_index, fed.sample_batch())
        self._datastore = None
        return RoundRecord(round_index, gradients=self.kept(grads), updates=update.expand(fed.clients, -1))

    def client_models(self) -> Tensor:
        return self.fedavg.model.expand(self.federation.clients, -1)

    # -- prediction ------------------------------------------------------------------
    def predict_log_proba(self, inputs: Tensor) -> Tensor:
        """``log p_i(y | x)`` of client i's queries ``inputs[N, b, ...]``: ``[N, b, C]``,
        clamped below at ``log(tiny)`` so no entry is ``-inf``."""
        fed, lam = self.federation, self.params.lam
        models = self.client_models()
        queries = Batch(inputs, inputs.new_zeros(inputs.shape[:2]))
        log_global = torch.log_softmax(fed.objective.paired_outputs(models, queries), dim=-1)
        if lam == 0:
            return log_global
        log_knn = self.knn_proba(fed.objective.paired_features(models, queries)).log()
        rest = math.log1p(-lam) if lam < 1 else -math.inf
        mixed = torch.logaddexp(log_knn + math.log(lam), log_global + rest)
        return mixed.clamp_min(math.log(torch.finfo(mixed.dtype).tiny))

    def knn_proba(self, query_features: Tensor) -> Tensor:
        """``p_knn,i(y | x)`` ``[N, b, C]`` of queries ``query_features[N, b, F]`` from
        the ``k`` nearest points of client i's training set (batched ``cdist``)."""
        fed, params = self.federation, self.params
        store = self.datastore()
        clients, b = query_features.shape[:2]
        n = store.shape[1]
        k = min(params.k, n)
        labels = fed.train.targets.long()  # [N, n]
        chunk = max(1, _DISTANCE_BUDGET // max(1, clients * n))
        parts = []
        for start in range(0, b, chunk):
            block = query_features[:, start : start + chunk]
            distances, index = torch.cdist(block, store).topk(k, dim=-1, largest=False)  # [N, c, k]
            votes = torch.gather(labels.unsqueeze(1).expand(-1, block.shape[1], -1), 2, index)
            if params.weighting == "uniform":
                weights = torch.full_like(distances, 1.0 / k)
            else:
                weights = torch.softmax(-distances / params.temperature, dim=-1)  # exp(-d/T), normalised
            proba = distances.new_zeros(clients, block.shape[1], fed.num_classes)
            parts.append(proba.scatter_add_(-1, votes, weights))
        return torch.cat(parts, dim=1)

    def datastore(self) -> Tensor:
        """Every client's training features under the current global model, ``[N, n, F]``
        (computed once per model)."""
        if self._datastore is None:
            fed = self.federation
            self._datastore = fed.objective.paired_features(self.client_models(), fed.train)
        return self._datastore
