"""Who counts in a cluster: the included clients, their clusters, and the fractions
``n_i``, ``delta_i = n_i / N`` and ``beta_i`` of Werner et al.'s Thm 3.1 (eq. 14) and
Thm 3.3-3.4 (eq. 23, 28).

The selection helpers here are shared by every estimator: they validate ``include``
and ``clusters`` and return indices, so that callers pick the included rows before any
arithmetic (an excluded Byzantine row may hold NaN or 1e38).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _describe(value: object) -> str:
    """``value`` for an error message: a tensor's dtype and shape, else its type."""
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def included_clients(include: Tensor | None, clients: int, device: torch.device | None = None) -> Tensor:
    """Indices ``[k]`` (long) of the clients selected by the boolean mask ``include[N]``;
    every client when ``include`` is None.  Raises ValueError for a mask of the wrong
    type or shape, or one that selects nobody."""
    if include is None:
        if clients < 1:
            raise ValueError("include: there are no clients to include")
        return torch.arange(clients, device=device)
    if not isinstance(include, Tensor) or include.dtype != torch.bool or tuple(include.shape) != (clients,):
        raise ValueError(f"include must be a boolean mask of shape [{clients}], got a {_describe(include)}")
    index = include.nonzero().squeeze(1)
    if index.numel() == 0:
        raise ValueError("include selects no client: at least one client must be included")
    return index.to(device) if device is not None else index


def cluster_labels(clusters: Tensor, clients: int) -> Tensor:
    """``clusters`` validated as an integer tensor of shape ``[clients]``."""
    integer = isinstance(clusters, Tensor) and not (
        clusters.dtype.is_floating_point or clusters.dtype.is_complex or clusters.dtype == torch.bool)
    if not integer or tuple(clusters.shape) != (clients,):
        raise ValueError(f"clusters must be an integer tensor of shape [{clients}], got a {_describe(clusters)}")
    return clusters.long()


def dense_groups(labels: Tensor) -> tuple[Tensor, Tensor]:
    """Relabel cluster ids as ``0..K-1``: returns ``(groups[k], values[K])`` with
    ``values[groups] == labels``."""
    values, groups = torch.unique(labels, sorted=True, return_inverse=True)
    return groups, values


def select_included(rows: Tensor, clusters: Tensor, include: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``rows[T, N, ...]`` restricted to the included clients (dimension 1, before any
    arithmetic), their clusters relabelled ``0..K-1``, the original cluster labels
    ``[K]`` and the included clients' indices ``[k]``."""
    clients = rows.shape[1]
    labels = cluster_labels(clusters, clients).to(rows.device)
    index = included_clients(include, clients, rows.device)
    groups, values = dense_groups(labels[index])
    return rows.index_select(1, index), groups, values, index


def federation_fractions(cluster_ids: Tensor, byzantine: Tensor) -> dict[str, Tensor]:
    """Per client (honest and Byzantine, ``N`` = all clients):

    * ``"n"``: honest clients in its cluster, ``n_i`` (long);
    * ``"delta"``: ``n_i / N``, the cluster fraction delta_i of Thm 3.1;
    * ``"beta"``: Byzantine clients / N, the same for every client (from client i's
      view every Byzantine client is a bad point, Sec. 3.1);
    * ``"byzantine_in_cluster"``: Byzantine clients placed in its cluster / N.

    Fractions are float64."""
    if not isinstance(byzantine, Tensor) or byzantine.dtype != torch.bool or byzantine.dim() != 1:
        raise ValueError(f"byzantine must be a 1-D boolean mask, got a {_describe(byzantine)}")
    clients = byzantine.numel()
    if clients == 0:
        raise ValueError("byzantine: the federation has no clients")
    labels = cluster_labels(cluster_ids, clients)
    groups, values = dense_groups(labels)
    byzantine = byzantine.to(labels.device)
    honest_counts = torch.bincount(groups[~byzantine], minlength=values.numel())
    byzantine_counts = torch.bincount(groups[byzantine], minlength=values.numel())
    honest_in_cluster = honest_counts[groups]
    total = float(clients)
    return {
        "n": honest_in_cluster,
        "delta": honest_in_cluster.to(torch.float64) / total,
        "beta": torch.full((clients,), byzantine.sum().item() / total, dtype=torch.float64, device=labels.device),
        "byzantine_in_cluster": byzantine_counts[groups].to(torch.float64) / total,
    }
