"""Constants of a labelled point cloud: the clustering setting's Assumptions 1-3
(eq. 10-12: within-cluster variance ``sigma^2``, separation of the means ``Delta^2``)
and their momentum versions, Assumptions 8-9 (eq. 25-26), along an MC run."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from theory_checks.estimators.fractions import select_included
from theory_checks.estimators.gradient_constants import pairwise_squared_distances
from theory_checks.types import Estimate


def _cluster_moments(points: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per cluster: the means ``[T, K, d]``, sizes ``[K]`` and the unbiased total
    variances ``sum ||z - mean_k||^2 / (n_k - 1)`` ``[T, K]`` (``nan`` for a single
    point)."""
    rounds, _, dim = points.shape
    count = int(groups.max()) + 1
    sizes = torch.bincount(groups, minlength=count)
    weights = sizes.to(points.dtype)
    means = points.new_zeros(rounds, count, dim).index_add_(1, groups, points) / weights.unsqueeze(-1)
    squares = (points - means[:, groups]).square().sum(-1)
    scatter = points.new_zeros(rounds, count).index_add_(1, groups, squares)
    variances = torch.where(sizes > 1, scatter / (weights - 1).clamp_min(1), scatter.new_full((), math.nan))
    return means, sizes, variances


def _check_points(points: Tensor, name: str, dims: tuple[int, ...]) -> None:
    if not isinstance(points, Tensor) or points.dim() not in dims or not points.dtype.is_floating_point:
        shape = tuple(points.shape) if isinstance(points, Tensor) else type(points).__name__
        wanted = " or ".join({2: "[N, d]", 3: "[T, N, d]"}[d] for d in dims)
        raise ValueError(f"{name} must be a floating tensor {wanted}, got {shape}")
    if points.shape[-1] == 0 or (points.dim() == 3 and points.shape[0] == 0):
        raise ValueError(f"{name} must have at least one coordinate and one round, got shape {tuple(points.shape)}")


def _noise(points: Tensor, clusters: Tensor, include: Tensor | None, name: str) -> Estimate:
    """:func:`cloud_noise` over rounds ``points[T, N, d]`` (max over rounds)."""
    selected, groups, values, _ = select_included(points, clusters, include)
    _, sizes, variances = _cluster_moments(selected, groups)
    usable = sizes > 1
    if not bool(usable.any()):
        raise ValueError(f"{name}: no cluster has two included points, so no within-cluster variance is defined")
    candidates = torch.where(usable, variances, variances.new_full((), -math.inf))
    flat = int(candidates.reshape(-1).argmax())
    round_, cluster = divmod(flat, values.numel())
    return Estimate(
        "sigma2", float(variances[round_, cluster]), "max", points.shape[0] * int(usable.sum()),
        {"round": round_, "cluster": int(values[cluster])},
        {"per_cluster": variances.tolist(), "clusters": values.tolist(), "sizes": sizes.tolist(),
         "per_round": candidates.amax(-1).tolist()},
    )


def _separation(points: Tensor, clusters: Tensor, include: Tensor | None, debias: bool, name: str) -> Estimate:
    """:func:`cloud_separation` over rounds ``points[T, N, d]`` (min over rounds)."""
    selected, groups, values, _ = select_included(points, clusters, include)
    count = values.numel()
    if count < 2:
        raise ValueError(f"{name}: separation needs included points from at least two clusters, got one")
    means, sizes, variances = _cluster_moments(selected, groups)
    gaps = pairwise_squared_distances(means)
    if debias:
        if bool((sizes < 2).any()):
            raise ValueError(f"{name}: debias needs at least two included points in every cluster")
        inflation = variances / sizes.to(variances.dtype)
        gaps = (gaps - inflation.unsqueeze(-1) - inflation.unsqueeze(-2)).clamp_min(0.0)
    distinct = ~torch.eye(count, dtype=torch.bool, device=gaps.device)
    gaps = gaps.masked_fill(~distinct, math.inf)
    flat = int(gaps.reshape(-1).argmin())
    round_, rest = divmod(flat, count * count)
    cluster, other = divmod(rest, count)
    return Estimate(
        "Delta2", float(gaps[round_, cluster, other]), "min", points.shape[0] * count * (count - 1) // 2,
        {"round": round_, "cluster": int(values[cluster]), "other": int(values[other])},
        {"clusters": values.tolist(), "sizes": sizes.tolist(), "debiased": debias,
         "per_round": gaps.amin(dim=(1, 2)).tolist()},
    )


def _single_round(estimate: Estimate) -> Estimate:
    """An estimate over one ``[N, d]`` cloud: no ``round`` key, per-cluster lists flat."""
    where = {key: value for key, value in estimate.where.items() if key != "round"}
    details = {key: value for key, value in estimate.details.items() if key != "per_round"}
    if "per_cluster" in details:
        details["per_cluster"] = details["per_cluster"][0]
    return Estimate(estimate.name, estimate.value, estimate.extreme, estimate.samples, where, details)


def cloud_noise(points: Tensor, clusters: Tensor, include: Tensor | None = None) -> Estimate:
    """``sigma^2`` of Assumption 3 (eq. 12) for ``points[N, d]``: the largest unbiased
    within-cluster total variance ``sum ||z - mean_k||^2 / (n_k - 1)`` over clusters
    with at least two included points.  ``where = {"cluster": label}``;
    ``details["per_cluster"]`` (``nan`` for single-point clusters) in the order of
    ``details["clusters"]``."""
    _check_points(points, "points", (2,))
    return _single_round(_noise(points.unsqueeze(0), clusters, include, "points"))


def cloud_separation(points: Tensor, clusters: Tensor, include: Tensor | None = None,
                     debias: bool = False) -> Estimate:
    """``Delta^2`` of Assumption 2 (eq. 11) for ``points[N, d]``: the smallest
    ``||mean_k - mean_l||^2`` over pairs of clusters.  ``debias`` subtracts the
    expected inflation of the sample means, ``s_k^2/n_k + s_l^2/n_l`` (unbiased
    variances), clipped at 0.  ``where = {"cluster": k, "other": l}`` (labels)."""
    _check_points(points, "points", (2,))
    return _single_round(_separation(points.unsqueeze(0), clusters, include, debias, "points"))


def momentum_constants(momenta: Tensor, clusters: Tensor, include: Tensor | None = None) -> dict[str, Estimate]:
    """Assumptions 8-9 (eq. 25-26) along an MC run: ``{"Delta2": cloud_separation,
    "sigma2": cloud_noise}`` of the momenta ``[N, d]``, or of ``[T, N, d]`` per round
    and then the min (``Delta2``) / max (``sigma2``) over rounds, with ``where["round"]``
    and ``details["per_round"]``."""
    _check_points(momenta, "momenta", (2, 3))
    if momenta.dim() == 2:
        return {"Delta2": cloud_separation(momenta, clusters, include),
                "sigma2": cloud_noise(momenta, clusters, include)}
    return {"Delta2": _separation(momenta, clusters, include, False, "momenta"),
            "sigma2": _noise(momenta, clusters, include, "momenta")}
