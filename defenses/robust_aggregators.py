"""Classic Byzantine-robust aggregators as pure, batched functions.

An aggregator maps messages ``[..., N, d]`` (leading dimensions are independent
problems) to one vector per problem, ``[..., d]``::

    agg = make_aggregator({"name": "trimmed_mean", "f": 2})
    agg.check(N)                                  # refuses an impossible N up front
    out = agg(messages, previous=last, generator=rng)

Aggregators are frozen dataclasses, validated at construction (a bad value raises
``ValueError`` naming ``<aggregator>.<field>``, the allowed values and what was given),
registered in :data:`AGGREGATORS` by ``name``.  The built-in ones are declared with
:data:`aggregator_options` (:func:`robust_pfl.engine.validation.options`: typed fields with
pydantic constraints and a description each); one of a user's own may be a plain
frozen dataclass.  ``previous`` (last round's aggregate) is used by
centered clipping and ``generator`` by bucketing; the others ignore them.
``previous`` must have the aggregate's shape ``[..., d]`` or broadcast to it (else
``ValueError``).  Messages may have any floating dtype (Krum's distances for float16
and bfloat16 are taken in float32) and any ``d >= 0`` (``d = 0`` gives ``[..., 0]``).

Robustness rule (shared with :mod:`defenses.threshold_clustering`): a row with a
non-finite coordinate or a non-finite squared norm (e.g. rows of ``1e38`` in float32)
is *inadmissible* and dropped before aggregating, i.e. treated as absent.  Counts
such as ``n`` in the trimmed mean or Krum then refer to the admissible rows of each
problem; where dropping leaves too few rows for the configured ``f``, ``f`` is reduced
to the largest value the admissible count supports (with admissible honest rows, a
dropped row is a Byzantine one, and the reduced ``f`` still covers the Byzantine rows
left, so the guarantee is kept).  Aggregators never raise on NaN,
+-Inf or overflowing rows; the output is finite whenever a problem has at least one
admissible row, and a problem without any returns ``previous`` (when it is given and
admissible) or zeros.  The variable number of admissible rows per problem is handled
with masks (inadmissible rows sort last, get zero weight or infinite distance), never
with a Python loop over clients or problems.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Annotated, Any, ClassVar, Mapping, NamedTuple, Union

import numpy as np
import torch
from pydantic import Field, field_validator
from torch import Tensor

from defenses.primitives import admissible_points, euclidean_distances
from robust_pfl.engine.registry import check_options, did_you_mean, init_parameters, registrar
from robust_pfl.engine.validation import descriptions, options


# -- masked statistics shared by every aggregator -----------------------------------------
class Rows(NamedTuple):
    """Messages prepared for aggregation: ``values[..., N, d]`` with inadmissible rows
    zeroed, ``admissible[..., N]`` and the admissible ``count[...]`` (int64)."""

    values: Tensor
    admissible: Tensor
    count: Tensor

    @classmethod
    def of(cls, messages: Tensor) -> "Rows":
        """``messages`` prepared; when every row is admissible (the usual case, even
        under large-gradient attacks) ``values`` is ``messages`` itself, not a zeroed
        copy: aggregators only read it, and a fresh ``[N, d]`` tensor per call costs
        its page faults."""
        admissible = admissible_points(messages)
        if bool(admissible.all()):
            return cls(messages, admissible, admissible.sum(-1))
        values = torch.where(admissible.unsqueeze(-1), messages, torch.zeros_like(messages))
        return cls(values, admissible, admissible.sum(-1))


def _weighted_sum(values: Tensor, weights: Tensor) -> Tensor:
    """``sum_j weights[..., j] * values[..., j, :]`` by one batched product."""
    return (weights.to(values.dtype).unsqueeze(-2) @ values).squeeze(-2)


def per_problem(count: Tensor, like: Tensor) -> Tensor:
    """``count[...]`` as ``like``'s dtype, shaped ``[..., 1]`` to divide ``[..., d]``."""
    return count.clamp_min(1).to(like.dtype).unsqueeze(-1)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of the rows where ``mask[..., N]`` (zeros where no row is selected).
    Selecting one row returns it exactly (the other rows add exact zeros)."""
    return _weighted_sum(values, mask) / per_problem(mask.sum(-1), values)


def _sorted_columns(rows: Rows) -> Tensor:
    """Every coordinate sorted over the rows, inadmissible rows (as ``+inf``) last."""
    values = rows.values
    if not bool(rows.admissible.all()):
        values = torch.where(rows.admissible.unsqueeze(-1), values, torch.full_like(values, math.inf))
    return sort_columns(values)


def sort_columns(values: Tensor) -> Tensor:
    """``values[..., N, d]`` sorted along the rows, as a new tensor.  On the CPU,
    NumPy's vectorised sort, many times faster than torch's, which sorts each strided
    column on its own (benchmarks/README.md, "Kernel choices").  Both give the same
    values in the same places (equal zeros of either sign may trade places)."""
    if values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64) and not values.requires_grad:
        return torch.from_numpy(np.sort(values.numpy(), axis=-2))
    return values.sort(dim=-2).values


def stable_argsort_rows(values: Tensor) -> Tensor:
    """Stable argsort of ``values[..., N, d]`` along the rows (NumPy's on the CPU:
    torch sorts each strided column on its own, see :func:`sort_columns`)."""
    if values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64) and not values.requires_grad:
        return torch.from_numpy(np.argsort(values.numpy(), axis=-2, kind="stable"))
    return values.argsort(dim=-2, stable=True)


def mean_nearest_median(rows: Rows, keep: Tensor) -> Tensor:
    """Per coordinate, the mean of the ``keep[...]`` admissible values nearest the
    coordinate-wise median (ties in distance: the lower value first, so the result
    does not depend on the rows' order): the last step of Meamed (Xie, Koyejo, Gupta
    2018) and of Bulyan (El Mhamdi et al. 2018, with the Krum-selected rows)."""
    ordered = _sorted_columns(rows)  # ascending, inadmissible (+inf) last
    median = coordinate_median(rows)
    position = torch.arange(ordered.shape[-2], device=ordered.device).unsqueeze(-1)  # [N, 1]
    valid = position < rows.count[..., None, None]
    distance = torch.where(valid, (ordered - median.unsqueeze(-2)).abs(), torch.full_like(ordered, math.inf))
    nearest = ordered.gather(-2, stable_argsort_rows(distance))  # stable: the lower value first on ties
    kept = torch.where(position < keep[..., None, None], nearest, torch.zeros_like(nearest))
    return kept.sum(-2) / keep.clamp_min(1).to(kept.dtype).unsqueeze(-1)


def _mean_of_order_statistics(
    ordered: Tensor, count: Tensor, low: Tensor, high: Tensor, consume: bool = False
) -> Tensor:
    """Per coordinate, the mean of the order statistics at positions ``[low, high)``
    (of the ``count`` admissible ones) of ``ordered[..., N, d]``; zeros where the
    range is empty.  With ``consume`` the rows outside the range are zeroed in
    ``ordered`` itself (a caller's fresh sort) instead of in a masked copy."""
    position = torch.arange(ordered.shape[-2], device=ordered.device).unsqueeze(-1)  # [N, 1]
    low, high = low.clamp_min(0), torch.minimum(high, count)
    keep = (position >= low[..., None, None]) & (position < high[..., None, None])
    kept = ordered.masked_fill_(~keep, 0.0) if consume else torch.where(keep, ordered, torch.zeros_like(ordered))
    return kept.sum(-2) / per_problem(high - low, ordered)


def coordinate_median(rows: Rows) -> Tensor:
    """Coordinate-wise *statistical* median of the admissible rows: for an even count,
    the average of the two middle values (as ``numpy.median``; not torch's lower
    median).  Zeros for a problem without admissible rows."""
    count = rows.count
    if rows.values.shape[-2] == 0:
        return rows.values.new_zeros(*rows.values.shape[:-2], rows.values.shape[-1])
    ordered = _sorted_columns(rows)
    # the two middle order statistics (the same one for odd counts), read as two rows
    # instead of a masked sum over all N; ``+ 0`` gives a zero median the sum's sign
    middle = torch.stack([(count - 1).clamp_min(0) // 2, count // 2], dim=-1)  # [..., 2]
    low, high = torch.gather(ordered, -2, middle.unsqueeze(-1).expand(*middle.shape, ordered.shape[-1])).unbind(-2)
    odd = (count % 2 == 1).unsqueeze(-1)
    total = torch.where(odd, low + 0, low + high + 0)
    return torch.where(count.unsqueeze(-1) > 0, total / torch.where(odd, 1.0, 2.0).to(total.dtype), 0.0)


def row_norms(x: Tensor) -> Tensor:
    """Euclidean norms of the rows of ``x[..., N, d]``, overflow-safe: a finite row
    whose plain norm overflows (``|x| ~ 1e19`` in float32) is rescaled by its largest
    coordinate first, so clipping and Weiszfeld weights keep their direction."""
    norms = torch.linalg.vector_norm(x, dim=-1)
    if bool(torch.isinf(norms).any()):
        scale = x.abs().amax(-1, keepdim=True)
        finite = torch.isfinite(scale) & (scale > 0)  # an Inf coordinate keeps norm Inf
        scale = torch.where(finite, scale, torch.ones_like(scale))
        rescaled = scale.squeeze(-1) * torch.linalg.vector_norm(x / scale, dim=-1)
        norms = torch.where(torch.isinf(norms) & finite.squeeze(-1), rescaled, norms)
    return norms


def _admissible_or_none(previous: Tensor | None) -> Tensor | None:
    """``[...]`` mask of problems whose ``previous`` is usable, or None."""
    return None if previous is None else admissible_points(previous.unsqueeze(-2)).squeeze(-1)


# -- the interface -------------------------------------------------------------------------
class Aggregator(ABC):
    """Base class of a robust aggregator: ``__call__(messages[..., N, d],
    previous=None, generator=None)`` -> ``[..., d]``, batched over leading dimensions
    (independent aggregation problems).

    A subclass is a frozen dataclass whose fields are its options; it declares, as
    class attributes, ``name`` (the registry key a config names), ``summary`` (one
    line for ``robust-pfl aggregators``) and ``reference`` (its paper), and implements
    :meth:`aggregate_rows`.  It may override :meth:`check` to refuse sender counts it
    cannot work with.  The base class checks the input, drops inadmissible rows (NaN,
    Inf, overflowing norm) before the subclass sees them, and substitutes the fallback
    (``previous`` where usable, else zeros) for problems without an admissible row."""

    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str] = ""

    def flops(self, n: int, d: int) -> float:
        """Roughly the operations of one call on ``n`` rows of ``d`` numbers, for a
        run's cost estimate (:mod:`robust_pfl.costs`): by default a few passes over the
        rows."""
        return 4.0 * n * d

    def check(self, n: int) -> None:
        """Raise ``ValueError`` if the aggregator cannot work with ``n`` senders."""
        if n < 1:
            raise ValueError(f"{self.name}: needs at least one sender, got n={n}")

    def __call__(
        self, messages: Tensor, previous: Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        if messages.dim() < 2 or not messages.is_floating_point():
            raise ValueError(
                f"{self.name}: messages must be a floating tensor [..., N, d], got "
                f"{messages.dtype} of shape {tuple(messages.shape)}"
            )
        self.check(messages.shape[-2])
        shape = (*messages.shape[:-2], messages.shape[-1])
        if previous is not None:
            try:
                previous = torch.broadcast_to(previous.to(messages.dtype), shape)
            except RuntimeError:
                raise ValueError(
                    f"{self.name}: previous must have the aggregate's shape {tuple(shape)} (or broadcast "
                    f"to it) for messages of shape {tuple(messages.shape)}; got {tuple(previous.shape)}"
                ) from None
        rows = Rows.of(messages)
        out = self.aggregate_rows(rows, previous, generator)
        fallback = torch.zeros(shape, dtype=messages.dtype, device=messages.device)
        usable = _admissible_or_none(previous)
        if usable is not None:
            fallback = torch.where(usable.unsqueeze(-1), previous, fallback)
        return torch.where((rows.count > 0).unsqueeze(-1), out, fallback)

    @abstractmethod
    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        """The aggregate of each problem's admissible rows.

        Args:
            rows: the messages with their admissible mask and counts (:class:`Rows`);
                only admissible rows may influence the result.
            previous: ``[..., d]`` last round's aggregate (possibly non-finite), or
                None: where an algorithm needs a starting point (centered clipping).
            generator: the seeded stream for randomised rules (bucketing), or None.

        Returns:
            ``[..., d]``, finite wherever the problem has an admissible row; the base
            class replaces the problems without one.
        """


AGGREGATORS: dict[str, type[Aggregator]] = {}


register = registrar(AGGREGATORS, "aggregator")

#: Class decorator of the built-in aggregators: a frozen pydantic dataclass whose bad
#: options raise ``ValueError`` naming ``<aggregator>.<field>`` (:mod:`robust_pfl.engine.validation`).
aggregator_options = options("aggregator")


AggregatorSpec = Union[str, Mapping[str, Any], Aggregator]


def make_aggregator(spec: AggregatorSpec) -> Aggregator:
    """An aggregator from a name (``"median"``), a mapping with ``name`` and options
    (``{"name": "trimmed_mean", "f": 2}``) or an instance (returned as is).  Unknown
    names or options raise ``ValueError`` naming them.  A mapping's ``pre`` key (a
    list of pre-aggregators, :mod:`defenses.preaggregators`) puts them in front:
    ``{"name": "krum", "pre": ["nnm"]}`` is Krum applied after NNM."""
    if isinstance(spec, Aggregator):
        return spec
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("name", None)
        if "pre" in options:
            pre = options.pop("pre")
            inner = make_aggregator({**options, "name": name})
            from defenses.preaggregators import pre_aggregated  # that module imports this one

            return pre_aggregated(inner, pre, where=f"{name}.pre")
    else:
        raise ValueError(
            f"aggregator must be a name or a mapping with 'name', got {spec!r}; "
            f"names: {sorted(AGGREGATORS)}"
        )
    if not isinstance(name, str) or name not in AGGREGATORS:
        hint = did_you_mean(name, AGGREGATORS) if isinstance(name, str) else ""
        raise ValueError(f"aggregator.name must be one of {sorted(AGGREGATORS)}, got {name!r}{hint}")
    check_options(name, f"aggregator {name!r}", options, init_parameters(AGGREGATORS[name]))
    return AGGREGATORS[name](**options)


def describe(cls: type[Aggregator]) -> dict[str, Any]:
    """``{"name", "summary", "reference", "parameters": {field: default},
    "descriptions": {field: one line}}`` for a CLI listing of :data:`AGGREGATORS`."""
    return {
        "name": cls.name,
        "summary": cls.summary,
        "reference": cls.reference,
        "parameters": init_parameters(cls),
        "descriptions": descriptions(cls),
    }


# -- averages and order statistics ---------------------------------------------------------
@register
@aggregator_options
class Mean(Aggregator):
    """The plain average of the admissible rows (FedAvg, McMahan et al. 2017): no
    defense at all, a single large row moves it arbitrarily far."""

    name = "mean"
    summary = "average of the admissible rows (undefended FedAvg)"
    reference = "McMahan et al. 2017, Communication-efficient learning of deep networks (FedAvg)"

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        return _masked_mean(rows.values, rows.admissible)


@register
@aggregator_options
class CoordinateMedian(Aggregator):
    """Coordinate-wise median (Yin et al. 2018, "Byzantine-robust distributed learning:
    towards optimal statistical rates", Def. 1).  For an even number of admissible rows
    it returns the average of the two middle values (the statistical median, as
    ``numpy.median``), not torch's lower median."""

    name = "median"
    summary = "coordinate-wise median (mean of the two middle values for even counts)"
    reference = "Yin, Chen, Ramchandran, Bartlett 2018 (ICML), coordinate-wise median, Def. 1"

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        return coordinate_median(rows)


@aggregator_options
class _ByzantineBudget(Aggregator):
    """An aggregator parametrised by the number ``f`` of Byzantine senders it tolerates:
    ``f`` itself, or ``fraction`` (``f = floor(fraction * n)`` for the ``n`` admissible
    rows); neither given means ``f = 1``."""

    f: Annotated[int | None, Field(ge=0, description="Byzantine senders tolerated (neither f nor fraction: 1)")] = None
    fraction: Annotated[
        float | None, Field(ge=0, lt=0.5, description="f = floor(fraction * n) of the n admissible rows")
    ] = None

    def __post_init__(self) -> None:
        check_one_budget(self.name, self.f, self.fraction)

    def budget(self, n: int) -> int:
        """The ``f`` used with ``n`` rows."""
        return budget_of(self.f, self.fraction, n)

    def _budget(self, count: Tensor, most: Tensor) -> Tensor:
        """Per-problem ``f`` for ``count`` admissible rows, at most ``most`` (>= 0)."""
        return budgets_of(self.f, self.fraction, count, most)


def check_one_budget(name: str, f: int | None, fraction: float | None) -> None:
    """A Byzantine budget is ``f`` or ``fraction``, not both (``ValueError`` naming both)."""
    if f is not None and fraction is not None:
        raise ValueError(f"{name}.f and {name}.fraction: give one of them, not both")


def budget_of(f: int | None, fraction: float | None, n: int) -> int:
    """``f`` for ``n`` rows: ``floor(fraction * n)``, else ``f``, else 1."""
    if fraction is not None:
        return math.floor(fraction * n)
    return 1 if f is None else f


def budgets_of(f: int | None, fraction: float | None, count: Tensor, most: Tensor) -> Tensor:
    """Per-problem ``f`` for ``count[...]`` admissible rows, at most ``most`` (>= 0)."""
    if fraction is not None:
        wanted = (count.to(torch.float64) * fraction).floor().to(count.dtype)
    else:
        wanted = torch.full_like(count, budget_of(f, None, 0))
    return torch.minimum(wanted, most.clamp_min(0))


@register
@aggregator_options
class TrimmedMean(_ByzantineBudget):
    """Coordinate-wise trimmed mean (Yin et al. 2018, Def. 2): per coordinate, drop the
    ``f`` largest and ``f`` smallest values and average the remaining ``n - 2f``.
    Requires ``2f < n``; with fewer admissible rows, ``f`` shrinks to ``(n - 1) // 2``
    (the median)."""

    name = "trimmed_mean"
    summary = "coordinate-wise mean after dropping the f largest and f smallest values"
    reference = "Yin, Chen, Ramchandran, Bartlett 2018 (ICML), coordinate-wise trimmed mean, Def. 2"

    def check(self, n: int) -> None:
        super().check(n)
        f = self.budget(n)
        if not 2 * f < n:
            raise ValueError(f"{self.name}: needs 2*f < n, got f={f}, n={n}")

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        count = rows.count
        f = self._budget(count, (count - 1) // 2)
        return _mean_of_order_statistics(_sorted_columns(rows), count, f, count - f, consume=True)


# -- Krum family -----------------------------------------------------------------------------
def squared_distances(values: Tensor) -> Tensor:
    """``[..., N, N]`` squared distances between the rows of ``values[..., N, d]``.

    Rows narrower than float64 go through their Gram matrix in float64
    (``||a||^2 + ||b||^2 - 2 <a, b>``, clamped at 0): one ``N^2 d`` product at matmul
    speed, far faster than differences (benchmarks/README.md, "Kernel choices"), and
    more accurate than differences in the rows' own dtype, since float32 products are
    exact in float64.  float64 rows keep the exact difference formula."""
    if values.dtype == torch.float64:
        return euclidean_distances(values, values).square()
    wide = values.double()
    gram = wide @ wide.transpose(-1, -2)
    norms = torch.diagonal(gram, dim1=-2, dim2=-1)
    squared = (norms.unsqueeze(-1) + norms.unsqueeze(-2) - 2 * gram).clamp_min(0)
    return squared.to(values.dtype)


def krum_scores(rows: Rows, f: Tensor) -> Tensor:
    """Krum scores ``[..., N]`` (Blanchard et al. 2017, Sec. 4): for each row, the sum of
    squared distances to its ``n - f - 2`` nearest other admissible rows (at least 1).

    Distances are taken between admissible rows only (inadmissible ones are zeroed and
    their distances set to ``inf``); a distance that overflows is ``inf`` ("very far").
    Admissible scores are clamped to the dtype's maximum, inadmissible ones are
    ``inf``, so ranking by score always puts admissible rows first and no NaN arises.
    """
    values, admissible, count = rows
    n = values.shape[-2]
    squared = squared_distances(values)
    self_or_absent = torch.eye(n, dtype=torch.bool, device=values.device) | ~admissible.unsqueeze(-2)
    squared = torch.where(self_or_absent | torch.isnan(squared), torch.full_like(squared, math.inf), squared)
    nearest = squared.sort(dim=-1).values.cumsum(-1)  # only +inf is ever added: no inf - inf
    k = (count - f - 2).clamp_min(1)
    index = (k - 1)[..., None, None].expand(*nearest.shape[:-1], 1)
    scores = nearest.gather(-1, index).squeeze(-1)
    biggest = torch.finfo(values.dtype).max
    scores = torch.nan_to_num(scores, nan=biggest, posinf=biggest)
    return torch.where(admissible, scores, torch.full_like(scores, math.inf))


@aggregator_options
class _KrumFamily(_ByzantineBudget):
    """Shared by Krum and Multi-Krum: scores, then the mean of the ``m`` lowest."""

    def check(self, n: int) -> None:
        super().check(n)
        f = self.budget(n)
        if not n > 2 * f + 2:
            raise ValueError(f"{self.name}: needs n > 2*f + 2, got f={f}, n={n}")

    def flops(self, n: int, d: int) -> float:
        return 3.0 * n * n * d  # the pairwise distances

    def _selected(self, count: Tensor, f: Tensor) -> Tensor:
        raise NotImplementedError

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        count = rows.count
        f = self._budget(count, (count - 3) // 2)  # largest f with n > 2f + 2
        scores = krum_scores(rows, f)
        rank = scores.argsort(dim=-1, stable=True).argsort(dim=-1)
        chosen = (rank < self._selected(count, f).unsqueeze(-1)) & rows.admissible
        return _masked_mean(rows.values, chosen)


@register
@aggregator_options
class Krum(_KrumFamily):
    """Krum (Blanchard, El Mhamdi, Guerraoui, Stainer 2017, Sec. 4): the row with the
    smallest score ``sum_{j in n-f-2 nearest} ||x_i - x_j||^2``.  Requires
    ``n > 2f + 2``; ties go to the lowest index."""

    name = "krum"
    summary = "the row whose n-f-2 nearest neighbours are closest (squared distances)"
    reference = "Blanchard, El Mhamdi, Guerraoui, Stainer 2017 (NeurIPS), Krum, Sec. 4"

    def _selected(self, count: Tensor, f: Tensor) -> Tensor:
        return torch.ones_like(count)


@register
@aggregator_options
class MultiKrum(_KrumFamily):
    """Multi-Krum (Blanchard et al. 2017, the m-Krum variant): the mean of the ``m`` rows with the
    lowest Krum scores; ``m = n - f`` by default (El Mhamdi et al. 2018).  Requires
    ``n > 2f + 2`` and ``m <= n``."""

    name = "multi_krum"
    summary = "mean of the m rows with the lowest Krum scores (default m = n - f)"
    reference = "Blanchard, El Mhamdi, Guerraoui, Stainer 2017 (NeurIPS), Multi-Krum (m-Krum)"

    m: Annotated[int | None, Field(ge=1, description="rows averaged (default n - f)")] = None

    def check(self, n: int) -> None:
        super().check(n)
        if self.m is not None and self.m > n:
            raise ValueError(f"{self.name}: needs m <= n, got m={self.m}, n={n}")

    def _selected(self, count: Tensor, f: Tensor) -> Tensor:
        if self.m is None:
            return count - f
        return count.clamp_max(self.m)


# -- geometric median and centered clipping ------------------------------------------------
@register
@aggregator_options
class GeometricMedian(Aggregator):
    """Geometric median ``argmin_z sum_j ||z - x_j||`` by Weiszfeld iterations, as in
    RFA (Pillutla, Kakade, Harchaoui 2022, "Robust aggregation for federated
    learning", smoothed Weiszfeld algorithm), for ``iterations`` steps::

        T(z) = sum_{j far} w_j x_j / sum_{j far} w_j,   w_j = 1 / ||z - x_j||
        z   <- z + (1 - min(1, eta / r)) (T(z) - z)

    where rows within ``nu`` of ``z`` (RFA's smoothing parameter) count as coinciding
    with it, ``eta`` is their number and ``r = ||sum_{j far} w_j (x_j - z)||``: the
    Vardi & Zhang (2000, PNAS, "The multivariate L1-median and associated data depth")
    correction.  Without it, RFA's weight ``1 / max(nu, 0) = 1 / nu`` pins an iterate
    that sits on a row to that row for many steps (measured: a start on a non-optimal
    row barely moves); with it, ``z`` stays on a row only when that row is optimal
    (``r <= eta``), and the steps are plain Weiszfeld steps (weights ``1 / ||z - x_j||``)
    otherwise.

    It starts from the coordinate-wise median rather than the mean, so one huge row
    (a 1e6 large gradient) cannot place the start far away; in low dimension that
    start is often a row, hence the correction.  Every iterate lies between the
    previous one and a convex combination of admissible rows, hence is finite.
    """

    name = "geometric_median"
    summary = "Weiszfeld geometric median (RFA), started at the coordinate-wise median"
    reference = (
        "Pillutla, Kakade, Harchaoui 2022 (IEEE TSP), RFA, smoothed Weiszfeld; "
        "Vardi & Zhang 2000 (PNAS), modified Weiszfeld"
    )

    iterations: Annotated[int, Field(ge=0, description="Weiszfeld steps")] = 10
    nu: Annotated[float, Field(gt=0, description="RFA's smoothing: rows within nu of z coincide with it")] = 1e-6

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        z = coordinate_median(rows)
        scratch = torch.empty_like(rows.values) if self.iterations else None  # one [N, d] for every step
        for _ in range(self.iterations):
            difference = torch.sub(rows.values, z.unsqueeze(-2), out=scratch)
            distance = row_norms(difference)
            far = rows.admissible & (distance > self.nu)
            weight = torch.where(far, distance.reciprocal(), torch.zeros_like(distance))  # inf: 0
            total = weight.sum(-1, keepdim=True)  # 0: every row coincides with z or is infinitely far
            pull = _weighted_sum(difference, weight)  # r's vector, sum_j w_j (x_j - z)
            step = pull / torch.where(total > 0, total, torch.ones_like(total))  # T(z) - z
            eta = (rows.admissible & ~far).sum(-1, keepdim=True).to(z.dtype)  # rows at z
            stay = (eta / row_norms(pull.unsqueeze(-2))).clamp_max(1.0)  # r = 0: inf -> 1
            stay = torch.where(eta > 0, stay, torch.zeros_like(stay))
            z = z + (1 - stay) * step
        return z


@register
@aggregator_options
class CenteredClipping(Aggregator):
    """Centered clipping (Karimireddy, He, Jaggi 2021, "Learning from history for
    Byzantine robust optimization", the CC rule)::

        v <- v + (1/n) sum_j clip(x_j - v, tau),   clip(y, tau) = y min(1, tau / ||y||)

    for ``iterations`` steps ``L``.  The start ``v`` is ``previous`` (last round's
    aggregate, as in the paper) where given and admissible, else the coordinate-wise
    median.  Each step moves ``v`` by at most ``tau``.
    """

    name = "centered_clipping"
    summary = "iterative clipping of the rows around the previous aggregate (radius tau)"
    reference = "Karimireddy, He, Jaggi 2021 (ICML), Learning from history, centered clipping (CC)"

    tau: Annotated[float, Field(gt=0, description="clipping radius")] = 10.0
    iterations: Annotated[int, Field(ge=1, description="clipping steps L")] = 1

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        usable = _admissible_or_none(previous)
        shape = (*rows.values.shape[:-2], rows.values.shape[-1])
        if usable is not None and bool(usable.all()) and previous.shape == shape:
            v = previous  # the median start is not needed
        else:
            v = coordinate_median(rows)
            if usable is not None:
                v = torch.where(usable.unsqueeze(-1), previous, v)
        scratch = torch.empty_like(rows.values)  # one [N, d] for every step
        for _ in range(self.iterations):
            difference = torch.sub(rows.values, v.unsqueeze(-2), out=scratch)
            scale = (self.tau / row_norms(difference)).clamp_max(1.0)  # ||y|| = 0 gives 1
            scale = torch.where(rows.admissible, scale, torch.zeros_like(scale))
            v = v + _weighted_sum(difference, scale) / per_problem(rows.count, v)
        return v


# -- bucketing -------------------------------------------------------------------------------
@register
@aggregator_options
class Bucketing(Aggregator):
    """Bucketing (Karimireddy, He, Jaggi 2022, "Byzantine-robust learning on
    heterogeneous datasets via bucketing", Alg. 1): randomly permute the admissible
    rows, average consecutive buckets of ``s`` (the last one may be smaller) and apply
    ``inner`` to the ``ceil(n / s)`` bucket means.

    The permutation is drawn from ``generator`` (one ``rand`` of shape ``[..., N]``);
    without a generator the rows keep their given order (deterministic, but then an
    attacker choosing its row positions defeats the mixing; the Global algorithm
    always passes its own seeded stream).  Inadmissible rows are dropped before
    bucketing.  ``inner`` is any aggregator spec (default ``"median"``).
    """

    name = "bucketing"
    summary = "random buckets of s rows averaged, then an inner robust aggregator"
    reference = "Karimireddy, He, Jaggi 2022 (ICLR), Byzantine-robust learning ... via bucketing, Alg. 1"

    inner: Annotated[
        Any, Field(validate_default=True, description="the aggregator of the bucket means (a name or {name = ...})")
    ] = "median"
    s: Annotated[int, Field(ge=1, description="rows per bucket")] = 2

    @field_validator("inner")
    @classmethod
    def _inner_aggregator(cls, inner: Any) -> Aggregator:
        return make_aggregator(inner)  # a ValueError names its own field, after "bucketing.inner: "

    def check(self, n: int) -> None:
        super().check(n)
        try:
            self.inner.check(math.ceil(n / self.s))
        except ValueError as error:
            raise ValueError(f"{self.name} (s={self.s}, {math.ceil(n / self.s)} buckets of n={n}): {error}") from None

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        means, present = bucket_means(rows, self.s, generator)
        if not bool(present.all()):  # an empty bucket is absent
            means = torch.where(present.unsqueeze(-1), means, torch.full_like(means, math.nan))
        return self.inner(means, previous, generator)


def bucket_means(rows: Rows, s: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Karimireddy, He, Jaggi 2022, Alg. 1 lines 1-2: the admissible rows permuted at
    random (one float64 ``rand`` of shape ``[..., N]`` from ``generator``, inadmissible
    rows last; without a generator the given order) and the means of consecutive
    buckets of ``s``: ``(means[..., ceil(N / s), d], present[..., ceil(N / s)])``,
    ``present`` False for a bucket without an admissible row."""
    values, admissible, _ = rows
    n, d = values.shape[-2:]
    batch = values.shape[:-2]
    if generator is None:
        keys = torch.arange(n, dtype=torch.float64, device=values.device).expand(*batch, n)
    else:
        keys = torch.rand((*batch, n), generator=generator, dtype=torch.float64, device=generator.device)
        keys = keys.to(values.device)
    keys = torch.where(admissible, keys, torch.full_like(keys, math.inf))  # inadmissible last
    order = keys.argsort(dim=-1, stable=True)
    if batch:
        permuted = values.gather(-2, order.unsqueeze(-1).expand(*batch, n, d))
    else:  # one problem: a row gather, without an index per coordinate
        permuted = values.index_select(0, order)
    present = admissible.gather(-1, order)
    buckets = math.ceil(n / s)
    pad = buckets * s - n
    if pad:
        permuted = torch.cat([permuted, permuted.new_zeros(*batch, pad, d)], dim=-2)
        present = torch.cat([present, present.new_zeros(*batch, pad)], dim=-1)
    sums = permuted.reshape(*batch, buckets, s, d).sum(-2)
    sizes = present.reshape(*batch, buckets, s).sum(-1)
    return sums / per_problem(sizes, sums), sizes > 0
