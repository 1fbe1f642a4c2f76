"""Bucketing: random buckets of rows averaged, then an inner aggregator."""

from __future__ import annotations

import math
from typing import Annotated, Any

import torch
from pydantic import Field, field_validator
from torch import Tensor

from defenses.aggregators.base import Aggregator, aggregator_options, register
from defenses.aggregators.factory import make_aggregator
from defenses.aggregators.statistics import bucket_means
from robust_pfl.engine.rows import Rows


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

    def with_run_budget(self, byzantine: int) -> Aggregator:
        """``inner``'s unset budget set to ``byzantine``: at most that many bucket means
        hold a Byzantine row."""
        return Bucketing(inner=self.inner.with_run_budget(byzantine), s=self.s)

    def budget_shortfalls(self, byzantine: int, n: int, where: str) -> list[tuple[str, str]]:
        """``inner``'s shortfalls over the ``ceil(n / s)`` bucket means."""
        return self.inner.budget_shortfalls(byzantine, math.ceil(n / self.s), f"{where}.inner")

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        means, present = bucket_means(rows, self.s, generator)
        if not bool(present.all()):  # an empty bucket is absent
            means = torch.where(present.unsqueeze(-1), means, torch.full_like(means, math.nan))
        return self.inner(means, previous, generator)
