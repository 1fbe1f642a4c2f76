"""Where the Byzantine clients sit: how many join which hidden cluster.

Werner et al.'s text places "50 Byzantine clients per cluster"; their official Fig. 6
code adds 50 in total.  Both (and fractions, for attack x fraction grids) are one
:class:`ByzantinePlacement`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ByzantinePlacement:
    """Byzantine clients added to ``honest_per_cluster`` honest clients per cluster.

    Attributes:
        total: Byzantine clients spread round-robin over ``clusters`` (official code).
        per_cluster: Byzantine clients in every cluster (paper text).
        fraction: Byzantine share of *all* clients, spread like ``total``:
            ``round(fraction * H / (1 - fraction))`` more clients for ``H`` honest ones.
        fraction_per_cluster: Byzantine share of every cluster's clients.
        clusters: the clusters that receive the ``total``/``fraction`` clients
            (``None``: all of them).
    """

    total: int = 0
    per_cluster: int = 0
    fraction: float = 0.0
    fraction_per_cluster: float = 0.0
    clusters: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("total", "per_cluster"):
            if getattr(self, name) < 0:
                raise ValueError(f"byzantine.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("fraction", "fraction_per_cluster"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"byzantine.{name} must be in [0, 1), got {value}")
        if self.clusters is not None and (len(self.clusters) == 0 or min(self.clusters) < 0):
            raise ValueError(f"byzantine.clusters must be a non-empty list of cluster indices, got {self.clusters}")

    def counts(self, clusters: int, honest_per_cluster: int) -> Tensor:
        """Byzantine clients per cluster, ``[clusters]`` (int64)."""
        shared, each = self._shared_and_each(clusters, honest_per_cluster)
        targets = list(range(clusters)) if self.clusters is None else list(self.clusters)
        counts = torch.full((clusters,), each, dtype=torch.long)
        spread = torch.tensor(targets, dtype=torch.long)[torch.arange(shared) % len(targets)]
        return counts + torch.bincount(spread, minlength=clusters)

    def total_count(self, clusters: int, honest_per_cluster: int) -> int:
        """The sum of :meth:`counts`, by arithmetic: config validation asks it before
        any size is checked, so it must not allocate one entry per cluster."""
        shared, each = self._shared_and_each(clusters, honest_per_cluster)
        return shared + each * clusters

    def _shared_and_each(self, clusters: int, honest_per_cluster: int) -> tuple[int, int]:
        """Byzantine clients spread over the target clusters, and those every cluster
        gets; refuses a target cluster outside ``[0, clusters)``."""
        if self.clusters is not None and max(self.clusters) >= clusters:
            raise ValueError(f"byzantine.clusters must be cluster indices in [0, {clusters}), got {list(self.clusters)}")
        shared = self.total + _share(self.fraction, clusters * honest_per_cluster)
        return shared, self.per_cluster + _share(self.fraction_per_cluster, honest_per_cluster)

    def place(self, clusters: int, honest_per_cluster: int) -> tuple[Tensor, Tensor]:
        """Cluster ids ``[N]`` and Byzantine mask ``[N]``: honest clients first,
        ``honest_per_cluster`` per cluster in cluster order, then the Byzantine ones
        in cluster order."""
        for name, value in (("clusters", clusters), ("honest_per_cluster", honest_per_cluster)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        honest = torch.arange(clusters).repeat_interleave(honest_per_cluster)
        malicious = torch.arange(clusters).repeat_interleave(self.counts(clusters, honest_per_cluster))
        byzantine = torch.zeros(honest.numel() + malicious.numel(), dtype=torch.bool)
        byzantine[honest.numel() :] = True
        return torch.cat([honest, malicious]), byzantine


def _share(fraction: float, honest: int) -> int:
    """Byzantine count making ``fraction`` of ``honest + count`` clients Byzantine."""
    return int(round(fraction * honest / (1.0 - fraction)))
