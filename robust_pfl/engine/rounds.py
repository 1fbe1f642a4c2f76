"""The round loop every caller runs: a run, a recipe, the Flower strategy and the
theory checks step an algorithm through the same function, so what happens around a
round (data re-dealt before it, metrics, checkpoints after it) is a hook, not another
copy of the loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from robust_pfl.engine.types import RoundRecord


class Stepping(Protocol):
    """What the loop drives: one round of an algorithm (``defenses.Algorithm.step``)."""

    def step(self, round_index: int) -> RoundRecord: ...


def run_rounds(
    algorithm: Stepping,
    stop: int,
    start: int = 0,
    before: Callable[[int], None] | None = None,
    after: Callable[[int, RoundRecord], None] | None = None,
) -> None:
    """Rounds ``start, ..., stop - 1`` of ``algorithm``: ``before(round_index)`` ahead
    of each round, ``after(done, record)`` once it is done (``done = round_index + 1``,
    the rounds finished so far)."""
    for round_index in range(start, stop):
        if before is not None:
            before(round_index)
        record = algorithm.step(round_index)
        if after is not None:
            after(round_index + 1, record)
