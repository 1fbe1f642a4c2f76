"""Rules that keep a server's warm-started centres on the clusters between rounds
(Momentum-Clustering, Werner et al. Alg. 4, and Myopic-Clustering, Alg. 1).

Alg. 4 warm-starts its K centres from the previous round and assigns every client to
its nearest centre; it says nothing about centres that merge, seeds that land on the
wrong groups, or clients whose momenta sit between two centres.  The rules here are
this package's answers (docs/mc.md gives the evidence for each):

* :func:`collapsed` detects merged centres (``reseed = "merged"``);
* :func:`trimmed_cost` and :func:`relabelled` judge and align a freshly seeded
  challenger against the warm-started centres (``reseed = "challenger"``);
* :func:`sticky_assignment` keeps a client on its centre unless another one is
  clearly nearer (``switch_margin``).

Inadmissible (non-finite) messages take no part in any of them.
"""

from __future__ import annotations

import math

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from robust_pfl.engine.rows import admissible_points, euclidean_distances


def collapsed(points: Tensor, centres: Tensor, nearest: Tensor, tolerance: float) -> bool:
    """Whether warm-started centres have collapsed: two of them closer than
    ``tolerance`` times the median distance of the admissible points to their nearest
    centre, or a centre nearest to no admissible point.  Identical centres stay
    identical under Threshold-Clustering (same ball, same update), so without a
    re-seed a merge lasts for the rest of the run.  This test also fires on correct
    centres whose clusters spread wider than ``1 / tolerance`` times their gap."""
    admissible = admissible_points(points)
    if centres.shape[0] < 2 or not bool(admissible.any()):
        return False
    counts = torch.bincount(nearest[admissible], minlength=centres.shape[0])
    if bool((counts == 0).any()):
        return True
    own = euclidean_distances(points[admissible], centres).min(dim=-1).values
    gaps = euclidean_distances(centres, centres)
    gaps.fill_diagonal_(math.inf)
    return bool(gaps.min() < tolerance * own.median())


def trimmed_cost(distances: Tensor, assignment: Tensor, trim: int) -> float:
    """Trimmed k-means cost (Cuesta-Albertos, Gordaliza and Matrán 1997) of an
    assignment: the sum of the squared distances ``distances[N, K]`` of every point to
    its assigned centre, leaving out the ``trim`` largest (up to ``trim`` Byzantine
    messages placed anywhere change nothing) and every inadmissible point.  Computed
    in float64; a clustering whose centres leave every point out costs ``inf``."""
    own = distances.gather(-1, assignment.unsqueeze(-1)).squeeze(-1).double()
    own = own[torch.isfinite(own)]
    kept = own.numel() - min(trim, own.numel())
    if kept <= 0:
        return math.inf if own.numel() == 0 else 0.0
    return float(own.square().sort().values[:kept].sum())


def relabelled(incumbent: Tensor, challenger: Tensor) -> Tensor:
    """The order ``p[K]`` of the challenger's centres that pairs each with an
    incumbent centre at least total distance (Hungarian matching, ``O(K^3)``):
    ``challenger[p][k]`` takes over from ``incumbent[k]``, so a client kept on its
    label by :func:`sticky_assignment` stays with the same cluster.  Non-finite
    distances count as very large."""
    costs = torch.nan_to_num(euclidean_distances(incumbent.double(), challenger.double()), nan=1e300, posinf=1e300)
    _, order = linear_sum_assignment(costs.cpu().numpy())
    return torch.as_tensor(order, dtype=torch.long, device=challenger.device)


def sticky_assignment(distances: Tensor, previous: Tensor | None, margin: float) -> Tensor:
    """Each point's centre from ``distances[N, K]``: the nearest (lowest index on
    ties), except that a point keeps its ``previous`` centre unless the nearest is at
    most ``(1 - margin)`` times as far.  ``margin = 0`` or no ``previous`` gives the
    nearest centre (Alg. 4).  A point infinitely far from every centre gets centre 0
    (or keeps its previous one)."""
    nearest = distances.argmin(dim=-1)
    if previous is None or margin <= 0:
        return nearest
    closest = distances.gather(-1, nearest.unsqueeze(-1)).squeeze(-1)
    current = distances.gather(-1, previous.unsqueeze(-1)).squeeze(-1)
    leaves = closest < (1 - margin) * current
    return torch.where(leaves, nearest, previous)
