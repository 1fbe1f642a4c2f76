"""Optimal ALIE and optimal IPM: ALIE's ``z`` and IPM's ``eps`` tuned against the defense.

ByzFL (Gonzalez, Guerraoui, Pinot, Rizk, Stephan & Taiani, "ByzFL: research
framework for robust federated learning", arXiv 2025; its attacks
``Optimal_ALittleIsEnough`` and ``Optimal_InnerProductManipulation``) pick the factor of
the two statistical attacks (:mod:`attacks.statistical`) by a line search from 0 that
maximises the deviation of the defense's output from the honest mean,
``||aggregate(delivered) - honest_mean||``.  Here the search is the
:class:`~attacks.search.Optimised` wrapper's (composed, not re-implemented): each attack
builds an ``optimised`` wrapper over its base attack at a reference scale and searches
its own parameter ``z`` (resp. ``eps``) with the wrapper's rules
(:func:`attacks.search.maximise_scale`), each value mapped onto the wrapper's scale by
``to_scale``.  The three phases run on ``z`` and ``eps`` themselves, so the line search
(from 0, first step 10, 20 evaluations) tries the very factors ByzFL's search tries,
and the grid and the refinement add their own: the value found is at least as
damaging as ByzFL's on the same inputs, up to rounding (``tests/test_optimised_search.py``
measures it against every aggregator).  Both use the defense's
``context.defense_state["aggregate"]``, else the plain mean; one value per call;
non-finite damages ignored; ties to the value evaluated first.

The search space is ``z >= 0`` and ``eps >= 0`` (ByzFL's too): ``z = 0`` puts the
Byzantine rows at the honest mean, ``eps = 0`` at zero.  For IPM the wrapper's scales
are therefore ``>= 1/2`` (``to_scale(0) = 1/2``); the wrapper's scale 0 (rows at the
mean, ``eps = -1``) is outside the search, as in ByzFL.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar

from pydantic import Field
from torch import Tensor

from attacks.base import attack_options, register
from attacks.search import (LINE_EVALUATIONS, LINE_STEP, REFINE_EVALUATIONS, SEARCH_EVERY_FIELD, WARM_REFINE_EVALUATIONS,
                            WARM_REFINE_FIELD, Optimised)
from robust_pfl.engine.types import AttackBase, AttackContext

#: ``z`` values tried first by :class:`OptimalALIE` (in honest standard deviations).
Z_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0)
#: ``eps`` values tried first by :class:`OptimalIPM` (rows ``-eps * honest mean``).
EPS_GRID: tuple[float, ...] = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0)

LINE_EVALUATIONS_FIELD = Annotated[
    int, Field(ge=0, le=64, description="evaluations of the line search from 0 (step doubled while the damage grows, "
                                        "then shrunk by 0.8); 0: none")]
LINE_STEP_FIELD = Annotated[float, Field(gt=0, description="the line search's first step")]
REFINE_EVALUATIONS_FIELD = Annotated[
    int, Field(ge=0, le=64, description="evaluations of the golden-section refinement around the best value; "
                                        "0: none")]


class _SearchOverBase(AttackBase):
    """What both attacks share: an :class:`~attacks.search.Optimised` wrapper over
    ``base`` (its rows at a reference scale), built at construction with this
    attack's search options, searching the subclass's parameter (``grid`` first)
    mapped to the wrapper's scale by :meth:`to_scale`."""

    base: ClassVar[dict[str, Any]]

    @staticmethod
    def to_scale(value: float) -> float:
        """The wrapper's scale of one value of the parameter."""
        return value

    def __post_init__(self) -> None:
        wrapper = Optimised(base=self.base, scales=tuple(self.to_scale(v) for v in self.grid),
                            line_evaluations=self.line_evaluations, line_step=self.line_step,
                            refine_evaluations=self.refine_evaluations, search_every=self.search_every,
                            warm_refine_evaluations=self.warm_refine_evaluations)
        object.__setattr__(self, "search", wrapper)

    @property
    def scales(self) -> tuple[float, ...]:
        """The wrapper's scales of the values of ``grid``."""
        return tuple(self.search.scales)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return self.search.rows_at_best(messages, context, self.grid, self.to_scale)


@register
@attack_options
class OptimalALIE(_SearchOverBase):
    """Optimal ALIE (ByzFL's ``Optimal_ALittleIsEnough``; ALIE is Baruch, Baruch &
    Goldberg, NeurIPS 2019): every Byzantine row is ``mean - z * std`` of the
    honest rows (sample std, as :class:`~attacks.statistical.ALIE`), with ``z >= 0`` the
    value found (``grid``, line search from 0 without upper bound, refinement:
    :mod:`attacks.search`) whose rows move the defense's aggregate farthest from the
    honest mean.

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
    line_evaluations: LINE_EVALUATIONS_FIELD = LINE_EVALUATIONS
    line_step: LINE_STEP_FIELD = LINE_STEP
    refine_evaluations: REFINE_EVALUATIONS_FIELD = REFINE_EVALUATIONS
    search_every: SEARCH_EVERY_FIELD = 1
    warm_refine_evaluations: WARM_REFINE_FIELD = WARM_REFINE_EVALUATIONS
    search: Any = dataclasses.field(init=False, repr=False, compare=False)  # the optimised wrapper
    base: ClassVar[dict[str, Any]] = {"name": "alie", "z": 1.0}  # the wrapper's scale is z itself


@register
@attack_options
class OptimalIPM(_SearchOverBase):
    """Optimal IPM (ByzFL's ``Optimal_InnerProductManipulation``; IPM is Xie, Koyejo &
    Gupta, "Fall of empires", UAI 2019): every Byzantine row is ``-eps * mean``
    of the honest rows, with ``eps >= 0`` the value found (``grid``, line search from 0
    without upper bound, refinement: :mod:`attacks.search`) whose rows move the
    defense's aggregate farthest from the honest mean (``eps = 0``: zero rows, which
    can be the most damaging, e.g. against DnC).

    Implemented through ``optimised(base={"name": "ipm", "eps": 1})``: the base offset
    from the mean is ``-2 * mean``, so ``eps`` is the wrapper's scale ``(1 + eps) / 2``
    (``>= 1/2``: see the module docstring).
    """

    name: ClassVar[str] = "optimal_ipm"
    summary: ClassVar[str] = "IPM with eps searched (grid, unbounded line search) to maximise the defense's deviation"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive"})
    grid: Annotated[
        tuple[Annotated[float, Field(ge=0)], ...],
        Field(min_length=1, strict=False, description="the eps values tried first, in order (ties: the first)"),
    ] = EPS_GRID
    line_evaluations: LINE_EVALUATIONS_FIELD = LINE_EVALUATIONS
    line_step: LINE_STEP_FIELD = LINE_STEP
    refine_evaluations: REFINE_EVALUATIONS_FIELD = REFINE_EVALUATIONS
    search_every: SEARCH_EVERY_FIELD = 1
    warm_refine_evaluations: WARM_REFINE_FIELD = WARM_REFINE_EVALUATIONS
    search: Any = dataclasses.field(init=False, repr=False, compare=False)  # the optimised wrapper
    base: ClassVar[dict[str, Any]] = {"name": "ipm", "eps": 1.0}

    @staticmethod
    def to_scale(value: float) -> float:
        """``(1 + eps) / 2``: the base offset from the mean is ``-2 * mean``."""
        return (1.0 + value) / 2.0
