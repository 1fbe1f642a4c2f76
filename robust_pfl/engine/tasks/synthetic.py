"""Synthetic clustered linear regression (Werner et al. Sec. 4.1; the official
code's settings are in docs/official_code.md).

Client ``i`` in cluster ``k`` holds ``A_i`` in ``R^{n x d}`` with entries ``N(k, 1)``
(the official code uses the cluster index as the feature mean) and targets
``y_i = A_i x_k* (+ noise)``.  With ``n = 9 < d = 10`` every local problem is
under-determined.  ``x_k*`` has coordinates drawn from ``{0, 1}`` scaled by ``scale``
(official code, ``R = 100``) or ``N(0, scale^2)``.  Loss: ``0.5 * mean (a^T x - y)^2``,
no bias.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from robust_pfl.engine.data import ClientData
from robust_pfl.engine.objectives import linear_regression
from robust_pfl.engine.seeding import generator
from robust_pfl.engine.placement import ByzantinePlacement
from robust_pfl.engine.tasks.base import Task


@dataclass(frozen=True)
class SyntheticLinearRegression:
    """Builder of the synthetic task (all fields validated by the config layer)."""

    clusters: int = 4
    clients_per_cluster: int = 4
    dim: int = 10
    samples_per_client: int = 9
    validation_samples: int = 50
    test_samples: int = 50
    scale: float = 100.0
    optimum: Literal["binary", "gaussian"] = "binary"
    noise: float = 0.0

    def build(
        self,
        seed: int,
        byzantine_total: int = 0,
        byzantine_per_cluster: int = 0,
        dtype: torch.dtype = torch.float32,
        placement: ByzantinePlacement | None = None,
    ) -> Task:
        """The task for ``seed``; Byzantine clients from ``placement`` (or the
        ``byzantine_total``/``byzantine_per_cluster`` shorthand)."""
        placement = placement or ByzantinePlacement(byzantine_total, byzantine_per_cluster)
        ids, byzantine = placement.place(self.clusters, self.clients_per_cluster)
        g = generator(seed, "synthetic-data")
        if self.optimum == "binary":
            optima = torch.randint(0, 2, (self.clusters, self.dim), generator=g).double() * self.scale
        else:
            optima = torch.randn(self.clusters, self.dim, generator=g, dtype=torch.float64) * self.scale

        def draw(samples: int) -> ClientData:
            means = ids.double().view(-1, 1, 1)
            a = torch.randn(ids.numel(), samples, self.dim, generator=g, dtype=torch.float64) + means
            y = torch.einsum("nsd,nd->ns", a, optima[ids])
            y = y + self.noise * torch.randn(y.shape, generator=g, dtype=torch.float64)
            return ClientData(a.to(dtype), y.to(dtype))

        objective = linear_regression(self.dim)
        return Task(
            objective=objective,
            train=draw(self.samples_per_client),
            validation=draw(self.validation_samples),
            test=draw(self.test_samples),
            cluster_ids=ids,
            byzantine=byzantine,
            optima=optima.to(dtype),
        )
