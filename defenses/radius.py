"""Radius policies for Threshold-Clustering (Werner et al., Alg. 3 step 3).

A policy maps the distances of every point to the current centre, ``dist[B, K, N]``
(``B`` problems clustered apart, ``K`` centres each, ``N`` points each; ``inf`` for
inadmissible points), to one radius per centre, ``tau[B, K]``, at each round of
Threshold-Clustering (its iteration ``0 .. M - 1``, not the training round; the
defense-state reference, :mod:`robust_pfl.engine.defense_state`, writes it
``policy(dist[P, K, Q], l)``).  Policies are frozen dataclasses
(:func:`robust_pfl.engine.validation.options`, like attacks and aggregators):
validated at construction, pure, and batched.  A bad option raises
``ValueError`` naming ``radius.<field>``, what it accepts and what was given.
:func:`make_radius` turns a config's spec (a number or ``{policy = ..., ...}``) into
a policy once, when an algorithm's parameters are validated; everything after uses
that object.

A policy also declares ``undecided(lower, upper)``: given only an interval
``lower <= dist <= upper`` per point, the points whose exact distance is needed to
compute ``tau`` and every ball membership.  The ``"gram"`` evaluation of
Threshold-Clustering reads only those points in a round; a policy whose ``undecided``
is ``None`` makes it read every point.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Callable, ClassVar, Literal, Mapping, Protocol, Union, get_args, runtime_checkable

import torch
from pydantic import Field
from torch import Tensor

from robust_pfl.engine.registry import check_options, did_you_mean, init_parameters
from robust_pfl.engine.validation import options


@runtime_checkable
class RadiusPolicy(Protocol):
    """``radius(dist[B, K, N], round) -> tau[B, K]``, ``round`` Threshold-Clustering's
    iteration (0-based; not the training round); ``strict`` selects ``<`` over ``<=``;
    ``undecided(lower, upper) -> [B, K, N]`` the points whose exact distance the
    policy needs (see the module docstring), or ``None`` for a policy that cannot tell
    (every point is read)."""

    strict: bool
    undecided: Callable[[Tensor, Tensor], Tensor] | None

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


#: Class decorator of the radius policies: bad options raise ``ValueError`` naming
#: ``radius.<field>`` (:mod:`robust_pfl.engine.validation`).
radius_options = options("radius policy", where="radius")

_STRICT = "a point is inside when d < tau (default: d <= tau)"


@radius_options
class FixedRadius:
    """A constant radius ``tau`` for every centre and round."""

    name: ClassVar[str] = "fixed"
    tau: Annotated[float, Field(ge=0, allow_inf_nan=True, description="the radius (inf: every point inside)")]
    strict: Annotated[bool, Field(description=_STRICT)] = False

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        return _constant(distances, self.tau)

    def undecided(self, lower: Tensor, upper: Tensor) -> Tensor:
        return _constant_undecided(self.tau, lower, upper)


@radius_options
class TheoryRadius:
    """``tau = c * sqrt(delta * sigma * Delta)`` (Thm 3.1; the constant is unspecified
    in the paper, so ``c`` is exposed)."""

    name: ClassVar[str] = "theory"
    delta: Annotated[float, Field(gt=0, le=1, description="Thm 3.1's delta")]
    sigma: Annotated[float, Field(ge=0, allow_inf_nan=True, description="the gradient noise sigma")]
    separation: Annotated[float, Field(ge=0, allow_inf_nan=True, description="the cluster separation Delta")]
    c: Annotated[float, Field(gt=0, allow_inf_nan=True, description="the constant (unspecified in the paper)")] = 1.0
    strict: Annotated[bool, Field(description=_STRICT)] = False

    @property
    def tau(self) -> float:
        return self.c * math.sqrt(self.delta * self.sigma * self.separation)

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        return _constant(distances, self.tau)

    def undecided(self, lower: Tensor, upper: Tensor) -> Tensor:
        return _constant_undecided(self.tau, lower, upper)


QuantileRule = Literal["interpolated", "official"]
QUANTILE_RULES = get_args(QuantileRule)
OFFICIAL_QUANTILE_FACTOR = 0.99  # the official code's ``tau = 0.99 * ds[int(len(ds) * q)]``


@radius_options
class QuantileRadius:
    """A radius read from the distances' order statistics, recomputed every round;
    infinite (inadmissible) distances sort last.  The paper uses q = 0.2 on MNIST.

    ``rule`` (default ``"interpolated"``):

    * ``"interpolated"``: ``tau = factor * (q-quantile)``, linear interpolation between
      the order statistics at position ``q (N - 1)`` (NumPy's default); ``factor``
      (default 1) and ``strict`` (``<`` instead of ``<=``, default false) apply.
    * ``"official"``: the official code's rule, ``tau = 0.99 * sorted(d)[int(q * N)]``
      (``N`` points, the float product truncated as the official code does: N = 19,
      q = 0.2 reads rank ``int(3.8000000000000003) = 3``; capped at ``N - 1``, so
      q = 1 reads the largest), a point inside when ``d <= tau``.  It fixes both the
      factor and the inclusion, so ``factor`` must stay 1 and ``strict`` false.
    """

    name: ClassVar[str] = "quantile"
    q: Annotated[float, Field(ge=0, le=1, description="the quantile of the distances (the paper: 0.2)")]
    factor: Annotated[
        float, Field(gt=0, allow_inf_nan=True, description="tau = factor * the q-quantile (rule interpolated)")
    ] = 1.0
    strict: Annotated[bool, Field(description=_STRICT + " (rule interpolated)")] = False
    rule: Annotated[
        QuantileRule, Field(description="interpolated | official (0.99 * sorted(d)[int(q N)], d <= tau)")
    ] = "interpolated"

    def __post_init__(self) -> None:
        if self.rule == "official" and self.factor != 1.0:
            raise ValueError(
                f"radius.factor applies to rule 'interpolated' only: rule 'official' takes "
                f"0.99 * sorted(d)[int(q N)]; got factor {self.factor}"
            )
        if self.rule == "official" and self.strict:
            raise ValueError(
                "radius.strict applies to rule 'interpolated' only: rule 'official' includes d <= tau; got strict True"
            )

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        return self._radius_of_sorted(distances.sort(dim=-1).values)

    def _ranks(self, n: int) -> tuple[int, int]:
        """The two (possibly equal) 0-based ranks among ``n`` sorted distances that
        ``tau`` reads."""
        if self.rule == "official":
            rank = min(int(n * self.q), n - 1)  # the official code's float product, truncated
            return rank, rank
        position = self.q * (n - 1)
        return math.floor(position), math.ceil(position)

    def _radius_of_sorted(self, ordered: Tensor) -> Tensor:
        """``tau`` of distances already sorted along the last dimension."""
        if self.rule == "official":
            return OFFICIAL_QUANTILE_FACTOR * ordered[..., self._ranks(ordered.shape[-1])[0]]
        return self.factor * _quantile_of_sorted(ordered, self.q)

    def undecided(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Points that may sit at one of the order statistics the radius reads, or
        whose membership is open.

        The r-th smallest distance lies between the r-th smallest ``lower`` and the
        r-th smallest ``upper``; a point entirely below (above) that range has rank
        below (above) r.  So the points meeting the range between the read order
        statistics' brackets include every point at those ranks, and once they are
        exact ``tau`` is exact, whatever stands in for the other points on their own
        side.  ``tau`` grows with every distance, so it lies between the radius of
        ``lower`` and of ``upper``; points meeting that range have an open
        membership."""
        low_rank, high_rank = self._ranks(lower.shape[-1])
        ordered_lower, ordered_upper = lower.sort(dim=-1).values, upper.sort(dim=-1).values
        at_ranks = _meets(lower, upper, ordered_lower[..., low_rank], ordered_upper[..., high_rank])
        radius_lower = self._radius_of_sorted(ordered_lower)
        radius_upper = self._radius_of_sorted(ordered_upper)
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


CdFit = Literal["lloyd", "kmeans++"]
CD_FITS = get_args(CdFit)


@radius_options
class CenterDistanceRadius:
    """"cd" policy: 3-means on the finite distances (inadmissible points ignored); the
    radius is the mean of the 2nd and 3rd (sorted) centres.

    ``fit`` (default ``"lloyd"``):

    * ``"lloyd"``: ``iterations`` (default 25) batched 1-D Lloyd iterations started at
      the minimum, median and maximum: a local optimum, which on random distances is
      often not the optimal one.
    * ``"kmeans++"``: the official code's fit, scikit-learn's ``KMeans(n_clusters=3)``
      (k-means++ seeding, 10 restarts) on the distances as a column.  Computed here as
      the optimal 3-means, exactly (:func:`optimal_three_means_radius`): what the
      restarts find whenever one of them reaches the optimum.  ``iterations`` does not
      apply (leave it at its default).  With fewer than 3 distinct finite distances
      the radius is the mean of the smallest and the largest (one value ``a``: ``a``,
      every point inside; two values ``a < b``: ``(a + b) / 2``, the farther ones
      outside); with none, 0.
    """

    name: ClassVar[str] = "cd"
    iterations: Annotated[int, Field(ge=1, description="Lloyd iterations (fit lloyd)")] = 25
    strict: Annotated[bool, Field(description=_STRICT)] = False
    fit: Annotated[
        CdFit, Field(description="lloyd (from min, median, max) | kmeans++ (the optimal 3-means, the official code's)")
    ] = "lloyd"

    def __post_init__(self) -> None:
        if self.fit != "lloyd" and self.iterations != 25:
            raise ValueError(
                f"radius.iterations applies to fit 'lloyd' only: fit 'kmeans++' finds the optimal "
                f"3-means exactly; got iterations {self.iterations}"
            )

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        if self.fit == "kmeans++":
            return optimal_three_means_radius(distances)
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


# Rows of the [rows, N, N] split-cost table evaluated at once: bounds its memory
# (about 5 float64 tables of this many entries).
_SPLIT_TABLE_ENTRIES = 1 << 22


def optimal_three_means_radius(distances: Tensor) -> Tensor:
    """The "cd" radius of the optimal 3-means of each row's finite distances:
    ``dist[..., N] -> tau[...]``, the mean of the 2nd and 3rd sorted centres.

    In one dimension an optimal k-means partition is three runs of the sorted values,
    so every pair of split points is tried: ``O(N^2)`` per row from prefix sums,
    batched over rows (in blocks of bounded memory), in float64.  Splits fall only
    between distinct values (a run of equal values is never split), which loses no
    optimum when there are at least 3 distinct values; with fewer, see
    :class:`CenterDistanceRadius`.  Among equally good partitions the first in
    (first split, second split) order wins."""
    n = distances.shape[-1]
    rows = distances.reshape(-1, n).double()
    per_block = max(1, _SPLIT_TABLE_ENTRIES // max(1, n * n))
    blocks = [_three_means_rows(rows[start : start + per_block]) for start in range(0, rows.shape[0], per_block)]
    tau = torch.cat(blocks) if blocks else rows.new_zeros(0)
    return tau.reshape(distances.shape[:-1]).to(distances.dtype)


def _three_means_rows(rows: Tensor) -> Tensor:
    """:func:`optimal_three_means_radius` of ``rows[R, N]`` (float64)."""
    r, n = rows.shape
    ordered = rows.sort(dim=-1).values  # infinite distances last
    finite = torch.isfinite(ordered)
    m = finite.sum(-1, keepdim=True)  # [R, 1] finite values per row
    # centred on the row's finite mean, so that the prefix-sum costs lose little to cancellation
    shift = torch.where(finite, ordered, 0.0).sum(-1, keepdim=True) / m.clamp_min(1)
    centred = torch.where(finite, ordered - shift, 0.0)
    zero = centred.new_zeros(r, 1)
    s1 = torch.cat([zero, centred.cumsum(-1)], -1)  # [R, N + 1]: sum of the first k values
    s2 = torch.cat([zero, centred.square().cumsum(-1)], -1)
    k = torch.arange(n, device=rows.device, dtype=rows.dtype)
    head = s2[:, :n] - s1[:, :n].square() / k.clamp_min(1)  # cost of [0, i), [R, N]
    s1_end, s2_end = s1.gather(-1, m), s2.gather(-1, m)
    tail_count = (m - k).clamp_min(1)
    tail = (s2_end - s2[:, :n]) - (s1_end - s1[:, :n]).square() / tail_count  # cost of [j, m)
    width = (k.view(1, 1, n) - k.view(1, n, 1)).clamp_min(1)  # j - i
    middle_sum = s1[:, None, :n] - s1[:, :n, None]
    middle = (s2[:, None, :n] - s2[:, :n, None]) - middle_sum.square() / width  # cost of [i, j)
    total = head.unsqueeze(-1) + middle + tail.unsqueeze(-2)
    starts_value = torch.cat([torch.zeros_like(finite[:, :1]), ordered[:, 1:] > ordered[:, :-1]], -1)
    split_ok = starts_value & (k.view(1, n) < m)  # a new value starts at k, inside the finite part
    index = torch.arange(n, device=rows.device)
    ordered_pair = index.view(1, n, 1) < index.view(1, 1, n)
    valid = split_ok.unsqueeze(-1) & split_ok.unsqueeze(-2) & ordered_pair
    best = torch.where(valid, total, math.inf).flatten(1).argmin(-1)
    i, j = (best // n).unsqueeze(-1), (best % n).unsqueeze(-1)
    second = (s1.gather(-1, j) - s1.gather(-1, i)) / (j - i).clamp_min(1)
    third = (s1_end - s1.gather(-1, j)) / (m - j).clamp_min(1)
    tau = shift + 0.5 * (second + third)
    # fewer than 3 distinct finite values: the mean of the smallest and the largest
    lowest = ordered[:, :1]
    highest = ordered.gather(-1, (m - 1).clamp_min(0))
    few = torch.where(m > 0, 0.5 * (lowest + highest), 0.0)
    return torch.where(valid.flatten(1).any(-1, keepdim=True), tau, few).squeeze(-1)


RadiusSpec = Union[float, int, Mapping[str, Any], RadiusPolicy]

_POLICIES: dict[str, type] = {
    cls.name: cls for cls in (FixedRadius, TheoryRadius, QuantileRadius, CenterDistanceRadius)
}


def make_radius(spec: RadiusSpec) -> RadiusPolicy:
    """A policy from a number (fixed radius), a mapping ``{"policy": name, ...}`` or a
    policy instance (returned as it is).  An unknown name or option, or a value of the
    wrong type or range, raises ``ValueError`` naming ``radius.<field>``."""
    if isinstance(spec, RadiusPolicy):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return FixedRadius(float(spec))
    if isinstance(spec, Mapping):
        given = dict(spec)
        name = given.pop("policy", None)
        if not isinstance(name, str) or name not in _POLICIES:
            hint = did_you_mean(name, _POLICIES) if isinstance(name, str) else ""
            raise ValueError(f"radius.policy must be one of {sorted(_POLICIES)}, got {name!r}{hint}")
        check_options("radius", f"radius policy {name!r}", given, init_parameters(_POLICIES[name]))
        return _POLICIES[name](**given)
    raise ValueError(f"radius must be a number, a mapping with 'policy', or a RadiusPolicy; got {spec!r}")
