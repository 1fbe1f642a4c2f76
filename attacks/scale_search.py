"""Optimal ALIE and optimal IPM: ALIE's ``z`` and IPM's ``eps`` tuned against the defense.

ByzFL (Gonzalez, Guerraoui, Pinot, Rizk, Stephan & Taiani, "ByzFL: research
framework for robust federated learning", arXiv 2025; its attacks
``Optimal_ALittleIsEnough`` and ``Optimal_InnerProductManipulation``) pick the scale of the two statistical attacks
(:mod:`attacks.statistical`) by a line search that maximises the deviation of the
defense's output from the honest mean, ``||aggregate(delivered) - honest_mean||``.
Here the search is the :class:`~attacks.search.Optimised` wrapper's (composed, not
re-implemented): each attack builds an ``optimised`` wrapper over its base attack at
a reference scale and searches its own parameter ``z`` (resp. ``eps``), mapped onto
the wrapper's scale, with the wrapper's rules (:func:`attacks.search.maximise_scale`:
the grid, then a line search from 0 that doubles its step while the damage grows, so
that no scale is out of reach, then a refinement; the defense's
``context.defense_state["aggregate"]``, else the plain mean; one value per call;
non-finite damages ignored; ties to the value evaluated first).  The line search runs
on ``z`` and ``eps`` themselves, from 0, as ByzFL's does.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar

from pydantic import Field
from torch import Tensor

from attacks.base import attack_options, register
from attacks.search import LINE_EVALUATIONS, REFINE_STEPS, Optimised
from robust_pfl.engine.types import AttackBase, AttackContext

#: ``z`` values tried by :class:`OptimalALIE` (in honest standard deviations).
Z_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0)
#: ``eps`` values tried by :class:`OptimalIPM` (rows ``-eps * honest mean``).
EPS_GRID: tuple[float, ...] = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0)


class _GridOverBase(AttackBase):
    """What both attacks share: an :class:`~attacks.search.Optimised` wrapper over
    ``base`` (its rows at a reference scale), built at construction, searching the
    subclass's parameter (``grid`` first) mapped to the wrapper's scale by
    :meth:`to_scale`."""

    base: ClassVar[dict[str, Any]]

    @staticmethod
    def to_scale(value: float) -> float:
        """The wrapper's scale of one ``grid`` value."""
        return value

    def __post_init__(self) -> None:
        wrapper = Optimised(base=self.base, scales=tuple(self.to_scale(v) for v in self.grid),
                            line_evaluations=self.line_evaluations, refine_steps=self.refine_steps)
        object.__setattr__(self, "search", wrapper)

    @property
    def scales(self) -> tuple[float, ...]:
        """The wrapper's scales of the values of ``grid``."""
        return tuple(self.search.scales)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return self.search.search(messages, context, self.grid, self.to_scale)


@register
@attack_options
class OptimalALIE(_GridOverBase):
    """Optimal ALIE (ByzFL's ``Optimal_ALittleIsEnough``; ALIE is Baruch, Baruch &
    Goldberg, NeurIPS 2019): every Byzantine row is ``mean - z * std`` of the
    honest rows (sample std, as :class:`~attacks.statistical.ALIE`), with ``z >= 0`` the
    value found (``grid``, line search, refinement) whose rows move the defense's
    aggregate farthest from the honest mean.

    Implemented through ``optimised(base={"name": "alie", "z": 1})``: the wrapper's
    candidate ``mean + s * (ALIE_1 - mean)`` is ``mean - s * std``, so its scale is
    ``z`` itself.
    """

    name: ClassVar[str] = "optimal_alie"
    summary: ClassVar[str] = "ALIE with z searched (grid, unbounded line search) to maximise the defense's deviation"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive"})
    grid: Annotated[
        tuple[Annotated[float, Field(ge=0)], ...],
        Field(min_length=1, strict=False, description="the z values tried first, in order (ties: the first)"),
    ] = Z_GRID
    line_evaluations: Annotated[int, Field(ge=0, description="probes of the line search from 0; 0: none")] = (
        LINE_EVALUATIONS)
    refine_steps: Annotated[int, Field(ge=0, description="halvings of the refinement; 0: none")] = REFINE_STEPS
    search: Any = dataclasses.field(init=False, repr=False, compare=False)  # the optimised wrapper
    base: ClassVar[dict[str, Any]] = {"name": "alie", "z": 1.0}  # the wrapper's scale is z itself


@register
@attack_options
class OptimalIPM(_GridOverBase):
    """Optimal IPM (ByzFL's ``Optimal_InnerProductManipulation``; IPM is Xie, Koyejo &
    Gupta, "Fall of empires", UAI 2019): every Byzantine row is ``-eps * mean``
    of the honest rows, with ``eps >= 0`` the value found (``grid``, line search,
    refinement) whose rows move the defense's aggregate farthest from the honest mean
    (``eps = 0``: zero rows, the best against DnC in ByzFL's comparison).

    Implemented through ``optimised(base={"name": "ipm", "eps": 1})``: the base offset
    from the mean is ``-2 * mean``, so ``eps`` is the wrapper's scale ``(1 + eps) / 2``.
    """

    name: ClassVar[str] = "optimal_ipm"
    summary: ClassVar[str] = "IPM with eps searched (grid, unbounded line search) to maximise the defense's deviation"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive"})
    grid: Annotated[
        tuple[Annotated[float, Field(ge=0)], ...],
        Field(min_length=1, strict=False, description="the eps values tried first, in order (ties: the first)"),
    ] = EPS_GRID
    line_evaluations: Annotated[int, Field(ge=0, description="probes of the line search from 0; 0: none")] = (
        LINE_EVALUATIONS)
    refine_steps: Annotated[int, Field(ge=0, description="halvings of the refinement; 0: none")] = REFINE_STEPS
    search: Any = dataclasses.field(init=False, repr=False, compare=False)  # the optimised wrapper
    base: ClassVar[dict[str, Any]] = {"name": "ipm", "eps": 1.0}

    @staticmethod
    def to_scale(value: float) -> float:
        """``(1 + eps) / 2``: the base offset from the mean is ``-2 * mean``."""
        return (1.0 + value) / 2.0
