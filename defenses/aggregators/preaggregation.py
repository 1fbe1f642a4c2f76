"""Pre-aggregators: maps from rows to rows applied before a robust aggregator, as in
ByzFL (``byzfl.NNM``, ``byzfl.Bucketing``, ``byzfl.Clipping``, ``byzfl.ARC``).

A configuration chains them in front of any aggregator with the key ``pre``::

    aggregator = { name = "krum", pre = ["nnm", { name = "clipping", tau = 1.0 }] }

applies nearest-neighbour mixing, then static clipping, then Krum
(:func:`defenses.aggregators.make_aggregator` builds a :class:`PreAggregated`).
A pre-aggregator maps ``[..., N, d]`` to ``[..., M, d]`` (``M = N`` except for
bucketing), batched over leading problem dimensions like the aggregators.

Inadmissible rows (a NaN / Inf coordinate or an overflowing squared norm, see
:mod:`robust_pfl.engine.rows`) are dropped *before* each step: a step sees only
the admissible rows, its counts (``n`` in ``f = floor(fraction * n)``, NNM's ``n - f``
neighbours, ARC's ``k``) are those of the admissible rows, and an inadmissible input
row never influences an output row.  Its output position stays inadmissible (NNM,
clipping, ARC), and for bucketing a bucket without an admissible row is inadmissible;
an output row whose squared norm overflows is inadmissible too.  The public
:meth:`PreAggregator.__call__` writes NaN rows at the inadmissible output positions,
so the next step (or the aggregator) drops them.

Conventions against ByzFL: ``f`` is given as ``f`` or ``fraction`` (``f = floor(fraction
* n)`` of the ``n`` admissible rows), as for :class:`~defenses.aggregators.TrimmedMean`;
neither given means ``f = 1`` (ByzFL's default is ``f = 0``, i.e. no mixing or
clipping).  NNM and ARC require ``2f < n`` (the papers' ``f < n/2``) and, where dropped
rows leave fewer admissible rows, shrink ``f`` to ``(n - 1) // 2``.  ByzFL's
``Clipping(c)`` is ``{name = "clipping", tau = c}``, ``Bucketing(s)`` is
``{name = "bucketing", s = s}`` (ByzFL's default ``s = 1``, ours 2, as the bucketing
aggregator's), and ARC's ``k`` is the exact integer ``floor(2 f (n - f) / n)``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Union

import torch
from pydantic import Field, field_validator
from torch import Tensor

from defenses.aggregators.base import Aggregator, aggregator_options
from defenses.aggregators.statistics import bucket_means, checked_budget
from robust_pfl.engine.registry import check_options, init_parameters, named_spec, registrar
from robust_pfl.engine.rows import ByzantineBudget, Rows, admissible_points, per_problem, row_norms, wide_squared_distances
from robust_pfl.engine.validation import options


def settled(values: Tensor, admissible: Tensor) -> Rows:
    """A step's output as :class:`Rows`: rows already inadmissible, and rows whose
    squared norm overflows, are marked inadmissible and zeroed."""
    admissible = admissible & admissible_points(values)
    if not bool(admissible.all()):
        values = torch.where(admissible.unsqueeze(-1), values, torch.zeros_like(values))
    return Rows(values, admissible, admissible.sum(-1))


def scaled_to(rows: Rows, bound: Tensor | float) -> Tensor:
    """Each admissible row scaled to norm at most ``bound`` (``[...]`` or a number):
    ``x min(1, bound / ||x||)``; rows within the bound are returned exactly."""
    norms = row_norms(rows.values)
    if isinstance(bound, Tensor):
        bound = bound.unsqueeze(-1)
    over = rows.admissible & (norms > bound)
    scale = torch.where(over, bound / torch.where(over, norms, torch.ones_like(norms)), torch.ones_like(norms))
    return rows.values * scale.unsqueeze(-1)


class PreAggregator(ABC):
    """Base class of a pre-aggregator: ``__call__(messages[..., N, d], generator=None)``
    -> ``[..., M, d]``, NaN rows where the output is inadmissible.

    A subclass is a frozen dataclass whose fields are its options; it declares
    ``name``, ``summary`` and ``reference`` (as an aggregator does), implements
    :meth:`pre_aggregate_rows`, and overrides :meth:`rows_out` when it changes the
    number of rows and :meth:`check` when it refuses some ``n``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str] = ""

    def check(self, n: int) -> None:
        """Raise ``ValueError`` if the step cannot work with ``n`` rows."""
        if n < 1:
            raise ValueError(f"{self.name}: needs at least one row, got n={n}")

    def with_run_budget(self, byzantine: int) -> PreAggregator:
        """This step with an unset Byzantine budget set to the run's ``byzantine``
        count (as :meth:`Aggregator.with_run_budget`); a step without one is itself."""
        return self

    def budget_shortfalls(self, byzantine: int, n: int, where: str) -> list[tuple[str, str]]:
        """``(field, message)`` for a given budget below the run's count; none by default."""
        return []

    def rows_out(self, n: int) -> int:
        """The number of rows the step returns for ``n``."""
        return n

    @abstractmethod
    def pre_aggregate_rows(self, rows: Rows, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """``(values[..., M, d], admissible[..., M])`` from the admissible rows of
        ``rows`` only (inadmissible ones are zeroed); :meth:`apply` settles them."""

    def apply(self, rows: Rows, generator: torch.Generator | None = None) -> Rows:
        """The step on prepared rows, its output settled (:func:`settled`)."""
        return settled(*self.pre_aggregate_rows(rows, generator))

    def __call__(self, messages: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if messages.dim() < 2 or not messages.is_floating_point():
            raise ValueError(
                f"{self.name}: messages must be a floating tensor [..., N, d], got "
                f"{messages.dtype} of shape {tuple(messages.shape)}"
            )
        self.check(messages.shape[-2])
        out = self.apply(Rows.of(messages), generator)
        return torch.where(out.admissible.unsqueeze(-1), out.values, torch.full_like(out.values, math.nan))


PRE_AGGREGATORS: dict[str, type[PreAggregator]] = {}


register = registrar(PRE_AGGREGATORS, "pre-aggregator")


#: Class decorator of the built-in pre-aggregators (see ``aggregator_options``).
pre_aggregator_options = options("pre-aggregator")


PreAggregatorSpec = Union[str, Mapping[str, Any], PreAggregator]


def make_pre_aggregator(spec: PreAggregatorSpec, where: str = "pre") -> PreAggregator:
    """A pre-aggregator from a name, a mapping with ``name`` and options, or an
    instance (returned as is); a bad one raises ``ValueError`` naming ``where``."""
    if isinstance(spec, PreAggregator):
        return spec
    name, chosen = named_spec(spec, PRE_AGGREGATORS, where)
    cls = PRE_AGGREGATORS[name]
    try:
        check_options(name, f"pre-aggregator {name!r}", chosen, init_parameters(cls))
        return cls(**chosen)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def make_pre_aggregators(specs: Any, where: str = "pre") -> tuple[PreAggregator, ...]:
    """The steps of a ``pre`` list (a list or tuple of specs), ``where[i]`` naming a bad one."""
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Sequence):
        raise ValueError(
            f"{where} must be a list of pre-aggregators (names or {{name = ...}}), got {specs!r}; "
            f"names: {sorted(PRE_AGGREGATORS)}"
        )
    return tuple(make_pre_aggregator(spec, f"{where}[{i}]") for i, spec in enumerate(specs))


@aggregator_options
class PreAggregated(Aggregator):
    """``inner`` applied to the rows the ``pre`` steps return, in order (ByzFL's
    pre-aggregation): ``inner(pre[-1](... pre[0](x)))``.  Inadmissible rows are dropped
    before each step and before ``inner`` (module docstring); the generator is passed
    to every step and then to ``inner``, which draw from it in that order.  Built by
    ``make_aggregator({name = ..., pre = [...]})``; not registered itself."""

    name = "pre_aggregated"
    summary = "an aggregator applied after a chain of pre-aggregators"
    reference = "Allouah et al. 2023 (AISTATS), Fixing by mixing: pre-aggregation; ByzFL"

    inner: Annotated[Any, Field(description="the aggregator applied last (a name or {name = ...})")]
    pre: Annotated[Any, Field(description="the pre-aggregators, in order (names or {name = ...})")] = ()

    @field_validator("inner")
    @classmethod
    def _inner_aggregator(cls, inner: Any) -> Aggregator:
        if not isinstance(inner, Aggregator):  # specs are built by make_aggregator, which builds this
            raise ValueError(f"must be an Aggregator, got {inner!r}")
        return inner

    @field_validator("pre")
    @classmethod
    def _steps(cls, pre: Any) -> tuple[PreAggregator, ...]:
        return make_pre_aggregators(pre)

    def check(self, n: int) -> None:
        super().check(n)
        rows = n
        for i, step in enumerate(self.pre):
            try:
                step.check(rows)
            except ValueError as error:
                raise ValueError(f"{self.inner.name}.pre[{i}] ({rows} rows of n={n}): {error}") from None
            rows = step.rows_out(rows)
        try:
            self.inner.check(rows)
        except ValueError as error:
            raise ValueError(f"{self.inner.name} after its pre-aggregation ({rows} rows of n={n}): {error}") from None

    def with_run_budget(self, byzantine: int) -> Aggregator:
        """Every step's and ``inner``'s unset budget set to ``byzantine``."""
        steps = tuple(step.with_run_budget(byzantine) for step in self.pre)
        return PreAggregated(inner=self.inner.with_run_budget(byzantine), pre=steps)

    def budget_shortfalls(self, byzantine: int, n: int, where: str) -> list[tuple[str, str]]:
        """The steps' shortfalls (``<where>.pre[i]``, with the rows each step sees), then
        ``inner``'s (``<where>``: the config writes inner's options beside ``pre``)."""
        out, rows = [], n
        for i, step in enumerate(self.pre):
            out += step.budget_shortfalls(byzantine, rows, f"{where}.pre[{i}]")
            rows = step.rows_out(rows)
        return out + self.inner.budget_shortfalls(byzantine, rows, where)

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        for step in self.pre:
            rows = step.apply(rows, generator)
        marked = torch.where(rows.admissible.unsqueeze(-1), rows.values, torch.full_like(rows.values, math.nan))
        return self.inner(marked, previous, generator)


def pre_aggregated(inner: Aggregator, pre: Any, where: str = "pre") -> Aggregator:
    """``inner`` behind the ``pre`` steps (``inner`` itself for an empty list); a bad
    step raises ``ValueError`` naming ``where[i]``."""
    steps = make_pre_aggregators(pre, where)
    return PreAggregated(inner=inner, pre=steps) if steps else inner


@pre_aggregator_options
class BudgetedPreAggregator(ByzantineBudget, PreAggregator):
    """A step parametrised by the number ``f`` of Byzantine rows, as
    ``BudgetedAggregator``: ``f``, or ``fraction`` (``f = floor(fraction * n)`` of the
    ``n`` admissible rows); neither: the run's Byzantine count (1 outside a run).  Requires ``2f < n``; fewer
    admissible rows shrink ``f`` to ``(n - 1) // 2``."""

    def check(self, n: int) -> None:
        super().check(n)
        checked_budget(self, n)

    def shrunk_budgets(self, count: Tensor) -> Tensor:
        """Per-problem ``f`` for ``count`` admissible rows: at most ``(count - 1) // 2``."""
        return self.budgets(count, (count - 1) // 2)


@register
@pre_aggregator_options
class NearestNeighbourMixing(BudgetedPreAggregator):
    """Nearest-neighbour mixing, NNM (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot,
    Stephan 2023, "Fixing by mixing: a recipe for optimal Byzantine ML under
    heterogeneity", AISTATS, Alg. 1): each row is replaced by the mean of its ``n - f``
    nearest rows in Euclidean distance, itself included::

        y_i = (1 / (n - f)) sum_{j in N_i} x_j,   N_i = the n - f nearest x_j to x_i

    over the ``n`` admissible rows (inadmissible rows are in no ``N_i``).  Equal
    distances go to the lower index.  ByzFL: ``NNM(f)`` is ``{name = "nnm", f = f}``
    (ByzFL's default ``f = 0``, ours 1)."""

    name = "nnm"
    summary = "each row replaced by the mean of its n - f nearest rows (itself included)"
    reference = "Allouah et al. 2023 (AISTATS), Fixing by mixing, nearest neighbour mixing (NNM), Alg. 1"

    def pre_aggregate_rows(self, rows: Rows, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        values, admissible, count = rows
        n = values.shape[-2]
        k = count - self.shrunk_budgets(count)  # neighbours per row, >= 1 where count >= 1
        squared = wide_squared_distances(values)
        big = torch.finfo(squared.dtype).max  # an overflowing distance: far, but admissible
        squared = torch.nan_to_num(squared, nan=big, posinf=big)
        squared = squared.masked_fill(torch.eye(n, dtype=torch.bool, device=values.device), 0.0)
        squared = torch.where(admissible.unsqueeze(-2), squared, torch.full_like(squared, math.inf))
        rank = squared.argsort(dim=-1, stable=True).argsort(dim=-1)  # rank of column j in row i
        chosen = (rank < k[..., None, None]) & admissible.unsqueeze(-2)
        mixed = (chosen.to(values.dtype) @ values) / per_problem(k, values).unsqueeze(-1)
        return mixed, admissible


@register
@pre_aggregator_options
class BucketMeans(PreAggregator):
    """Bucketing as a pre-aggregator (Karimireddy, He, Jaggi 2022, "Byzantine-robust
    learning on heterogeneous datasets via bucketing", ICLR, Alg. 1, lines 1-2):
    permute the admissible rows at random and return the means of consecutive buckets
    of ``s`` (the last one may be smaller), ``ceil(N / s)`` rows; buckets without an
    admissible row are inadmissible.

    The permutation is drawn from ``generator`` exactly as the ``bucketing``
    aggregator draws it (one float64 ``rand`` of shape ``[..., N]``, inadmissible rows
    last; no generator keeps the given order), so ``{name = "m", pre = [{name =
    "bucketing", s = s}]}`` equals ``{name = "bucketing", inner = "m", s = s}``.
    ByzFL: ``Bucketing(s)`` is ``{name = "bucketing", s = s}`` (ByzFL's default ``s =
    1``, ours 2)."""

    name = "bucketing"
    summary = "means of s randomly permuted rows (ceil(n / s) rows out)"
    reference = "Karimireddy, He, Jaggi 2022 (ICLR), Byzantine-robust learning ... via bucketing, Alg. 1"

    s: Annotated[int, Field(ge=1, description="rows per bucket")] = 2

    def rows_out(self, n: int) -> int:
        return math.ceil(n / self.s)

    def pre_aggregate_rows(self, rows: Rows, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        return bucket_means(rows, self.s, generator)


@register
@pre_aggregator_options
class StaticClipping(PreAggregator):
    """Static clipping: each row scaled to norm at most ``tau``,
    ``x_i min(1, tau / ||x_i||)`` (the clipping operator of Allouah et al. 2024,
    Sec. 2; ByzFL's ``Clipping(c)`` is ``{name = "clipping", tau = c}``, same default 2)."""

    name = "clipping"
    summary = "each row scaled to norm at most tau"
    reference = "Allouah et al. 2024, Boosting robustness by clipping gradients in distributed learning, Sec. 2"

    tau: Annotated[float, Field(gt=0, description="clipping radius")] = 2.0

    def pre_aggregate_rows(self, rows: Rows, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        return scaled_to(rows, self.tau), rows.admissible


@register
@pre_aggregator_options
class AdaptiveRobustClipping(BudgetedPreAggregator):
    """Adaptive robust clipping, ARC (Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan
    2024, "Boosting robustness by clipping gradients in distributed learning", first
    titled "The vital role of gradient clipping in Byzantine-resilient distributed
    learning", arXiv:2405.14432, Alg. 1): with ``k = floor(2 (f / n) (n - f))``, every
    row is clipped to ``C``, the norm of the ``(k+1)``-th largest-norm row, i.e. the
    ``k`` largest-norm rows are scaled to the norm of the largest remaining one::

        y_i = x_i min(1, C / ||x_i||)

    over the ``n`` admissible rows.  ``k`` is the exact integer ``(2 f (n - f)) // n``
    (ByzFL computes it in floating point).  ByzFL: ``ARC(f)`` is ``{name = "arc", f = f}``
    (ByzFL's default ``f = 0``, i.e. no clipping; ours 1)."""

    name = "arc"
    summary = "the floor(2 (f/n)(n - f)) largest-norm rows clipped to the next largest norm"
    reference = "Allouah et al. 2024, Boosting robustness by clipping gradients in distributed learning, ARC, Alg. 1"

    def pre_aggregate_rows(self, rows: Rows, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        values, admissible, count = rows
        if values.shape[-2] == 0:
            return values, admissible
        f = self.shrunk_budgets(count)
        k = (2 * f * (count - f)) // count.clamp_min(1)  # < count where count >= 1
        norms = row_norms(values)
        descending = torch.where(admissible, norms, torch.full_like(norms, -math.inf)).sort(-1, descending=True).values
        bound = descending.gather(-1, k.clamp_max(values.shape[-2] - 1).unsqueeze(-1)).squeeze(-1)
        bound = torch.where(count > 0, bound, torch.zeros_like(bound))
        return scaled_to(rows, bound), admissible
