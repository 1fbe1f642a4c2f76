"""Threshold-Clustering (Werner et al., Alg. 3, eq. 24) as a pure batched function.

For rounds l = 1..M and each centre k, with radius tau_{k,l} from a policy::

    v_{k,l} = (1/N) sum_j [ z_j        if ||z_j - v_{k,l-1}|| <= tau_{k,l}
                            v_{k,l-1}  otherwise ]

i.e. ``v_l = v_{l-1} + (1/N) sum_{j inside} (z_j - v_{l-1})``: note ``1/N``, not
``1/|inside|``.  Centres are updated independently (balls may overlap).

Robustness rule: a point with a non-finite coordinate or a non-finite squared norm is
*inadmissible*: it is infinitely far from every centre and never inside a ball, so no
NaN, Inf or overflowing Byzantine row can reach a centre.

Two numerically different but mathematically equal evaluations:

* ``method="direct"``: distances from the point coordinates, ``O(M K N d)`` memory
  passes; exact to rounding.
* ``method="gram"``: every centre stays a linear combination of the points and the
  initial centres, ``v = W P`` with ``P = [z; v_0]``; distances come from the Gram
  matrix ``P P^T`` (one matrix product), and the coordinates are formed once at the
  end.  Faster for large ``d`` and many rounds; loses precision when distances are
  tiny relative to the points' norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from defenses.radius import RadiusPolicy, RadiusSpec, make_radius


@dataclass(frozen=True)
class ClusteringResult:
    """Output of :func:`threshold_clustering`.

    ``centres[..., K, d]`` after the last round; ``inside[..., K, N]`` the membership of
    the last round's balls; ``radius[..., K]`` the last round's radii.
    """

    centres: Tensor
    inside: Tensor
    radius: Tensor


def admissible_points(points: Tensor) -> Tensor:
    """``[..., N]`` mask of points with finite coordinates and finite squared norm."""
    finite = torch.isfinite(points).all(dim=-1)
    safe = torch.where(finite.unsqueeze(-1), points, torch.zeros_like(points))
    return finite & torch.isfinite(safe.pow(2).sum(dim=-1))


def threshold_clustering(
    points: Tensor,
    centres: Tensor,
    radius: RadiusSpec,
    rounds: int = 10,
    *,
    method: Literal["direct", "gram"] = "direct",
) -> ClusteringResult:
    """Run ``rounds`` rounds of Threshold-Clustering.

    Args:
        points: ``[N, d]`` or ``[B, N, d]`` (B independent problems, e.g. one per FC
            client).
        centres: initial centres ``[K, d]`` or ``[B, K, d]``.  An inadmissible
            (non-finite) initial centre is returned unchanged and captures no point,
            so a diverged client never crashes the round.
        radius: a radius policy, a number (fixed radius) or a mapping
            ``{"policy": "quantile", "q": 0.2}`` (see :mod:`defenses.radius`).
        rounds: number of rounds ``M`` (the paper uses 10); 0 returns the input.
        method: ``"direct"`` or ``"gram"`` (see module docstring).
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if method not in ("direct", "gram"):
        raise ValueError(f"method must be 'direct' or 'gram', got {method!r}")
    if points.dim() not in (2, 3) or centres.dim() != points.dim():
        raise ValueError(
            f"points must be [N, d] or [B, N, d] and centres [K, d] or [B, K, d] "
            f"with the same rank; got {tuple(points.shape)} and {tuple(centres.shape)}"
        )
    if points.shape[-1] != centres.shape[-1]:
        raise ValueError(f"points and centres differ in dimension: {points.shape[-1]} vs {centres.shape[-1]}")
    policy = make_radius(radius)
    batched = points.dim() == 3
    z = points if batched else points.unsqueeze(0)
    v0 = centres.to(points.dtype) if batched else centres.to(points.dtype).unsqueeze(0)
    if z.shape[0] != v0.shape[0]:
        raise ValueError(f"points and centres differ in batch size: {z.shape[0]} vs {v0.shape[0]}")
    admissible = admissible_points(z)
    clean = torch.where(admissible.unsqueeze(-1), z, torch.zeros_like(z))
    live = admissible_points(v0)  # [B, K]
    start = torch.where(live.unsqueeze(-1), v0, torch.zeros_like(v0))
    run = _run_gram if method == "gram" else _run_direct
    result = run(clean, start, admissible, policy, rounds)
    if not bool(live.all()):
        result = ClusteringResult(
            torch.where(live.unsqueeze(-1), result.centres, v0),
            result.inside & live.unsqueeze(-1),
            result.radius,
        )
    if batched:
        return result
    return ClusteringResult(result.centres[0], result.inside[0], result.radius[0])


def _inside(distances: Tensor, tau: Tensor, strict: bool) -> Tensor:
    tau = tau.unsqueeze(-1)
    within = distances < tau if strict else distances <= tau
    return within & torch.isfinite(distances)


def _mask_distances(distances: Tensor, admissible: Tensor) -> Tensor:
    inf = torch.full_like(distances, math.inf)
    bad = ~admissible.unsqueeze(-2) | torch.isnan(distances)
    return torch.where(bad, inf, distances)


def _run_direct(
    z: Tensor, v: Tensor, admissible: Tensor, policy: RadiusPolicy, rounds: int
) -> ClusteringResult:
    n = z.shape[-2]
    inside = torch.zeros(*v.shape[:-1], n, dtype=torch.bool, device=z.device)
    tau = v.new_zeros(v.shape[:-1])
    for round_index in range(rounds):
        distances = torch.stack(
            [torch.linalg.vector_norm(z - v[:, k : k + 1], dim=-1) for k in range(v.shape[1])],
            dim=1,
        )
        distances = _mask_distances(distances, admissible)
        tau = policy(distances, round_index)
        inside = _inside(distances, tau, policy.strict)
        weights = inside.to(z.dtype)
        count = weights.sum(-1, keepdim=True)
        v = v + (torch.bmm(weights, z) - count * v) / n
    return ClusteringResult(v, inside, tau)


def _run_gram(
    z: Tensor, v0: Tensor, admissible: Tensor, policy: RadiusPolicy, rounds: int
) -> ClusteringResult:
    batch, n, _ = z.shape
    k = v0.shape[1]
    stacked = torch.cat([z, v0], dim=1)  # P = [z; v0], [B, N + K, d]
    gram = torch.bmm(stacked, stacked.transpose(1, 2))
    diag = gram.diagonal(dim1=1, dim2=2)[:, :n]  # ||z_j||^2
    coef = torch.zeros(batch, k, n + k, dtype=z.dtype, device=z.device)
    coef[:, :, n:] = torch.eye(k, dtype=z.dtype, device=z.device)
    inside = torch.zeros(batch, k, n, dtype=torch.bool, device=z.device)
    tau = z.new_zeros(batch, k)
    for round_index in range(rounds):
        g_coef = torch.bmm(coef, gram)  # <P_j, v_k>
        v_norm = (g_coef * coef).sum(-1, keepdim=True)
        squared = diag.unsqueeze(1) - 2 * g_coef[:, :, :n] + v_norm
        distances = _mask_distances(squared.clamp_min(0).sqrt(), admissible)
        tau = policy(distances, round_index)
        inside = _inside(distances, tau, policy.strict)
        weights = inside.to(z.dtype)
        count = weights.sum(-1, keepdim=True)
        step = torch.nn.functional.pad(weights, (0, k)) - count * coef
        coef = coef + step / n
    return ClusteringResult(torch.bmm(coef, stacked), inside, tau)


def nearest_centre(points: Tensor, centres: Tensor) -> Tensor:
    """Index of the nearest centre for each point (``[..., N]``); inadmissible points
    get centre 0.  The assignment rule of Alg. 4 (unstated in the paper)."""
    admissible = admissible_points(points)
    clean = torch.where(admissible.unsqueeze(-1), points, torch.zeros_like(points))
    distances = torch.cdist(clean, centres.to(points.dtype), compute_mode="donot_use_mm_for_euclid_dist")
    distances = torch.where(torch.isnan(distances), torch.full_like(distances, math.inf), distances)
    return distances.argmin(dim=-1)
