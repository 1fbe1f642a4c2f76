"""IFCA (Ghosh et al. 2020), gradient-averaging variant (Option I).

K cluster models.  Each round every client evaluates all K models on its batch and
picks the one with the lowest loss; the server averages the gradients of the clients
that picked model k and updates model k.  A client's personalised model is the model
it picked.  Werner et al. Sec. 2.1 (Fig. 1b) shows it can stay stuck forever.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from defenses.base import Algorithm, AlgorithmParams, HeavyBall, group_mean, register
from robust_pfl.federation import Federation
from robust_pfl.types import RoundRecord


class IFCAParams(AlgorithmParams):
    clusters: int | None = Field(None, ge=1, description="K models (default: the task's K)")


@register
class IFCA(Algorithm):
    """IFCA with gradient averaging (Ghosh et al., Alg. 1 Option I)."""

    name = "ifca"
    summary = "IFCA: K models, each client picks its lowest-loss model, gradient averaging"
    Params = IFCAParams
    forms_clusters = True

    def __init__(self, federation: Federation, params: IFCAParams, initial_models: Tensor | None = None) -> None:
        super().__init__(federation, params)
        k = params.clusters or federation.clusters
        if initial_models is None:
            initial_models = federation.init_params(k, stream="ifca-init")
        self.models = initial_models.to(federation.device, federation.dtype).clone()
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)
        self.assignment = torch.zeros(federation.clients, dtype=torch.long, device=federation.device)

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        batch = fed.sample_batch()
        self.assignment = fed.cross_losses(self.models, batch).argmin(dim=0)
        grads = fed.gradients(self.models[self.assignment], batch)
        k = self.models.shape[0]

        def aggregate(messages: Tensor) -> Tensor:
            return group_mean(messages, self.assignment, k)[0][..., self.assignment, :]

        state = {"models": self.models, "assignment": self.assignment, "aggregate": aggregate}
        received = fed.deliver(grads, round_index, "gradient", defense_state=state)
        means, sizes = group_mean(received, self.assignment, k)
        active = sizes > 0
        self.optimizer.apply(self.models, means[active], rows=active.nonzero().squeeze(-1))
        return RoundRecord(
            round_index,
            gradients=grads,
            updates=means[self.assignment],
            centres=self.models.clone(),
            assignment=self.assignment,
        )

    def client_models(self) -> Tensor:
        return self.models[self.assignment]
