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

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping, Union

import torch
from torch import Tensor

from robust_pfl.engine.registry import init_parameters, registrar
from robust_pfl.engine.rows import ByzantineBudget, Rows, admissible_previous
from robust_pfl.engine.validation import descriptions, options


class Aggregator(ABC):
    """Base class of a robust aggregator: ``__call__(messages[..., N, d],
    previous=None, generator=None)`` -> ``[..., d]``, batched over leading dimensions
    (independent aggregation problems).

    A subclass is a frozen dataclass whose fields are its options; it declares, as
    class attributes, ``name`` (the registry key a config names), ``summary`` (one
    line for ``robust-pfl defenses``, which lists the aggregators after the
    algorithms) and ``reference`` (its paper), and implements :meth:`aggregate_rows`.  It may override :meth:`check` to refuse sender counts it
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

    def with_run_budget(self, byzantine: int) -> Aggregator:
        """This aggregator with every unset Byzantine budget (its own, an inner
        aggregator's, a pre-aggregator's) set to the run's ``byzantine`` count
        (:mod:`robust_pfl.engine.rows.budget`); an aggregator without one is itself."""
        return self

    def budget_shortfalls(self, byzantine: int, n: int, where: str) -> list[tuple[str, str]]:
        """``(field, message)`` for each given budget below the run's ``byzantine``
        count, with ``n`` senders and the aggregator at ``where``; none by default."""
        return []

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
        usable = admissible_previous(previous)
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


def describe(cls: type) -> dict[str, Any]:
    """``{"name", "summary", "reference", "parameters": {field: default},
    "descriptions": {field: one line}}`` of an aggregator or pre-aggregator class, for
    a CLI listing."""
    return {
        "name": cls.name,
        "summary": cls.summary,
        "reference": cls.reference,
        "parameters": init_parameters(cls),
        "descriptions": descriptions(cls),
    }


@aggregator_options
class BudgetedAggregator(ByzantineBudget, Aggregator):
    """An aggregator parametrised by the number ``f`` of Byzantine senders it tolerates:
    ``f`` itself, or ``fraction`` (``f = floor(fraction * n)`` for the ``n`` admissible
    rows); neither given: the run's Byzantine count (``f = 1`` outside a run)."""

