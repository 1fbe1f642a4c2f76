"""What a task hands the federation: objective, stacked data, hidden clusters."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from robust_pfl.data import ClientData
from robust_pfl.objectives import Objective


@dataclass
class Task:
    """A clustered learning task.

    Attributes:
        objective: every client's loss.
        train: training data ``[N, n, ...]`` (Byzantine clients hold data too: an
            attacker may use its honest gradient, e.g. bit flip).
        validation: held-out data per client from the same distribution (for
            hyper-parameter selection; never the reported test metric).
        test: held-out data per client for the reported metrics.
        cluster_ids: ``[N]`` hidden cluster of each client.
        byzantine: ``[N]`` Byzantine mask.
        optima: ``[K, d]`` each cluster's minimiser, where known (synthetic tasks).
    """

    objective: Objective
    train: ClientData
    validation: ClientData
    test: ClientData
    cluster_ids: Tensor
    byzantine: Tensor
    optima: Tensor | None = None

    def to(self, device: torch.device | str) -> "Task":
        """The same task with every tensor on ``device``."""

        def move(data: ClientData) -> ClientData:
            return ClientData(data.inputs.to(device), data.targets.to(device))

        return Task(
            self.objective,
            move(self.train),
            move(self.validation),
            move(self.test),
            self.cluster_ids.to(device),
            self.byzantine.to(device),
            None if self.optima is None else self.optima.to(device),
        )

    def evaluate(self, models: Tensor) -> dict[str, Tensor]:
        """Per-client metrics ``{name: [N]}`` of personalised ``models[N, d]``."""
        metrics = {
            "train_loss": self.objective.paired_losses(models, self.train),
            "validation_loss": self.objective.paired_losses(models, self.validation),
            "test_loss": self.objective.paired_losses(models, self.test),
        }
        if self.optima is not None:
            target = self.optima.to(models)[self.cluster_ids]
            metrics["param_error"] = (models - target).pow(2).sum(-1)
        return metrics


def place_clients(
    clusters: int, honest_per_cluster: int, byzantine_total: int = 0, byzantine_per_cluster: int = 0
) -> tuple[Tensor, Tensor]:
    """Cluster ids and Byzantine mask for honest clients plus Byzantine ones.

    Honest clients come first, ``honest_per_cluster`` per cluster in cluster order;
    then ``byzantine_per_cluster`` Byzantine clients in every cluster ("50 Byzantine per
    cluster", the paper's text), then ``byzantine_total`` more spread round-robin over
    the clusters ("50 in total", the official code).
    """
    for name, value in (("clusters", clusters), ("honest_per_cluster", honest_per_cluster)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    for name, value in (("byzantine.total", byzantine_total), ("byzantine.per_cluster", byzantine_per_cluster)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    honest = torch.arange(clusters).repeat_interleave(honest_per_cluster)
    per_cluster = torch.arange(clusters).repeat_interleave(byzantine_per_cluster)
    spread = torch.arange(byzantine_total) % clusters
    ids = torch.cat([honest, per_cluster, spread])
    byzantine = torch.zeros(ids.numel(), dtype=torch.bool)
    byzantine[honest.numel() :] = True
    return ids, byzantine
