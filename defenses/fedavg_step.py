"""The FedAvg global model that Ditto and KNN-Per train next to their personal parts.

One shared model ``w`` updated by gradient averaging: every client's gradient at ``w``
passes through :meth:`~robust_pfl.engine.federation.Federation.deliver` and the server takes
their mean (the ``mean`` aggregator of ``global``: non-finite or overflowing rows are
dropped) and makes a heavy-ball step.  With the same seed, learning rate and batch
stream it evolves exactly like :class:`defenses.baselines.Global` with its default
aggregator.
"""

from __future__ import annotations

from torch import Tensor

from defenses.optimiser import HeavyBall
from defenses.aggregators import make_aggregator
from defenses.round_buffers import RoundBuffers
from robust_pfl.engine.data import Batch
from robust_pfl.engine.federation import Federation


class FedAvgModel:
    """The global model ``w`` (``model[1, d]``) and its server optimiser."""

    def __init__(self, federation: Federation, lr: float, heavy_ball: float) -> None:
        self.federation = federation
        self.aggregator = make_aggregator("mean")
        self.model = federation.init_params(1)
        self.optimizer = HeavyBall(lr, heavy_ball, self.model)
        self._round = RoundBuffers()

    def aggregate(self, messages: Tensor) -> Tensor:
        """The server's aggregate of ``messages[..., N, d]``, ``[..., 1, d]`` (also
        exposed to adaptive attacks as ``defense_state["aggregate"]``)."""
        return self.aggregator(messages).unsqueeze(-2)

    def step(self, round_index: int, batch: Batch) -> tuple[Tensor, Tensor]:
        """One FedAvg round on ``batch``: returns the honest gradients ``g_i(w)``
        ``[N, d]`` (before any attack) and the applied update ``[1, d]``."""
        fed = self.federation
        grads, received = self._round.delivered_gradients(
            fed, self.model.expand(fed.clients, -1), batch, round_index, {"aggregate": self.aggregate}
        )
        update = self.aggregate(received)
        self.optimizer.apply(self.model, update)
        return grads, update
