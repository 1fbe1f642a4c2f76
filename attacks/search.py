"""``optimised``: tune any registered attack's magnitude against the defense.

A wrapper in the spirit of the adaptive evaluations of Shejwalkar & Houmansadr (NDSS
2021) and Karimireddy et al. (ICLR 2022): the base attack gives the direction of the
Byzantine rows relative to the honest mean, and a search over its scale picks the one
that moves the defense's output farthest from the honest mean.

The search (:func:`maximise_scale`) runs over values ``>= 0``, 0 included and no upper
bound, in three phases on one damage function with one cache (a value is evaluated at
most once; a value met again costs nothing):

1. **grid**: every value of the grid, in its order (the default grids include 0);
2. **line search** from 0, ByzFL's exploration (its ``Optimal_ALittleIsEnough`` /
   ``Optimal_InnerProductManipulation``, defaults ``evals = 20``, ``delta = 10``,
   ``ratio = 0.8``), ``line_evaluations`` evaluations in all, with its own running best
   ``b`` (0 at first): *expansion*: try ``b + step`` (``step = line_step`` at first);
   while that improves strictly on ``b`` it becomes ``b`` and the step doubles (the
   value grows geometrically, without bound); at the first try that does not improve
   (non-finite damage included) the step is multiplied by 0.8 and *contraction*
   starts: each remaining evaluation tries ``b + step``, takes it as ``b`` if it
   improves, and multiplies the step by 0.8;
3. **refinement** around the best value ``c`` of phases 1-2, ``refine_evaluations``
   evaluations: a golden-section search in the bracket ``[l, r]`` of the evaluated
   values next to ``c`` (``l = 0`` when none is below): each evaluation tries the point
   at 0.382 of the longer of ``[l, c]`` and ``[c, r]`` from ``c``; a strict improvement
   becomes ``c`` and the old ``c`` the end on its side, any other try becomes the end
   on its side.  When no value above ``c`` was evaluated, the try is ``2c``
   instead (1 when ``c = 0``): the value keeps doubling while the damage grows.

So one call evaluates at most ``len(grid) + line_evaluations + refine_evaluations``
values (defaults: 10 + 20 + 8 for ``optimised``, 8 + 20 + 8 for ``optimal_alie`` and
``optimal_ipm``), each one aggregate call.  The result is the value of largest finite
damage over every phase; non-finite damages are ignored (worse than any finite one),
ties go to the value evaluated first, and with no finite damage at all the base rows
themselves (value 1) are used.  ``line_evaluations = 0`` and ``refine_evaluations = 0``
give the pure grid search of earlier versions (whose grids did not include 0).

**Warm start** (``search_every = k > 1``): the full search runs in the rounds ``t``
with ``t mod k = 0`` (and whenever the run remembers no value); in the other rounds the
search starts from the value ``b`` the previous call chose (kept in
``context.memory``, so a resumed run remembers it): it evaluates 0 (where ByzFL's
search starts), ``b``, ``2b`` and ``b / 2`` (``1`` instead of ``2b`` when ``b = 0``),
then refines around the best value (phase 3, ``warm_refine_evaluations``
evaluations): about 12 evaluations instead of 36.
Between rounds the honest messages move little, so the optimum moves little; a
better optimum far from both is found again at the next full search.  ``tests/test_optimised_search.py``
holds the warm search to the same bar as the full one (at least as damaging as ByzFL's
search in 95% of the cases), round after round on drifting inputs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Callable, ClassVar, Mapping, Sequence

from pydantic import Field
from torch import Tensor

from attacks._stats import honest_mean, norm
from attacks.base import NeedsBy, attack_options, build, register
from robust_pfl.engine.types import AttackBase, AttackContext

DEFAULT_SCALES: tuple[float, ...] = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
#: Phase 2 (line search): evaluations and first step (ByzFL's defaults), step contraction.
LINE_EVALUATIONS = 20
LINE_STEP = 10.0
LINE_SHRINK = 0.8
#: Phase 3: evaluations around the best value, and the golden-section fraction.
REFINE_EVALUATIONS = 8
#: The warm search's refinement (module docstring, "Warm start").
WARM_REFINE_EVALUATIONS = 8
GOLDEN = (3.0 - math.sqrt(5.0)) / 2.0


def mean_aggregate(delivered: Tensor) -> Tensor:
    """The undefended aggregate: ``[..., S, d] -> [..., 1, d]``."""
    return delivered.mean(dim=-2, keepdim=True)


def maximise_scale(damage: Callable[[float], float], grid: Sequence[float] = DEFAULT_SCALES,
                   line_evaluations: int = LINE_EVALUATIONS, refine_evaluations: int = REFINE_EVALUATIONS,
                   line_step: float = LINE_STEP, warm: float | None = None,
                   warm_refine_evaluations: int = WARM_REFINE_EVALUATIONS) -> float:
    """The value ``>= 0`` of largest finite ``damage(value)`` found by the three phases
    of the module docstring (grid, line search from 0, refinement), or, given the
    previous call's value ``warm``, by the warm search (0, ``warm``, twice and half of
    it, then ``warm_refine_evaluations`` refinements); ties go to the value evaluated
    first; 1 when no damage is finite.  ``damage`` is called at most once per distinct
    value, in a fixed order (deterministic when ``damage`` is)."""
    seen: dict[float, float] = {}
    best: list[Any] = [None, -math.inf]  # value, damage

    def value_of(x: float) -> float:
        x = float(x)
        if not math.isfinite(x) or x < 0:
            return -math.inf
        if x not in seen:
            y = float(damage(x))
            seen[x] = y if math.isfinite(y) else -math.inf
            if seen[x] > best[1]:
                best[0], best[1] = x, seen[x]
        return seen[x]

    if warm is not None and math.isfinite(warm) and warm >= 0:
        for x in (0.0, warm, 2 * warm if warm > 0 else 1.0, warm / 2):
            value_of(x)
        refine_evaluations = warm_refine_evaluations
    else:
        for x in grid:
            value_of(x)
        line_search(value_of, line_evaluations, line_step)
    if best[0] is None:
        return 1.0
    refine(value_of, best[0], sorted(seen), refine_evaluations)
    return best[0]


def refine(value_of: Callable[[float], float], centre: float, evaluated: Sequence[float], evaluations: int) -> None:
    """Phase 3 of the module docstring: ``evaluations`` calls of ``value_of`` around
    ``centre``, the best of the sorted ``evaluated`` values: golden-section steps in
    the bracket of its evaluated neighbours (0 the left end when it has none), or,
    without a right neighbour, doubling ``centre`` until the damage stops growing."""
    below = [x for x in evaluated if x < centre]
    above = [x for x in evaluated if x > centre]
    left, right = (below[-1] if below else 0.0), (above[0] if above else None)
    height = value_of(centre)
    for _ in range(evaluations):
        if right is None:  # nothing evaluated beyond the best: expand
            probe = 2 * centre if centre > 0 else 1.0
        elif right - centre >= centre - left:
            probe = centre + GOLDEN * (right - centre)
        else:
            probe = centre - GOLDEN * (centre - left)
        if not math.isfinite(probe) or probe in (left, centre, right):
            return
        y = value_of(probe)
        if y > height:
            if probe > centre:
                left, centre = centre, probe
            else:
                right, centre = centre, probe
            height = y
        elif probe > centre:
            right = probe
        else:
            left = probe


def line_search(value_of: Callable[[float], float], evaluations: int, step: float = LINE_STEP) -> None:
    """Phase 2 of the module docstring: ``evaluations`` calls of ``value_of`` (which
    keeps the overall best) from 0, expanding by a doubling step while the damage
    improves, then trying ``b + step`` with the step shrunk by :data:`LINE_SHRINK`."""
    if evaluations <= 0:
        return
    best_x, best_y = 0.0, value_of(0.0)
    left = evaluations - 1
    while left > 0:  # expansion
        left -= 1
        y = value_of(best_x + step)
        if y > best_y:
            best_x, best_y, step = best_x + step, y, 2 * step
        else:
            step *= LINE_SHRINK
            break
    while left > 0:  # contraction
        left -= 1
        y = value_of(best_x + step)
        if y > best_y:
            best_x, best_y = best_x + step, y
        step *= LINE_SHRINK


SEARCH_EVERY_FIELD = Annotated[
    int, Field(ge=1, le=1_000_000, description="rounds between full searches; the rounds between start from the "
                                               "previous call's value (module docstring of attacks.search, "
                                               "\"Warm start\"); 1: a full search every round")]
WARM_REFINE_FIELD = Annotated[
    int, Field(ge=0, le=64, description="refinement evaluations of a warm-started search")]


def warm_start(memory: dict[str, Any], key: str, round_index: int, search_every: int) -> float | None:
    """The value a warm-started search starts from: the one ``memory[key]`` keeps,
    except in the rounds of a full search (``round_index mod search_every = 0``) and
    when nothing is kept."""
    if search_every <= 1 or round_index % search_every == 0:
        return None
    return memory.get(key)


@register
@attack_options
class Optimised(AttackBase):
    """Scale search around a base attack (omniscient and adaptive).

    ``base``: ``{"name": ..., <options>}`` of another registered attack, built (and
    validated) at construction.  Each call computes the base rows ``B0``, then for
    scale ``s`` the candidate rows ``honest_mean + s * (B0 - honest_mean)`` (per
    leading block), delivers them into a copy of the messages and measures the damage
    ``mean ||aggregate(delivered) - honest_mean||`` (mean over the aggregate's rows and
    the leading blocks).  ``aggregate`` is ``context.defense_state["aggregate"]``
    (``[..., S, d] -> [..., R, d]``: the vectors the honest receivers would apply);
    without it, the plain mean over senders.  The scale is the one
    :func:`maximise_scale` finds (module docstring: the grid ``scales``, a line search
    from 0 with no upper bound, a refinement around the best).

    The search is per call and global: one scale for the whole call (every leading
    block and every Byzantine row), chosen afresh each round.  Non-finite damages are
    ignored; when no damage is finite, scale 1 (the base rows themselves) is used.
    Ties go to the scale evaluated first.  The base attack is called once per call, so
    its randomness comes from ``context.generator`` as usual; the search itself draws
    nothing.  ``line_evaluations = 0`` and ``refine_evaluations = 0`` leave the pure grid.
    """

    name: ClassVar[str] = "optimised"
    summary: ClassVar[str] = ("search the scale of a base attack (grid, unbounded line search) to maximise the "
                              "aggregate's deviation")
    needs = NeedsBy(
        frozenset({"omniscient", "adaptive"}),
        lambda self: frozenset(self.attack.needs) | {"omniscient", "adaptive"},
    )
    base: Annotated[
        Mapping[str, Any], Field(description="the base attack, {name = ..., <its options>}")
    ] = dataclasses.field(default_factory=lambda: {"name": "alie"}, hash=False)
    scales: Annotated[
        tuple[Annotated[float, Field(ge=0)], ...],
        Field(min_length=1, strict=False, description="the grid of scales tried first, in order (ties: the first)"),
    ] = DEFAULT_SCALES  # strict=False: a TOML list becomes the tuple (its items stay strict)
    line_evaluations: Annotated[
        int, Field(ge=0, le=64, description="evaluations of the line search from 0 (step doubled while the damage "
                                            "grows, then shrunk by 0.8); 0: none")
    ] = LINE_EVALUATIONS
    line_step: Annotated[float, Field(gt=0, description="the line search's first step")] = LINE_STEP
    refine_evaluations: Annotated[
        int, Field(ge=0, le=64, description="evaluations of the golden-section refinement around the best scale; "
                                            "0: none")
    ] = REFINE_EVALUATIONS
    search_every: SEARCH_EVERY_FIELD = 1
    warm_refine_evaluations: WARM_REFINE_FIELD = WARM_REFINE_EVALUATIONS
    attack: Any = dataclasses.field(init=False, repr=False, compare=False)  # the base attack, built

    def __post_init__(self) -> None:
        if not isinstance(self.base.get("name"), str):
            raise ValueError(f"optimised.base must be a table with a string 'name', got {dict(self.base)!r}")
        options = dict(self.base)
        name = options.pop("name")
        try:
            attack = build(name, options)
        except ValueError as error:
            raise ValueError(f"optimised.base: {error}") from None
        object.__setattr__(self, "base", dict(self.base))
        object.__setattr__(self, "attack", attack)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return self.rows_at_best(messages, context, self.scales)

    def rows_at_best(self, messages: Tensor, context: AttackContext, grid: Sequence[float],
                     to_scale: Callable[[float], float] = float) -> Tensor:
        """The candidate rows at ``to_scale(v)``, ``v`` the value :func:`maximise_scale`
        finds over values ``>= 0`` (``grid`` first, then this wrapper's line search and
        refinement): an attack's own parameter (ALIE's ``z``, IPM's ``eps``) searched
        through this wrapper."""
        aggregate = (context.defense_state or {}).get("aggregate") or mean_aggregate
        mask = context.byzantine.to(messages.device)
        centre = honest_mean(messages, context)
        offset = self.attack(messages, context).to(messages.dtype) - centre

        def damage(value: float) -> float:
            delivered = messages.clone()
            delivered[..., mask, :] = centre + to_scale(value) * offset
            return float(norm(aggregate(delivered) - centre, keepdim=False).mean())

        key = f"{self.name}:{context.kind}:search"
        warm = warm_start(context.memory, key, context.round_index, self.search_every)
        chosen = maximise_scale(damage, grid, self.line_evaluations, self.refine_evaluations, self.line_step,
                                warm, self.warm_refine_evaluations)
        if self.search_every > 1:
            context.memory[key] = chosen
        return centre + to_scale(chosen) * offset
