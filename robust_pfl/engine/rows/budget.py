"""The Byzantine budget ``f`` of a robust aggregator or pre-aggregator: ``f`` itself,
or ``fraction`` (``f = floor(fraction * n)`` of the ``n`` admissible rows), declared
once (:class:`ByzantineBudget`) for every rule that takes one.

A budget left unset follows the run: a run sets it to its Byzantine count
(:meth:`ByzantineBudget.with_run_budget`), as ByzFL's benchmark does (``f`` = the
number of Byzantine clients); a budget set below that count is kept and reported
(:meth:`ByzantineBudget.budget_shortfalls`).  Outside a run (an aggregator built and
called by hand) an unset budget means ``f = 1``."""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass
from torch import Tensor

from robust_pfl.engine.validation import OPTIONS_CONFIG


@dataclass(frozen=True, config=OPTIONS_CONFIG)
class ByzantineBudget:
    """The option fields of a rule parametrised by the number ``f`` of Byzantine rows it
    tolerates: ``f``, or ``fraction`` (``f = floor(fraction * n)`` of the ``n``
    admissible rows); neither given: the run's Byzantine count (1 outside a run).  A
    mixin of the aggregator and pre-aggregator base classes, whose own decorator makes
    the subclass's dataclass."""

    f: Annotated[
        int | None, Field(ge=0, description="Byzantine rows tolerated (unset: the run's Byzantine count)")
    ] = None
    fraction: Annotated[
        float | None, Field(ge=0, lt=0.5, description="f = floor(fraction * n) of the n admissible rows")
    ] = None

    def __post_init__(self) -> None:
        check_one_budget(self.name, self.f, self.fraction)

    @property
    def budget_unset(self) -> bool:
        """Neither ``f`` nor ``fraction`` given."""
        return self.f is None and self.fraction is None

    def with_run_budget(self, byzantine: int) -> Any:
        """This rule with an unset budget set to ``f = byzantine`` (the run's Byzantine
        count); a rule whose budget is given is returned as it is."""
        return dataclasses.replace(self, f=byzantine) if self.budget_unset else self

    def budget_shortfalls(self, byzantine: int, n: int, where: str) -> list[tuple[str, str]]:
        """``(field, message)`` where the given budget tolerates fewer rows than the
        run's ``byzantine`` clients among its ``n`` senders: ``<where>.f`` or
        ``<where>.fraction``; empty for an unset budget (it follows the run)."""
        if self.f is not None and self.f < byzantine:
            return [(f"{where}.f", f"f = {self.f} is below the run's {byzantine} Byzantine clients "
                     f"(unset, f follows the run)")]
        if self.fraction is not None and budget_of(None, self.fraction, n) < byzantine:
            return [(f"{where}.fraction", f"fraction = {self.fraction} gives f = {budget_of(None, self.fraction, n)} "
                     f"of n = {n}, below the run's {byzantine} Byzantine clients (unset, f follows the run)")]
        return []

    def budget(self, n: int) -> int:
        """The ``f`` used with ``n`` rows."""
        return budget_of(self.f, self.fraction, n)

    def budgets(self, count: Tensor, most: Tensor) -> Tensor:
        """Per-problem ``f`` for ``count[...]`` admissible rows, at most ``most`` (>= 0)."""
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
