"""Fang et al.'s full-knowledge local model poisoning attacks (omniscient).

Fang, Cao, Jia & Gong, "Local model poisoning attacks to Byzantine-robust federated
learning", USENIX Security 2020, Sec. 4: the attacker knows every benign local model
and the aggregation rule, and crafts the compromised models to push the aggregate
against the direction in which it would move without attack.

The paper works on models ``w``; these attacks work on the messages (gradients) the
federation delivers.  The paper's change direction of parameter ``j`` is ``s_j =
sign(w_new_j - w_j)``, which for a gradient step is ``-sign(mean_j)`` of the honest
gradients; "against the change direction" therefore means, for a gradient row, "against
the sign of the honest mean", and the paper's before-attack model ``w_Re`` (the
reference the crafted model deviates from) becomes the honest mean gradient.

* :class:`FangKrum` (Sec. 4.2, attacking Krum);
* :class:`FangTrimmedMean` (Sec. 4.3, attacking trimmed mean; Sec. 4.4 uses the same
  attack against the median).
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal, get_args

import torch
from pydantic import Field
from torch import Tensor

from attacks._stats import (
    byzantine_count,
    byzantine_shape,
    expand_rows,
    honest_rows,
)
from attacks.base import attack_options, register
from robust_pfl.engine.rows import euclidean_distances
from robust_pfl.engine.types import AttackBase, AttackContext

Centre = Literal["mean", "zero"]
CENTRES = get_args(Centre)


def _sum_of_smallest(values: Tensor, count: int) -> Tensor:
    """Per row of ``values[..., P, Q]``, the sum of its ``count`` smallest entries
    (``0 <= count <= Q``); ``[..., P]``."""
    if count <= 0:
        return values.new_zeros(values.shape[:-1])
    return values.sort(dim=-1).values[..., :count].sum(dim=-1)


def krum_selects_copies(candidate: Tensor, honest: Tensor, honest_squared: Tensor, copies: int, f: int) -> Tensor:
    """Whether Krum (Blanchard et al. 2017, Sec. 4) with budget ``f`` selects one of
    ``copies`` identical rows ``candidate[..., 1, d]`` among them and the honest rows
    ``honest[..., H, d]`` (``honest_squared[..., H, H]``: their squared distances).

    A row's score is the sum of its ``n - f - 2`` (at least 1) smallest squared
    distances to the other ``n = copies + H`` rows.  A copy's other rows are
    ``copies - 1`` zeros and its distances to the honest rows; an honest row's are the
    other honest rows and ``copies`` times its distance to the candidate.  The copy is
    selected when its score is strictly below every honest score (Krum breaks ties by
    index, so a tie is not counted as selected).  ``[...]`` bool; NaN never selects.
    """
    h = honest.shape[-2]
    n = copies + h
    k = max(n - f - 2, 1)
    to_candidate = (candidate - honest).square().sum(dim=-1)  # [..., H]
    zeros = min(copies - 1, k)
    crafted = _sum_of_smallest(to_candidate, min(k - zeros, h))  # [...]
    self_excluded = torch.eye(h, dtype=torch.bool, device=honest.device)
    others = honest_squared.masked_fill(self_excluded, math.inf)  # [..., H, H]
    repeated = to_candidate.unsqueeze(-1).expand(*to_candidate.shape, copies)  # [..., H, copies]
    pool = torch.cat([others, repeated], dim=-1)
    best_honest = _sum_of_smallest(pool, min(k, n - 1)).amin(dim=-1) if h > 0 else crafted + math.inf
    return crafted < best_honest


@register
@attack_options
class FangKrum(AttackBase):
    """Fang et al.'s full-knowledge attack on Krum (USENIX Security 2020, Sec. 4.2):
    one crafted row ``c = r - lambda * s`` with ``s = sign(honest mean)`` (the
    paper's ``-s``, see the module note) and ``r`` the reference point (``centre``:
    the honest mean, the paper's ``w_Re``; or ``zero``, the gradient-space variant of
    Shejwalkar & Houmansadr's NDSS 2021 reimplementation, ``-lambda * s``), sent by
    every Byzantine sender (the paper's other ``c - 1`` models "close to" it, here
    exact copies).

    ``lambda`` starts at the paper's upper bound (with ``m = S`` senders, ``c = B``
    Byzantine, ``d`` coordinates and Euclidean distances ``D``)::

        1/((m - 2c - 1) sqrt(d)) * min_i sum_{l in Gamma_i} D(g_l, g_i) + 1/sqrt(d) * max_i D(g_i, r)

    over honest ``i``, ``Gamma_i`` the ``m - c - 2`` honest rows nearest ``g_i``
    (``m - 2c - 1`` clamped to >= 1), and is halved until Krum with budget ``f``
    (default ``B``; reduced, as :mod:`defenses`' Krum does, to the largest ``f`` with
    ``m > 2f + 2``) selects ``c``: at most ``steps`` values ``lambda_max / 2^t`` are
    tried, every leading block searched at once (the paper stops at ``lambda < 1e-5``;
    a fixed number of halvings does not depend on the gradients' scale).  Where none
    is selected, the smallest ``lambda`` tried is used.  With no honest sender the
    statistics are over all rows (:mod:`attacks._stats`).
    """

    name: ClassVar[str] = "fang_krum"
    summary: ClassVar[str] = "r - lambda*sign(mean), lambda halved until Krum selects it (Fang et al. 2020, Sec. 4.2)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "defense_aware"})
    f: Annotated[
        int | None, Field(ge=0, description="Krum's Byzantine budget assumed (None: the Byzantine count)")
    ] = None
    steps: Annotated[int, Field(ge=1, description="lambda values tried, halving from the paper's upper bound")] = 40
    centre: Annotated[
        Centre, Field(description="the reference r: mean (the paper's w_Re, as the honest mean) | zero (-lambda*s)")
    ] = "mean"

    @staticmethod
    def upper_bound(honest: Tensor, pairwise: Tensor, reference: Tensor, senders: int, byzantine: int) -> Tensor:
        """``[...]`` the paper's upper bound on ``lambda`` (see the class docstring), from
        the honest rows ``[..., H, d]``, their distances ``pairwise[..., H, H]`` and the
        reference point ``[..., 1, d]``."""
        h, d = honest.shape[-2], max(honest.shape[-1], 1)
        nearest = min(max(senders - byzantine - 2, 0), max(h - 1, 0))
        spread = pairwise.masked_fill(torch.eye(h, dtype=torch.bool, device=honest.device), math.inf)
        closest = _sum_of_smallest(spread, nearest).amin(dim=-1)
        far = torch.linalg.vector_norm(honest - reference, dim=-1).amax(dim=-1)
        return closest / (max(senders - 2 * byzantine - 1, 1) * math.sqrt(d)) + far / math.sqrt(d)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        honest = honest_rows(messages, context)
        mean = honest.mean(dim=-2, keepdim=True)
        direction = torch.sign(mean)
        reference = mean if self.centre == "mean" else torch.zeros_like(mean)
        senders, byzantine = messages.shape[-2], byzantine_count(context)
        f = min(byzantine if self.f is None else self.f, max((senders - 3) // 2, 0))  # Krum needs n > 2f + 2
        pairwise = euclidean_distances(honest, honest)  # [..., H, H]
        honest_squared = pairwise.square()
        lam = self.upper_bound(honest, pairwise, reference, senders, byzantine)  # [...]
        chosen = torch.full_like(lam, math.nan)
        for step in range(self.steps):  # halvings of lambda, every block at once
            if step:
                lam = lam / 2
            candidate = reference - lam[..., None, None] * direction
            selected = krum_selects_copies(candidate, honest, honest_squared, max(byzantine, 1), f)
            chosen = torch.where(torch.isnan(chosen) & selected, lam, chosen)
            if not bool(torch.isnan(chosen).any()):
                break
        chosen = torch.where(torch.isnan(chosen), lam, chosen)  # none selected: the smallest lambda tried
        return expand_rows(reference - chosen[..., None, None] * direction, messages, context)


@register
@attack_options
class FangTrimmedMean(AttackBase):
    """Fang et al.'s full-knowledge attack on the trimmed mean (USENIX Security 2020,
    Sec. 4.3; Sec. 4.4 applies it to the median unchanged).  Per coordinate ``j``, with
    ``max_j``, ``min_j`` the honest extremes: where the honest mean is positive (the
    parameter would decrease: the paper's ``s_j = -1`` read on gradients), every
    Byzantine value is drawn below ``min_j``, uniformly in ``[min_j / b, min_j]`` if
    ``min_j > 0`` and in ``[b * min_j, min_j]`` otherwise; elsewhere above ``max_j``,
    uniformly in ``[max_j, b * max_j]`` if ``max_j > 0`` and in ``[max_j, max_j / b]``
    otherwise.  That is, the extreme is scaled by a factor in ``[1, b]`` when it lies on
    the side pushed towards, by one in ``[1/b, 1]`` when it does not (the paper's
    ``b = 2``).  Every value is an independent draw from ``context.generator``.
    """

    name: ClassVar[str] = "fang_trimmed_mean"
    summary: ClassVar[str] = "per coordinate past the honest min/max, against the mean (Fang et al. 2020, Sec. 4.3)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "defense_aware"})
    b: Annotated[float, Field(gt=1, description="the extreme is scaled by a factor in [1, b] (or [1/b, 1])")] = 2.0

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        honest = honest_rows(messages, context)
        mean = honest.mean(dim=-2, keepdim=True)
        down = mean > 0  # push below the honest minimum
        extreme = torch.where(down, honest.amin(dim=-2, keepdim=True), honest.amax(dim=-2, keepdim=True))
        outward = torch.where(down, extreme < 0, extreme > 0)  # the extreme lies on the side pushed towards
        low = torch.where(outward, torch.ones_like(extreme), torch.full_like(extreme, 1.0 / self.b))
        high = torch.where(outward, torch.full_like(extreme, self.b), torch.ones_like(extreme))
        generator = context.generator
        draws = torch.rand(byzantine_shape(messages, context), generator=generator, device=generator.device,
                           dtype=messages.dtype).to(messages.device)
        factor = low + draws * (high - low)
        return (extreme * factor).to(messages.dtype).contiguous()
