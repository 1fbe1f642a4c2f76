"""Min-Max and Min-Sum (Shejwalkar & Houmansadr, NDSS 2021), AGR-agnostic variants.

"Manipulating the Byzantine: optimizing model poisoning attacks and defenses for
federated learning": the malicious vector is ``mal = mean + gamma * p`` with ``mean``
the honest mean and ``p`` a perturbation direction, ``gamma`` as large as possible
while ``mal`` stays as close to the honest rows as they are to each other:

* Min-Max: ``max_j ||mal - g_j|| <= max_{i,j} ||g_i - g_j||``;
* Min-Sum: ``sum_j ||mal - g_j||^2 <= max_i sum_j ||g_i - g_j||^2``,

over honest ``i, j``.  ``gamma`` is found by the paper's search (start at
``gamma_init``, halve the step each iteration) in a bracketing form: grow ``gamma``
by doubling while feasible, then bisect; ``steps`` feasibility tests in all, every
leading block searched at once.  Both constraint sides are convex in ``gamma`` and hold
at ``gamma = 0`` (the mean lies in the honest hull), so the feasible ``gamma >= 0``
form an interval and the search returns (a lower bound on) its right end.
"""

from __future__ import annotations

from typing import Annotated, Callable, ClassVar, Literal, get_args

import torch
from pydantic import Field
from torch import Tensor

from attacks._stats import expand_rows, honest_rows, mean_and_std, unit
from attacks.base import attack_options, register
from robust_pfl.engine.rows import euclidean_distances
from robust_pfl.engine.types import AttackBase, AttackContext

Direction = Literal["unit", "std", "sign"]
DIRECTIONS = get_args(Direction)


def largest_feasible(feasible: Callable[[Tensor], Tensor], start: Tensor, steps: int) -> Tensor:
    """Largest ``gamma >= 0`` with ``feasible(gamma)``, per element of ``start``
    (``gamma = 0`` assumed feasible).  Each of the ``steps`` iterations tests one
    trial per element: ``hi`` (doubling it on success) until a failure brackets the
    answer, then the midpoint of ``[lo, hi]``.  Returns ``lo``, the largest trial that
    passed (0 if none)."""
    lo = torch.zeros_like(start)
    hi = start.clone()
    bracketed = torch.zeros_like(start, dtype=torch.bool)
    for _ in range(steps):
        trial = torch.where(bracketed, 0.5 * (lo + hi), hi)
        ok = feasible(trial)
        lo = torch.where(ok, trial, lo)
        hi = torch.where(ok, torch.where(bracketed, hi, 2 * hi), trial)
        bracketed = bracketed | ~ok
    return lo


@attack_options
class _PerturbedMean(AttackBase):
    """Shared body of Min-Max and Min-Sum; subclasses give the two constraint sides."""

    needs: ClassVar[frozenset[str]] = frozenset({"omniscient"})
    direction: Annotated[
        Direction, Field(description="perturbation p: unit (-mean/||mean||) | std (-std) | sign (-sign(mean))")
    ] = "unit"
    steps: Annotated[int, Field(ge=1, description="feasibility tests of the gamma search")] = 30
    gamma_init: Annotated[float, Field(gt=0, description="the first gamma tried")] = 10.0

    @staticmethod
    def bound(pairwise: Tensor) -> Tensor:
        """``[...]`` right-hand side from squared honest distances ``[..., H, H]``."""
        raise NotImplementedError

    @staticmethod
    def score(squared: Tensor) -> Tensor:
        """``[...]`` left-hand side from ``||mal - g_j||^2``, ``[..., H]``."""
        raise NotImplementedError

    def perturbation(self, honest: Tensor, mean: Tensor) -> Tensor:
        """``p``: ``-mean/||mean||`` (unit), ``-std`` (std, Bessel-corrected) or
        ``-sign(mean)`` (sign), from the honest rows ``[..., H, d]`` and their mean."""
        if self.direction == "unit":
            return -unit(mean)
        if self.direction == "std":
            return -mean_and_std(honest)[1]
        return -torch.sign(mean)

    def gamma(self, honest: Tensor, mean: Tensor, direction: Tensor) -> Tensor:
        """``[...]`` the searched ``gamma`` of every leading block."""
        limit = self.bound(euclidean_distances(honest, honest).square())

        def feasible(gamma: Tensor) -> Tensor:
            candidate = mean + gamma[..., None, None] * direction
            return self.score((candidate - honest).square().sum(dim=-1)) <= limit

        start = torch.full(mean.shape[:-2], float(self.gamma_init), dtype=mean.dtype, device=mean.device)
        return largest_feasible(feasible, start, self.steps)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        honest = honest_rows(messages, context)
        mean = honest.mean(dim=-2, keepdim=True)
        direction = self.perturbation(honest, mean)
        gamma = self.gamma(honest, mean, direction)
        return expand_rows(mean + gamma[..., None, None] * direction, messages, context)


@register
@attack_options
class MinMax(_PerturbedMean):
    """Min-Max (Shejwalkar & Houmansadr, NDSS 2021): the malicious row is no farther
    from any honest row than the two farthest honest rows are from each other."""

    name: ClassVar[str] = "min_max"
    summary: ClassVar[str] = "mean + gamma*p, max distance to honest <= max honest pairwise (Shejwalkar 2021)"

    @staticmethod
    def bound(pairwise: Tensor) -> Tensor:
        return pairwise.amax(dim=(-2, -1))

    @staticmethod
    def score(squared: Tensor) -> Tensor:
        return squared.amax(dim=-1)


@register
@attack_options
class MinSum(_PerturbedMean):
    """Min-Sum (Shejwalkar & Houmansadr, NDSS 2021): the malicious row's sum of squared
    distances to the honest rows is at most the largest such sum of an honest row."""

    name: ClassVar[str] = "min_sum"
    summary: ClassVar[str] = "mean + gamma*p, sum of sq. distances to honest <= honest max (Shejwalkar 2021)"

    @staticmethod
    def bound(pairwise: Tensor) -> Tensor:
        return pairwise.sum(dim=-1).amax(dim=-1)

    @staticmethod
    def score(squared: Tensor) -> Tensor:
        return squared.sum(dim=-1)
