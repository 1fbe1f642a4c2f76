"""Stacked client data and seeded batch sampling (docs/design.md, "Layout").

Every client holds the same number of samples, so a federation's data is one tensor
``inputs[N, n, ...]`` with targets ``[N, n, ...]``.  A round's batch for all clients is
one seeded gather, never a loop over clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Batch:
    """One batch per client: ``inputs[N, b, ...]``, ``targets[N, b, ...]``."""

    inputs: Tensor
    targets: Tensor

    @property
    def clients(self) -> int:
        return self.inputs.shape[0]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.inputs.to(device), self.targets.to(device))

    def select(self, clients: Tensor) -> "Batch":
        """The batches of the given client indices only."""
        return Batch(self.inputs[clients], self.targets[clients])


@dataclass(frozen=True)
class ClientData(Batch):
    """All of every client's samples (a :class:`Batch` holding the full local sets)."""

    @property
    def samples_per_client(self) -> int:
        return self.inputs.shape[1]

    def sample(self, batch_size: int | None, generator: torch.Generator, out: Batch | None = None) -> Batch:
        """A batch of ``batch_size`` distinct samples per client, drawn without
        replacement within each client; ``None`` or ``>= n`` gives the full data.

        ``out``: a batch of the right shapes to gather into (the same values; a fresh
        gather page-faults, several times slower;
        benchmarks/README.md, "Kernel choices")."""
        n_clients, n = self.inputs.shape[:2]
        if batch_size is None or batch_size >= n:
            return Batch(self.inputs, self.targets)
        keys = torch.rand(n_clients, n, generator=generator, device=generator.device)
        index = keys.argsort(dim=1)[:, :batch_size].to(self.inputs.device)
        rows = torch.arange(n_clients, device=self.inputs.device).unsqueeze(1)
        if out is None:
            return Batch(self.inputs[rows, index], self.targets[rows, index])
        flat = (rows * n + index).reshape(-1)
        for source, target in ((self.inputs, out.inputs), (self.targets, out.targets)):
            torch.index_select(source.reshape(n_clients * n, *source.shape[2:]), 0, flat,
                               out=target.view(n_clients * batch_size, *source.shape[2:]))
        return out
