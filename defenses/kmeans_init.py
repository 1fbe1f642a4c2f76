"""Seeded k-means++ seeding (Arthur & Vassilvitskii 2007), used to initialise the
centres of Momentum-/Myopic-Clustering (the workshop version's PFL-TC initialises with
k-means++), and the k-means that CGPFL's server and CLoVE's embeddings use.
Inadmissible points (non-finite) are never chosen and never clustered."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from defenses.primitives import group_mean
from robust_pfl.engine.rows import admissible_points, euclidean_distances, gram_squared_distances
from defenses.row_reads import scratch


def kmeans_plus_plus(points: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """``k`` initial centres ``[k, d]`` chosen among the admissible rows of ``points``.

    D^2 sampling; distances are computed in float64 and capped so that huge (but
    finite) rows cannot produce infinite weights.  Loops over ``k`` centres, and over
    cache-sized blocks of rows in :func:`_squared_distances`.
    """
    admissible = admissible_points(points)
    if not bool(admissible.any()):
        return torch.zeros(k, points.shape[-1], dtype=points.dtype, device=points.device)
    rows = None if bool(admissible.all()) else admissible.nonzero().squeeze(-1)
    return _seed(points, rows, k, generator)


def _seed(points: Tensor, rows: Tensor | None, k: int, generator: torch.Generator) -> Tensor:
    """:func:`kmeans_plus_plus` on the rows ``rows`` of ``points`` (all when ``None``),
    every one of them admissible."""
    count = points.shape[0] if rows is None else rows.numel()
    distances = _distances_to(points, rows)

    def candidate(index: int) -> Tensor:
        return points[index if rows is None else int(rows[index])].double()

    first = torch.randint(count, (1,), generator=generator, device=generator.device)
    chosen = [candidate(first.item())]
    closest = distances(chosen[0])
    for _ in range(1, k):
        weights = torch.nan_to_num(closest, posinf=1e300).clamp(0, 1e300)
        total = weights.sum()
        if float(total) <= 0:
            index = torch.randint(count, (1,), generator=generator, device=generator.device).item()
        else:
            index = torch.multinomial(weights / total, 1, generator=generator).item()
        chosen.append(candidate(index))
        closest = torch.minimum(closest, distances(chosen[-1]))
    return torch.stack(chosen).to(points.dtype)


# Rows per block of :func:`_squared_distances`: about 8 MB of float64, kept in cache.
_BLOCK_BYTES = 8 << 20


def _distances_to(points: Tensor, rows: Tensor | None) -> Callable[[Tensor], Tensor]:
    """``centre -> ||x - centre||^2`` (float64) over the rows ``rows`` of ``points``.
    Rows that fit in one block are converted to float64 once, for every centre (the
    values are the one-block values of :func:`_squared_distances`); more go block by
    block, never copied whole."""
    count = points.shape[0] if rows is None else rows.numel()
    if count < 2 or count > _block_rows(points.shape[-1]):
        return lambda centre: _squared_distances(points, rows, centre)
    wide = (points if rows is None else points.index_select(0, rows)).double()
    return lambda centre: (wide - centre).pow_(2).sum(-1)


def _block_rows(dim: int) -> int:
    return max(2, _BLOCK_BYTES // (8 * max(dim, 1)))


def _squared_distances(points: Tensor, rows: Tensor | None, centre: Tensor) -> Tensor:
    """``||x - centre||^2`` in float64 for the rows ``rows`` of ``points[N, d]`` (all
    when ``None``): each block of rows converted to float64 in one reused buffer, so
    neither a float64 copy of all points nor a fresh ``[N, d]`` difference is made.
    The values are those of ``(points[rows].double() - centre).pow(2).sum(-1)``."""
    count = points.shape[0] if rows is None else rows.numel()
    dim = points.shape[-1]
    step = _block_rows(dim)
    out = torch.empty(count, dtype=torch.float64, device=points.device)
    buffer = scratch("kmeans++", (min(step, count), dim), centre)
    for start in range(0, count, step):
        stop = min(start + step, count)
        # never a one-row block (unless there is one row): torch sums a lone row split
        # over threads, in another order than a row of a larger block; the overlapping
        # row gets the same value twice
        start = min(start, max(stop - 2, 0))
        part = points[start:stop] if rows is None else points.index_select(0, rows[start:stop])
        block = buffer[: stop - start].copy_(part)
        torch.sum(block.sub_(centre).pow_(2), -1, out=out[start:stop])
    return out


@dataclass(frozen=True)
class KMeansResult:
    """``labels[N]``: cluster of every row (-1 for an inadmissible row); ``centres[K, d]``
    (float64) and ``sizes[K]`` of the best restart; ``cost``: the mean squared distance
    of the admissible rows to their centre (k-means's objective / number of rows)."""

    labels: Tensor
    centres: Tensor
    sizes: Tensor
    cost: float


def kmeans(points: Tensor, k: int, generator: torch.Generator, restarts: int = 10, iterations: int = 100) -> KMeansResult:
    """k-means on the admissible rows of ``points[N, d]`` (Lloyd 1982, seeded by
    k-means++, Arthur & Vassilvitskii 2007): ``restarts`` seedings from ``generator``,
    each followed by at most ``iterations`` Lloyd iterations (assign every row to its
    nearest centre, lowest index on ties; move every centre to its rows' mean; an empty
    cluster keeps its centre) until the labels stop changing; the restart of lowest
    cost wins (the first on ties).  Rows whose squared norm is not finite
    (:func:`~defenses.threshold_clustering.admissible_points`) take no part and get
    label -1.  Distances in float64.  Loops over restarts and iterations only."""
    admissible = admissible_points(points)
    n, d = points.shape
    labels = torch.full((n,), -1, dtype=torch.long, device=points.device)
    rows = admissible.nonzero().squeeze(-1)
    if rows.numel() == 0:
        zeros = torch.zeros(k, d, dtype=torch.float64, device=points.device)
        return KMeansResult(labels, zeros, torch.zeros(k, dtype=torch.float64, device=points.device), 0.0)
    x = points[rows].double()
    best: tuple[float, Tensor, Tensor, Tensor] | None = None
    for _ in range(restarts):
        centres = _seed(x, None, k, generator)
        assigned = euclidean_distances(x, centres).argmin(-1)
        for _ in range(iterations):
            means, sizes = group_mean(x, assigned, k)
            centres = torch.where((sizes > 0).unsqueeze(-1), means, centres)
            moved = euclidean_distances(x, centres).argmin(-1)
            if torch.equal(moved, assigned):
                break
            assigned = moved
        means, sizes = group_mean(x, assigned, k)
        centres = torch.where((sizes > 0).unsqueeze(-1), means, centres)
        cost = float((x - centres[assigned]).pow(2).sum(-1).mean())
        if best is None or cost < best[0]:
            best = (cost, assigned, centres, sizes)
    cost, assigned, centres, sizes = best
    labels[rows] = assigned
    return KMeansResult(labels, centres, sizes, cost)


#: Rows against which :func:`dense_rows` measures every row's neighbourhood.
DENSITY_SAMPLE = 128


def density_sample(points: Tensor, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``(rows[S], dense[S])``: a seeded sample of at most :data:`DENSITY_SAMPLE`
    admissible rows of ``points[N, d]`` (all of them, in order, when there are no
    more) and which of them lie in a dense part of the cloud: a sampled row is dense
    when its distance to its ``m``-th nearest other sampled row (``m = ceil(S / (2k))``,
    half a cluster of the sample) is at most the median of those distances (every row
    is, with at most ``k`` of them).  A row far from every other one (a large-gradient
    Byzantine message) is not dense, so seeding from the dense rows keeps isolated far
    points from taking centres of their own; a tight group still counts.  One
    ``S^2 d`` product, whatever ``N``."""
    rows = admissible_points(points).nonzero().squeeze(-1)
    if rows.numel() <= k:
        return rows, torch.ones_like(rows, dtype=torch.bool)
    if rows.numel() > DENSITY_SAMPLE:
        pick = torch.randperm(rows.numel(), generator=generator, device=generator.device)[:DENSITY_SAMPLE]
        rows = rows[pick.to(rows.device)]
    # squared distances from the sample's Gram product in the rows' dtype (one S^2 d
    # GEMM; float64 only for the S^2 sums): only their ranks are used
    sample = points[rows]
    distances = gram_squared_distances((sample @ sample.transpose(0, 1)).double())  # [S, S]
    distances.fill_diagonal_(math.inf)  # a row is not its own neighbour
    m = max(1, math.ceil(rows.numel() / (2 * k)))
    reach = distances.sort(dim=1).values[:, min(m, rows.numel() - 1) - 1]
    return rows, reach <= reach.median()


def dense_rows(points: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """``[N]`` mask of the dense rows of :func:`density_sample` (rows outside the
    sample are not marked; with at most ``k`` admissible rows, all of them)."""
    rows, dense = density_sample(points, k, generator)
    mask = torch.zeros(points.shape[0], dtype=torch.bool, device=points.device)
    mask[rows[dense]] = True
    return mask
