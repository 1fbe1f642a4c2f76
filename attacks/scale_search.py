"""Optimal ALIE and optimal IPM: ALIE's ``z`` and IPM's ``eps`` tuned against the defense.

ByzFL (Gonzalez, Guerraoui, Pinot, Rizk, Stephan & Taiani, "ByzFL: research
framework for robust federated learning", arXiv 2025; its attacks
``Optimal_ALittleIsEnough`` and ``Optimal_InnerProductManipulation``) pick the scale of the two statistical attacks
(:mod:`attacks.statistical`) by a line search that maximises the deviation of the
defense's output from the honest mean, ``||aggregate(delivered) - honest_mean||``.
Here the search is the :class:`~attacks.search.Optimised` wrapper itself (composed,
not re-implemented): each attack builds an ``optimised`` search over its base attack
at a reference scale and maps its own grid of ``z`` (resp. ``eps``) onto the
wrapper's scales, so both share its rules (the defense's
``context.defense_state["aggregate"]``, else the plain mean; one scale per call;
non-finite damages ignored; ties to the value listed first).

The default grids are ByzFL-like: ByzFL starts its line search at 0 and expands
geometrically before contracting; the grid covers the same range, from the honest
spread (``z ~ 1``, ``eps ~ 0.1``) to far outside it (100), geometrically.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar

from pydantic import Field
from torch import Tensor

from attacks.base import attack_options, register
from attacks.search import Optimised
from robust_pfl.engine.types import AttackBase, AttackContext

#: ``z`` values tried by :class:`OptimalALIE` (in honest standard deviations).
Z_GRID: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0)
#: ``eps`` values tried by :class:`OptimalIPM` (rows ``-eps * honest mean``).
EPS_GRID: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0)


class _GridOverBase(AttackBase):
    """What both attacks share: an :class:`~attacks.search.Optimised` search over
    ``base`` (its rows at a reference scale), built at construction, with each value
    of the subclass's ``grid`` mapped to the wrapper's scale by :meth:`to_scale`."""

    base: ClassVar[dict[str, Any]]

    @staticmethod
    def to_scale(value: float) -> float:
        """The wrapper's scale of one ``grid`` value."""
        return value

    def __post_init__(self) -> None:
        scales = tuple(self.to_scale(value) for value in self.grid)
        object.__setattr__(self, "search", Optimised(base=self.base, scales=scales))

    @property
    def scales(self) -> tuple[float, ...]:
        """The wrapper's scales, one per value of ``grid``."""
        return tuple(self.search.scales)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return self.search(messages, context)


@register
@attack_options
class OptimalALIE(_GridOverBase):
    """Optimal ALIE (ByzFL's ``Optimal_ALittleIsEnough``; ALIE is Baruch, Baruch &
    Goldberg, NeurIPS 2019): every Byzantine row is ``mean - z * std`` of the
    honest rows (sample std, as :class:`~attacks.statistical.ALIE`), with ``z`` the value
    of ``grid`` whose rows move the defense's aggregate farthest from the honest mean.

    Implemented as ``optimised(base={"name": "alie", "z": 1}, scales=grid)``: the
    wrapper's candidate ``mean + s * (ALIE_1 - mean)`` is ``mean - s * std``, so its
    scale is ``z`` itself.
    """

    name: ClassVar[str] = "optimal_alie"
    summary: ClassVar[str] = "ALIE with z grid-searched to maximise the defense's deviation (ByzFL)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive"})
    grid: Annotated[
        tuple[Annotated[float, Field(gt=0)], ...],
        Field(min_length=1, strict=False, description="the z values tried, in order (ties: the first)"),
    ] = Z_GRID
    search: Any = dataclasses.field(init=False, repr=False, compare=False)  # the optimised wrapper
    base: ClassVar[dict[str, Any]] = {"name": "alie", "z": 1.0}  # the wrapper's scale is z itself


@register
@attack_options
class OptimalIPM(_GridOverBase):
    """Optimal IPM (ByzFL's ``Optimal_InnerProductManipulation``; IPM is Xie, Koyejo &
    Gupta, "Fall of empires", UAI 2019): every Byzantine row is ``-eps * mean``
    of the honest rows, with ``eps`` the value of ``grid`` whose rows move the
    defense's aggregate farthest from the honest mean.

    Implemented as ``optimised(base={"name": "ipm", "eps": 1}, scales=...)``: the base
    offset from the mean is ``-2 * mean``, so ``eps`` is the wrapper's scale
    ``(1 + eps) / 2``.
    """

    name: ClassVar[str] = "optimal_ipm"
    summary: ClassVar[str] = "IPM with eps grid-searched to maximise the defense's deviation (ByzFL)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive"})
    grid: Annotated[
        tuple[Annotated[float, Field(gt=0)], ...],
        Field(min_length=1, strict=False, description="the eps values tried, in order (ties: the first)"),
    ] = EPS_GRID
    search: Any = dataclasses.field(init=False, repr=False, compare=False)  # the optimised wrapper
    base: ClassVar[dict[str, Any]] = {"name": "ipm", "eps": 1.0}

    @staticmethod
    def to_scale(value: float) -> float:
        """``(1 + eps) / 2``: the base offset from the mean is ``-2 * mean``."""
        return (1.0 + value) / 2.0
