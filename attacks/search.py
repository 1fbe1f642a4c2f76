"""``optimised``: tune any registered attack's magnitude against the defense.

A wrapper in the spirit of the adaptive evaluations of Shejwalkar & Houmansadr (NDSS
2021) and Karimireddy et al. (ICLR 2022): the base attack gives the direction of the
Byzantine rows relative to the honest mean, and a grid search over its scale picks
the one that moves the defense's output farthest from the honest mean.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, ClassVar, Mapping

from pydantic import Field
from torch import Tensor

from attacks._stats import honest_mean, norm
from attacks.base import NeedsBy, attack_options, build, register
from robust_pfl.engine.types import AttackBase, AttackContext

DEFAULT_SCALES: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


def mean_aggregate(delivered: Tensor) -> Tensor:
    """The undefended aggregate: ``[..., S, d] -> [..., 1, d]``."""
    return delivered.mean(dim=-2, keepdim=True)


@register
@attack_options
class Optimised(AttackBase):
    """Scale search around a base attack (omniscient and adaptive).

    ``base``: ``{"name": ..., <options>}`` of another registered attack, built (and
    validated) at construction.  Each call computes the base rows ``B0``, then for
    every ``s`` in ``scales`` the candidate rows ``honest_mean + s * (B0 -
    honest_mean)`` (per leading block), delivers them into a copy of the messages and
    measures the damage ``mean ||aggregate(delivered) - honest_mean||`` (mean over the
    aggregate's rows and the leading blocks).  ``aggregate`` is
    ``context.defense_state["aggregate"]`` (``[..., S, d] -> [..., R, d]``: the
    vectors the honest receivers would apply); without it, the plain mean over senders.

    The search is per call and global: one scale for the whole call (every leading
    block and every Byzantine row), chosen afresh each round.  Non-finite damages are
    ignored; when no damage is finite, scale 1 (the base rows themselves) is used.
    Ties go to the scale listed first.  The base attack is called once per call, so its
    randomness comes from ``context.generator`` as usual.
    """

    name: ClassVar[str] = "optimised"
    summary: ClassVar[str] = "grid-search the scale of a base attack to maximise the aggregate's deviation"
    needs = NeedsBy(
        frozenset({"omniscient", "adaptive"}),
        lambda self: frozenset(self.attack.needs) | {"omniscient", "adaptive"},
    )
    base: Annotated[
        Mapping[str, Any], Field(description="the base attack, {name = ..., <its options>}")
    ] = dataclasses.field(default_factory=lambda: {"name": "alie"}, hash=False)
    scales: Annotated[
        tuple[Annotated[float, Field(gt=0)], ...],
        Field(min_length=1, strict=False, description="the scales tried, in order (ties: the first)"),
    ] = DEFAULT_SCALES  # strict=False: a TOML list becomes the tuple (its items stay strict)
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
        aggregate = (context.defense_state or {}).get("aggregate") or mean_aggregate
        mask = context.byzantine.to(messages.device)
        centre = honest_mean(messages, context)
        offset = self.attack(messages, context).to(messages.dtype) - centre
        damages = []
        for scale in self.scales:
            delivered = messages.clone()
            delivered[..., mask, :] = centre + scale * offset
            damage = norm(aggregate(delivered) - centre, keepdim=False).mean()
            damages.append(float(damage))
        finite = [(value, -index) for index, value in enumerate(damages) if math.isfinite(value)]
        chosen = self.scales[-max(finite)[1]] if finite else 1.0
        return centre + chosen * offset
