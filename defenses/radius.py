"""Radius policies for Threshold-Clustering (Werner et al., Alg. 3 step 3).

A policy maps the distances of every point to the current centre, ``dist[B, K, N]``
(``inf`` for inadmissible points), to one radius per centre, ``tau[B, K]``.  Policies
are frozen dataclasses: validated at construction, pure, and batched.

A policy may also implement ``undecided(lower, upper)``: given only an interval
``lower <= dist <= upper`` per point, the points whose exact distance is needed to
compute ``tau`` and every ball membership.  The ``"gram"`` evaluation of
Threshold-Clustering reads only those points in a round; a policy without the method
makes it read every point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Union, runtime_checkable

import torch
from torch import Tensor

from robust_pfl.registry import check_options, did_you_mean, init_parameters


@runtime_checkable
class RadiusPolicy(Protocol):
    """``radius(dist[B, K, N], round) -> tau[B, K]``; ``strict`` selects ``<`` over ``<=``."""

    strict: bool

    def __call__(self, distances: Tensor, round_index: int) -> Tensor: ...


def _meets(lower: Tensor, upper: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """``[B, K, N]`` mask of points whose interval ``[lower, upper]`` meets the
    per-centre range ``[low, high]`` (``[B, K]``), ends included."""
    return (upper >= low.unsqueeze(-1)) & (lower <= high.unsqueeze(-1))


def _constant(like: Tensor, tau: float) -> Tensor:
    """``tau`` for every centre, ``like.shape[:-1]`` in ``like``'s dtype; a radius past
    the dtype's range is ``inf`` (every finite distance is within it)."""
    return like.new_full(like.shape[:-1], tau if tau <= torch.finfo(like.dtype).max else math.inf)


def _constant_undecided(tau: float, lower: Tensor, upper: Tensor) -> Tensor:
    """With a radius that ignores the distances, only points whose interval contains
    ``tau`` have an open membership."""
    value = _constant(lower, tau)
    return _meets(lower, upper, value, value)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class FixedRadius:
    """A constant radius ``tau`` for every centre and round."""

    tau: float
    strict: bool = False

    def __post_init__(self) -> None:
        _require(self.tau >= 0 and not math.isnan(self.tau), f"radius tau must be >= 0, got {self.tau}")

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        return _constant(distances, self.tau)

    def undecided(self, lower: Tensor, upper: Tensor) -> Tensor:
        return _constant_undecided(self.tau, lower, upper)


@dataclass(frozen=True)
class TheoryRadius:
    """``tau = c * sqrt(delta * sigma * Delta)`` (Thm 3.1; the constant is unspecified
    in the paper, so ``c`` is exposed)."""

    delta: float
    sigma: float
    separation: float
    c: float = 1.0
    strict: bool = False

    def __post_init__(self) -> None:
        _require(0 < self.delta <= 1, f"radius delta must be in (0, 1], got {self.delta}")
        _require(self.sigma >= 0, f"radius sigma must be >= 0, got {self.sigma}")
        _require(self.separation >= 0, f"radius separation must be >= 0, got {self.separation}")
        _require(self.c > 0, f"radius c must be > 0, got {self.c}")

    @property
    def tau(self) -> float:
        return self.c * math.sqrt(self.delta * self.sigma * self.separation)

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        return _constant(distances, self.tau)

    def undecided(self, lower: Tensor, upper: Tensor) -> Tensor:
        return _constant_undecided(self.tau, lower, upper)


@dataclass(frozen=True)
class QuantileRadius:
    """``tau = factor * (q-quantile of the distances to the current centre)``,
    recomputed every round.  Linear interpolation between order statistics (NumPy's
    default); infinite distances sort last.  The paper uses q = 0.2 on MNIST; the
    official code multiplies by ``factor = 0.99`` and uses ``strict`` inclusion."""

    q: float
    factor: float = 1.0
    strict: bool = False

    def __post_init__(self) -> None:
        _require(0 <= self.q <= 1, f"radius q must be in [0, 1], got {self.q}")
        _require(self.factor > 0, f"radius factor must be > 0, got {self.factor}")

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        return self.factor * quantile_with_inf(distances, self.q)

    def undecided(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Points that may sit at one of the two order statistics the quantile reads,
        or whose membership is open.

        The r-th smallest distance lies between the r-th smallest ``lower`` and the
        r-th smallest ``upper``; a point entirely below (above) that range has rank
        below (above) r.  So the points meeting the range between the two order
        statistics' brackets include every point at those ranks, and once they are
        exact ``tau`` is exact, whatever stands in for the other points on their own
        side.  ``tau`` grows with every distance, so it lies between the radius of
        ``lower`` and of ``upper``; points meeting that range have an open
        membership."""
        position = self.q * (lower.shape[-1] - 1)
        low_rank, high_rank = math.floor(position), math.ceil(position)
        ordered_lower, ordered_upper = lower.sort(dim=-1).values, upper.sort(dim=-1).values
        at_ranks = _meets(lower, upper, ordered_lower[..., low_rank], ordered_upper[..., high_rank])
        radius_lower = self.factor * _quantile_of_sorted(ordered_lower, self.q)
        radius_upper = self.factor * _quantile_of_sorted(ordered_upper, self.q)
        return at_ranks | _meets(lower, upper, radius_lower, radius_upper)


def quantile_with_inf(values: Tensor, q: float) -> Tensor:
    """q-quantile over the last dimension, linear interpolation, ``inf``-safe."""
    return _quantile_of_sorted(values.sort(dim=-1).values, q)


def _quantile_of_sorted(ordered: Tensor, q: float) -> Tensor:
    """:func:`quantile_with_inf` of values already sorted along the last dimension."""
    position = q * (ordered.shape[-1] - 1)
    lo, hi = math.floor(position), math.ceil(position)
    low, high = ordered[..., lo], ordered[..., hi]
    frac = position - lo
    if frac == 0 or lo == hi:
        return low
    # sorted, so ``high`` is infinite whenever ``low`` is: where ``low`` is finite,
    # ``high - low`` is exact or +-inf, and elsewhere ``low`` itself is the answer
    return torch.where(torch.isfinite(low), low + frac * (high - low), low)


@dataclass(frozen=True)
class CenterDistanceRadius:
    """"cd" policy: 1-D k-means with 3 centres on the finite distances; the radius is
    the mean of the 2nd and 3rd (sorted) centres.  Batched Lloyd iterations started at
    the minimum, median and maximum."""

    iterations: int = 25
    strict: bool = False

    def __post_init__(self) -> None:
        _require(self.iterations >= 1, f"radius iterations must be >= 1, got {self.iterations}")

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        finite = torch.isfinite(distances)
        values = torch.where(finite, distances, torch.zeros_like(distances))
        weight = finite.to(distances.dtype)
        big = torch.where(finite, distances, torch.full_like(distances, -math.inf))
        small = torch.where(finite, distances, torch.full_like(distances, math.inf))
        lowest, highest = small.amin(-1), big.amax(-1)
        middle = quantile_with_inf(distances, 0.5)
        centres = torch.stack([lowest, torch.minimum(middle, highest), highest], dim=-1)
        centres = torch.where(torch.isfinite(centres), centres, torch.zeros_like(centres))
        for _ in range(self.iterations):
            assign = (values.unsqueeze(-1) - centres.unsqueeze(-2)).abs().argmin(-1)
            onehot = torch.nn.functional.one_hot(assign, 3).to(distances.dtype) * weight.unsqueeze(-1)
            count = onehot.sum(-2)
            total = (onehot * values.unsqueeze(-1)).sum(-2)
            centres = torch.where(count > 0, total / count.clamp_min(1), centres)
        ordered = centres.sort(-1).values
        return 0.5 * (ordered[..., 1] + ordered[..., 2])

    def undecided(self, lower: Tensor, upper: Tensor) -> Tensor:
        """k-means on the distances is not monotone in them: every point is needed."""
        return torch.ones_like(lower, dtype=torch.bool)


RadiusSpec = Union[float, int, Mapping[str, Any], RadiusPolicy]

_POLICIES = {
    "fixed": FixedRadius,
    "theory": TheoryRadius,
    "quantile": QuantileRadius,
    "cd": CenterDistanceRadius,
}


def make_radius(spec: RadiusSpec) -> RadiusPolicy:
    """A policy from a number (fixed radius), a mapping ``{"policy": name, ...}`` or a
    policy instance.  Unknown names or parameters raise ``ValueError`` naming them."""
    if isinstance(spec, RadiusPolicy):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return FixedRadius(float(spec))
    if isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("policy", None)
        if name not in _POLICIES:
            raise ValueError(
                f"radius.policy must be one of {sorted(_POLICIES)}, got {name!r}{did_you_mean(name, _POLICIES)}"
            )
        check_options("radius", f"radius policy {name!r}", options, init_parameters(_POLICIES[name]))
        return _POLICIES[name](**options)
    raise ValueError(f"radius must be a number, a mapping with 'policy', or a RadiusPolicy; got {spec!r}")
