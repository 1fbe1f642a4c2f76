"""Batched agglomerative clustering on precomputed distance matrices, shared by the
defenses that cluster their senders (ClippedClustering, FLAME in
:mod:`defenses.aggregators`) and the attacks built against them
(:mod:`attacks.defense_aware`), which may not import :mod:`defenses`: one copy of the
rule, so an attack's prediction of the defense's clusters cannot drift from it."""

from __future__ import annotations

import math

import torch
from torch import Tensor

F64 = torch.float64


def absent_pairs(present: Tensor) -> Tensor:
    """``[..., N, N]``: True on the diagonal and wherever a row or column is absent."""
    n = present.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=present.device)
    return eye | ~present.unsqueeze(-1) | ~present.unsqueeze(-2)


def agglomerate(distance: Tensor, present: Tensor, linkage: str, clusters: int = 2,
                need: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Batched agglomerative clustering of the ``present`` rows on a precomputed
    ``distance[..., N, N]`` (``linkage``: ``"average"`` (UPGMA) or ``"single"``,
    Lance-Williams updates).  Each step merges, in every unfinished problem, the
    closest pair of clusters (ties: the lowest flat index ``i * N + j``); the merged
    cluster keeps the smaller representative index (its lowest row).  A problem is
    finished when it has at most ``clusters`` clusters, or, with ``need[...]``, as
    soon as one cluster holds at least ``need`` rows.

    Returns ``(labels[..., N], sizes[..., N])``: each present row's representative
    (``-1`` for absent rows) and each representative's cluster size (0 elsewhere).
    At most ``N - 1`` merge steps (a loop over steps, batched over problems), each
    ``O(N^2)`` per problem: ``O(N^3)`` in all, meant for the tens to hundreds of
    senders of a federation."""
    if linkage not in ("average", "single"):
        raise ValueError(f"linkage must be 'average' or 'single', got {linkage!r}")
    n = distance.shape[-1]
    index = torch.arange(n, device=distance.device)
    d = torch.where(absent_pairs(present), torch.full_like(distance, math.inf), distance.to(F64))
    labels = torch.where(present, index, -1)
    sizes = present.to(F64)
    for _ in range(max(n - 1, 0)):
        if need is None:
            done = (sizes > 0).sum(-1) <= clusters
        else:
            done = sizes.amax(-1) >= need.to(F64)
        if bool(done.all()):
            break
        best, flat = d.flatten(-2).min(-1)
        go = ~done & torch.isfinite(best)
        a, b = flat // n, flat % n
        i, j = torch.minimum(a, b), torch.maximum(a, b)
        row_i = d.gather(-2, i[..., None, None].expand(*i.shape, 1, n)).squeeze(-2)
        row_j = d.gather(-2, j[..., None, None].expand(*j.shape, 1, n)).squeeze(-2)
        s_i, s_j = sizes.gather(-1, i.unsqueeze(-1)), sizes.gather(-1, j.unsqueeze(-1))
        if linkage == "average":
            new = (s_i * row_i + s_j * row_j) / (s_i + s_j).clamp_min(1)
        else:
            new = torch.minimum(row_i, row_j)
        is_i = (index == i.unsqueeze(-1)) & go.unsqueeze(-1)
        is_j = (index == j.unsqueeze(-1)) & go.unsqueeze(-1)
        new = torch.where((index == i.unsqueeze(-1)) | (index == j.unsqueeze(-1)), math.inf, new)  # self and absorbed
        d = torch.where(is_i.unsqueeze(-1), new.unsqueeze(-2), d)
        d = torch.where(is_i.unsqueeze(-2), new.unsqueeze(-1), d)
        d = torch.where(is_j.unsqueeze(-1) | is_j.unsqueeze(-2), math.inf, d)
        sizes = torch.where(is_i, s_i + s_j, torch.where(is_j, torch.zeros_like(sizes), sizes))
        labels = torch.where(go.unsqueeze(-1) & (labels == j.unsqueeze(-1)), i.unsqueeze(-1), labels)
    return labels, sizes


def largest_cluster(labels: Tensor, sizes: Tensor) -> Tensor:
    """``[..., N]`` mask of the rows in the largest cluster (ties: the cluster with the
    lowest representative, i.e. holding the lowest-index row)."""
    biggest = sizes.argmax(-1, keepdim=True)  # first maximum
    return labels == biggest
