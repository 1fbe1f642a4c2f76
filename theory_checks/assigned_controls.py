"""The clustering controls of a statement about a clustering algorithm: the algorithm's
own momentum step (Werner et al., Alg. 4; the workshop paper's Alg. 2 and 3) with its
clustering replaced by an assignment that ignores the clusters.

A bound that a clustering algorithm meets is evidence about clustering only if the
same step without the clustering violates it.  Three assignments replace Alg. 3's
threshold clustering, each run on the same instance, seeds and learning rate:

* **no clustering**: one group of every client (FedAvg with the method's momentum);
* **a wrong fixed partition**: ``K`` groups, each holding an equal share of every
  cluster (the partition farthest from the true one), fixed for the run;
* **random assignment**: every client drawn into one of ``K`` groups uniformly at
  random, afresh each round.

Each client keeps its momentum ``m_i = (1 - alpha) m_i + alpha g_i`` (``alpha`` of
the first round may differ: the workshop's proofs start at the gradient), each group
averages its clients' momenta, and every client steps ``x_i -= eta * mean`` of its
group: Alg. 4's update with the mean of an assigned group in place of the centre that
Threshold-Clustering finds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import Tensor

from defenses.clustering_algorithms import round_alpha
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import RoundRecord

Assignment = Literal["none", "wrong", "random"]
#: Each assignment's description in reports.
ASSIGNMENTS: dict[Assignment, str] = {
    "none": "no clustering (one model for all honest clients)",
    "wrong": "a wrong fixed partition (each group an equal share of every cluster)",
    "random": "a random assignment each round",
}
# round index -> [N] group of every client
Schedule = Callable[[int], Tensor]


def schedule(assignment: Assignment, clusters: Tensor, groups: int, generator: torch.Generator) -> Schedule:
    """The ``[N]`` group of every client at each round under ``assignment``
    (``clusters[N]``: the true clusters; ``groups``: ``K``)."""
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    count = clusters.numel()
    if assignment == "none":
        fixed = torch.zeros(count, dtype=torch.long)
        return lambda round_index: fixed
    if assignment == "wrong":
        # the j-th client of every cluster goes to group j mod K: each group gets an
        # equal share of every cluster
        rank = torch.empty(count, dtype=torch.long)
        for label in clusters.unique():
            members = (clusters == label).nonzero().flatten()
            rank[members] = torch.arange(members.numel())
        fixed = rank % groups
        return lambda round_index: fixed
    if assignment == "random":
        return lambda round_index: torch.randint(groups, (count,), generator=generator)
    raise ValueError(f"assignment must be one of {sorted(ASSIGNMENTS)}, got {assignment!r}")


@dataclass
class AssignedMomentum:
    """Alg. 4's momentum step with the clients grouped by ``schedule`` instead of by
    Threshold-Clustering (see the module docstring).  Steps like a defense
    (:class:`robust_pfl.engine.rounds.Stepping`); ``client_models()`` is ``[N, d]``."""

    federation: Federation
    learning_rate: float
    alpha: float
    schedule: Schedule
    groups: int
    first_alpha: float | None = None
    sends_momenta: bool = True
    snapshot_records: bool = False

    def __post_init__(self) -> None:
        clients = self.federation.clients
        self.models = self.federation.init_params(1).expand(clients, -1).clone()
        self.momenta = torch.zeros_like(self.models)

    def step(self, round_index: int) -> RoundRecord:
        alpha = round_alpha(self.alpha, self.first_alpha, round_index)
        batch = self.federation.sample_batch(reuse=True)
        self.federation.gradients(self.models, batch, out=self.momenta, blend=alpha)  # lerp(m, g, alpha)
        groups = self.schedule(round_index).to(self.models.device)
        members = torch.nn.functional.one_hot(groups, self.groups).to(self.momenta.dtype)  # [N, K]
        means = (members.T @ self.momenta) / members.sum(0).clamp_min(1.0).unsqueeze(-1)  # [K, d]
        self.models -= self.learning_rate * means[groups]
        return RoundRecord(round_index, momenta=self.momenta, assignment=groups)

    def client_models(self) -> Tensor:
        return self.models
