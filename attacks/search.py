"""``optimised``: tune any registered attack's magnitude against the defense.

A wrapper in the spirit of the adaptive evaluations of Shejwalkar & Houmansadr (NDSS
2021) and Karimireddy et al. (ICLR 2022): the base attack gives the direction of the
Byzantine rows relative to the honest mean, and a search over its scale picks the one
that moves the defense's output farthest from the honest mean.

The search (:func:`maximise_scale`) covers 0 and unbounded scales, in three phases, all
on the same damage function and sharing one cache (a value is evaluated once):

1. **grid**: every value of the wrapper's grid, in order (0 included by default);
2. **line search** from 0 (the exploration of ByzFL's optimal attacks, after Garfield's
   "line maximize"): step 1, each improving step doubled (so the value grows
   geometrically without bound while the damage grows), then, from the first step
   that does not improve, ``line_evaluations`` probes in all that move back or forward
   by a step shrunk by 0.8 each probe;
3. **refinement** around the best value found: ``refine_steps`` times, the values half a
   gap to the left (never below 0) and to the right, the gap halved each time (the
   first gap: the distance to the nearest other evaluated value).

Non-finite damages are ignored (worse than any finite one); ties go to the value
evaluated first; with no finite damage the base rows themselves (value 1) are used.
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
#: Probes of the line search (phase 2) and halvings of the refinement (phase 3).
LINE_EVALUATIONS = 16
REFINE_STEPS = 3
LINE_SHRINK = 0.8


def mean_aggregate(delivered: Tensor) -> Tensor:
    """The undefended aggregate: ``[..., S, d] -> [..., 1, d]``."""
    return delivered.mean(dim=-2, keepdim=True)


def maximise_scale(damage: Callable[[float], float], grid: Sequence[float], line_evaluations: int = LINE_EVALUATIONS,
                   refine_steps: int = REFINE_STEPS) -> float:
    """The value ``>= 0`` of largest finite ``damage(value)`` found by the grid, the
    line search from 0 and the refinement of the module docstring (ties: the value
    evaluated first); 1 when no damage is finite."""
    seen: dict[float, float] = {}
    best: list[Any] = [None, -math.inf]  # value, damage

    def value_of(x: float) -> float:
        x = max(float(x), 0.0)
        if x not in seen:
            d = float(damage(x))
            seen[x] = d if math.isfinite(d) else -math.inf
            if seen[x] > best[1]:
                best[0], best[1] = x, seen[x]
        return seen[x]

    for x in grid:
        value_of(x)
    if line_evaluations > 0:
        line_search(value_of, line_evaluations)
    for _ in range(refine_steps if best[0] is not None else 0):
        centre = best[0]
        gaps = [abs(x - centre) for x in seen if x != centre]
        gap = min(gaps) if gaps else max(centre, 1.0)
        value_of(centre - gap / 2)
        value_of(centre + gap / 2)
    if best[0] is None:
        return 1.0
    return best[0]


def line_search(value_of: Callable[[float], float], evaluations: int) -> None:
    """Phase 2 of the module docstring, calling ``value_of`` (which records the best)
    ``evaluations`` times: from 0 with step 1, doubling each improving step, then
    probing around the best with the step shrunk by :data:`LINE_SHRINK` each probe."""
    best_x, best_y = 0.0, value_of(0.0)
    step, probe, left = 1.0, 0.0, evaluations - 1
    while left > 0:  # expansion
        probe = best_x + step
        y = value_of(probe)
        left -= 1
        if y > best_y:
            best_x, best_y, step = probe, y, 2 * step
        else:
            step *= LINE_SHRINK
            break
    while left > 0:  # contraction
        if probe < best_x:
            probe += step
        else:
            candidate = probe - step
            while candidate < 0:
                candidate = (candidate + probe) / 2
            probe = candidate
        y = value_of(probe)
        left -= 1
        if y > best_y:
            best_x, best_y = probe, y
        step *= LINE_SHRINK


@register
@attack_options
class Optimised(AttackBase):
    """Scale search around a base attack (omniscient and adaptive).

    ``base``: ``{"name": ..., <options>}`` of another registered attack, built (and
    validated) at construction.  Each call computes the base rows ``B0``, then for
    scale ``s`` the search tries (:func:`maximise_scale`: the grid ``scales``, a line
    search from 0 and a refinement) the candidate rows ``honest_mean + s * (B0 -
    honest_mean)`` (per leading block), delivers them into a copy of the messages and
    measures the damage ``mean ||aggregate(delivered) - honest_mean||`` (mean over the
    aggregate's rows and the leading blocks).  ``aggregate`` is
    ``context.defense_state["aggregate"]`` (``[..., S, d] -> [..., R, d]``: the
    vectors the honest receivers would apply); without it, the plain mean over senders.

    The search is per call and global: one scale for the whole call (every leading
    block and every Byzantine row), chosen afresh each round.  Non-finite damages are
    ignored; when no damage is finite, scale 1 (the base rows themselves) is used.
    Ties go to the scale evaluated first.  The base attack is called once per call, so
    its randomness comes from ``context.generator`` as usual.  ``line_evaluations = 0``
    and ``refine_steps = 0`` leave the pure grid search.
    """

    name: ClassVar[str] = "optimised"
    summary: ClassVar[str] = "search the scale of a base attack (grid, line search) to maximise the aggregate's deviation"
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
        int, Field(ge=0, description="probes of the line search from 0 (doubling, then shrinking by 0.8); 0: none")
    ] = LINE_EVALUATIONS
    refine_steps: Annotated[
        int, Field(ge=0, description="halvings of the refinement around the best scale; 0: none")
    ] = REFINE_STEPS
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
        return self.search(messages, context, self.scales)

    def search(self, messages: Tensor, context: AttackContext, grid: Sequence[float],
               to_scale: Callable[[float], float] = float) -> Tensor:
        """The base rows at the scale :func:`maximise_scale` finds over values ``v >= 0``
        (``grid`` first) whose scale is ``to_scale(v)``: an attack's own parameter
        (ALIE's ``z``, IPM's ``eps``) searched through this wrapper."""
        aggregate = (context.defense_state or {}).get("aggregate") or mean_aggregate
        mask = context.byzantine.to(messages.device)
        centre = honest_mean(messages, context)
        offset = self.attack(messages, context).to(messages.dtype) - centre

        def damage(value: float) -> float:
            delivered = messages.clone()
            delivered[..., mask, :] = centre + to_scale(value) * offset
            return float(norm(aggregate(delivered) - centre, keepdim=False).mean())

        chosen = maximise_scale(damage, grid, self.line_evaluations, self.refine_steps)
        return centre + to_scale(chosen) * offset
