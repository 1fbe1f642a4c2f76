"""Defense-specific attacks of Blades: rows built against ClippedClustering and SignGuard.

Li, Xie, Lu, Zhang & Li, "An experimental study of Byzantine-robust aggregation schemes
in federated learning", IEEE Transactions on Big Data, 2023 (Blades) evaluate each
defense also against an attack tailored to it.  Against ClippedClustering the
Byzantine rows are rotated, in the plane of the honest mean and an honest row, as far
away from the mean as they can go while average-linkage clustering still groups them
with the honest majority; against SignGuard they copy the sign statistics the defense
clusters on while their values carry no useful signal.  This module implements the two
ideas on the messages the federation delivers (both omniscient):

* :class:`ClippedClusteringAttack`: rows at the honest median norm (clipping leaves
  them whole) at the largest angle from the honest mean at which they stay in the
  larger cluster, the angle found by bisection against the defense's own ``aggregate``
  probe when the context offers one, else against average-linkage clustering
  computed here;
* :class:`SignGuardAttack`: rows with the honest rows' fractions of positive, zero and
  negative coordinates (window by window, so that any block SignGuard draws sees them)
  and the honest median norm, whose magnitude sits on the coordinates where their sign
  opposes the honest mean (Xu, Huang, Song & Lan, "SignGuard: Byzantine-robust
  federated learning through collaborative malicious gradient filtering", ICDCS 2022,
  is the defense).

Attacks never import :mod:`defenses`: the clustering rule used when no probe is
offered is the defense's own, from the module both share
(:func:`robust_pfl.engine.rows.agglomerate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from attacks._stats import byzantine_count, expand_rows, honest_rows, norm, unit
from attacks.base import attack_options, register
from attacks.search import warm_start
from robust_pfl.engine.rows import admissible_points, agglomerate, largest_cluster, masked_mean, masked_median
from robust_pfl.engine.types import AttackBase, AttackContext

F64 = torch.float64

#: The outward rotation (radians) of the membership test against a probe.
PROBE_TURN = 1e-4


# -- ClippedClustering -----------------------------------------------------------------------
@register
@attack_options
class ClippedClusteringAttack(AttackBase):
    """The attack on ClippedClustering of Blades (Li et al., IEEE TBD 2023): rows that
    average-linkage clustering on cosine distances keeps in the larger cluster, turned
    as far from the honest mean as that allows (omniscient and adaptive).

    With ``mu`` the mean and ``m`` the median norm of the admissible (finite) honest
    rows, ``u = unit(mu)`` and ``v`` the unit direction, orthogonal to ``u``, of the
    honest row farthest in angle from ``mu``, every Byzantine row is::

        scale * m * (cos(theta) u + sin(theta) v)

    ``theta`` in ``[0, pi]`` (``pi`` points at ``-mu``) is found per leading block:
    the largest of the angles ``pi * k / grid`` (``k = 0..grid``) at which the rows are
    kept, then (unless it is ``pi``) ``steps`` bisections between it and the next
    coarse angle, keeping the largest angle found kept (the coarse pass guards against
    membership that is not monotone in ``theta``; the bisection assumes it is, between
    two coarse angles).  "Kept" is judged by

    * the defense's probe ``context.defense_state["aggregate"]`` when offered: the rows
      at ``theta`` are kept when turning them further out by ``1e-4`` radians changes
      the aggregate (a filter that dropped them gives the same output for both: the
      test is exact for ClippedClustering unless the rows' membership, or which honest
      rows are kept, changes within that turn);
    * else :func:`robust_pfl.engine.rows.agglomerate` on the cosine distances of the delivered rows
      (clipping does not change directions), the Byzantine rows kept when they are in
      the larger cluster (ties: the one holding the lowest row), as ClippedClustering
      does.

    Blades' adversary turns its rows in the plane of the mean and the honest row of the
    larger (single-linkage) cluster farthest from it, by a closed-form angle (that row's
    angle plus the smallest angle between two honest rows), and sends them at 10 times
    the mean's norm; here the angle is searched against the rule itself, so the rows
    are kept whenever some angle keeps them, and go as far as the rule allows.

    With ``search_every = k > 1`` the full search runs in the rounds ``t`` with ``t mod
    k = 0``; in the others it starts from the angles of the previous call (kept in
    ``context.memory``): where, in every block, the angle a quarter coarse step below it
    is kept and the angle a quarter step above it is not, ``warm_steps`` bisections
    between the two replace the coarse pass and its bisection (2 + ``warm_steps``
    membership tests instead of ``grid + steps``); otherwise the full search runs.
    Between rounds the honest rows move little, so the boundary moves little; a kept
    angle farther out (membership that is not monotone) is found again at the next full
    search.

    ``scale = 1`` puts the rows at the honest median norm, so clipping to the median
    leaves them whole; a larger ``scale`` raises the median the defense clips to (the
    rows are clipped to it).  Degenerate cases draw from ``context.generator`` (two
    normal vectors every call): ``mu = 0`` takes ``u`` from the first, honest rows all
    parallel to ``mu`` take ``v`` from the second.  Without an honest sender the rows
    are ``-scale * m * u`` of all rows' statistics.
    """

    name: ClassVar[str] = "clipped_clustering_attack"
    summary: ClassVar[str] = "median-norm rows turned from the mean as far as ClippedClustering keeps them (Blades)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive", "defense_aware"})
    grid: Annotated[int, Field(ge=1, le=64, description="coarse angles pi*k/grid tried before the bisection")] = 8
    steps: Annotated[int, Field(ge=0, le=60, description="bisection steps after the coarse angles")] = 12
    scale: Annotated[float, Field(gt=0, description="the rows' norm in honest median norms")] = 1.0
    search_every: Annotated[int, Field(ge=1, le=1_000_000, description=(
        "rounds between full searches; in the rounds between, the search bisects a bracket around the previous "
        "round's angles when its ends are kept and not kept; 1: a full search every round"))] = 1
    warm_steps: Annotated[int, Field(ge=0, le=60, description="bisection steps of a warm-started search")] = 6

    def plane(self, honest: Tensor, admissible: Tensor, draws: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(u, v, m)``: the unit mean ``[..., 1, d]``, the unit turn direction
        ``[..., 1, d]`` (orthogonal to ``u``) and the median norm ``[..., 1, 1]``."""
        wide = torch.where(admissible.unsqueeze(-1), honest.to(F64), torch.zeros_like(honest, dtype=F64))
        mean = masked_mean(wide, admissible).unsqueeze(-2)
        u = torch.where(norm(mean) > 0, unit(mean), unit(draws[0].to(mean.device)).expand_as(mean))
        units = unit(wide)
        cosines = (units * u).sum(dim=-1)  # [..., H]
        farthest = torch.where(admissible, cosines, torch.full_like(cosines, math.inf)).argmin(dim=-1)
        row = units.gather(-2, farthest[..., None, None].expand(*farthest.shape, 1, wide.shape[-1]))
        across = row - (row * u).sum(dim=-1, keepdim=True) * u
        fallback = draws[1].to(mean.device) - (draws[1].to(mean.device) * u).sum(dim=-1, keepdim=True) * u
        small = norm(across) <= torch.finfo(F64).eps ** 0.5
        v = torch.where(small, unit(fallback), unit(across))
        m = masked_median(norm(wide, keepdim=False), admissible)[..., None, None]
        return u, v, m

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        draws = torch.randn(2, messages.shape[-1], generator=context.generator, device=context.generator.device,
                            dtype=F64)
        byzantine = context.byzantine.to(messages.device)
        count = byzantine_count(context)
        if count == 0:
            return expand_rows(messages[..., :0, :], messages, context)
        honest = honest_rows(messages, context)
        admissible = admissible_points(honest)
        u, v, m = self.plane(honest, admissible, draws)
        lead = messages.shape[:-2]
        if bool(byzantine.all()):  # every sender is ours: nothing to stay close to
            theta = torch.full(lead, math.pi, dtype=F64, device=messages.device)
        else:
            probe = (context.defense_state or {}).get("aggregate")
            kept = (self.probe_kept(messages, byzantine, u, v, m, probe) if probe is not None
                    else self.rule_kept(honest, admissible, byzantine, u, v, m))
            memory_key = f"{self.name}:{context.kind}:angles"
            start = warm_start(context.memory, memory_key, context.round_index, self.search_every)
            theta = None if start is None or tuple(start.shape) != tuple(lead) else self.warm_search(kept, start)
            if theta is None:
                theta = self.search(kept, lead, messages.device)
            if self.search_every > 1:
                context.memory[memory_key] = theta.clone()
        return expand_rows(self.rows(theta, u, v, m), messages, context)

    def warm_search(self, kept: Callable[[Tensor], Tensor], start: Tensor) -> Tensor | None:
        """``[...]`` the angle found by bisecting the bracket of a quarter coarse step on
        either side of ``start``, or ``None`` when in some block its lower end is not
        kept (unless 0) or its upper end is (unless it is ``pi``, then the answer)."""
        step = math.pi / self.grid / 4
        low = torch.clamp(start - step, min=0.0)
        high = torch.clamp(start + step, max=math.pi)
        if not bool((kept(low) | (low <= 0)).all()):
            return None
        top = kept(high)
        if bool((top & (high < math.pi)).any()):
            return None
        low = torch.where(top, high, low)
        done = low >= math.pi
        for _ in range(self.warm_steps):
            middle = (low + high) / 2
            inside = kept(middle) & ~done
            low = torch.where(inside, middle, low)
            high = torch.where(inside | done, high, middle)
        return low

    def rows(self, theta: Tensor, u: Tensor, v: Tensor, m: Tensor) -> Tensor:
        """``[..., 1, d]`` the row at angle ``theta[...]``."""
        angle = theta[..., None, None]
        return self.scale * m * (torch.cos(angle) * u + torch.sin(angle) * v)

    def search(self, kept: Callable[[Tensor], Tensor], lead: torch.Size, device: Any) -> Tensor:
        """``[...]`` the angle: the largest of the ``grid + 1`` angles ``pi * k / grid``
        found kept (0 when none is), then, unless that is ``pi``, ``steps`` bisections
        between it and the next grid angle, keeping the largest angle found kept."""
        low = torch.zeros(lead, dtype=F64, device=device)
        for k in range(1, self.grid + 1):  # a loop over candidate angles, each batched over the blocks
            angle = torch.full(lead, math.pi * k / self.grid, dtype=F64, device=device)
            low = torch.where(kept(angle), angle, low)
        high = torch.clamp(low + math.pi / self.grid, max=math.pi)
        done = low >= math.pi
        for _ in range(self.steps):
            middle = (low + high) / 2
            inside = kept(middle) & ~done
            low = torch.where(inside, middle, low)
            high = torch.where(inside | done, high, middle)
        return low

    def rule_kept(self, honest: Tensor, admissible: Tensor, byzantine: Tensor, u: Tensor, v: Tensor,
                  m: Tensor) -> Callable[[Tensor], Tensor]:
        """The membership test by average-linkage clustering computed here."""
        units = unit(torch.where(admissible.unsqueeze(-1), honest.to(F64), torch.zeros_like(honest, dtype=F64)))
        gram = units @ units.transpose(-1, -2)  # [..., H, H]
        along, across = (units * u).sum(dim=-1), (units * v).sum(dim=-1)  # [..., H]
        senders = byzantine.shape[0]
        honest_index = (~byzantine).nonzero().squeeze(-1)
        byzantine_index = byzantine.nonzero().squeeze(-1)
        present = torch.ones((*honest.shape[:-2], senders), dtype=torch.bool, device=honest.device)
        present[..., honest_index] = admissible
        nonzero = (m.squeeze(-1).squeeze(-1) > 0)

        def kept(theta: Tensor) -> Tensor:
            cosine = torch.cos(theta).unsqueeze(-1) * along + torch.sin(theta).unsqueeze(-1) * across  # [..., H]
            cosine = torch.where(nonzero.unsqueeze(-1), cosine, torch.zeros_like(cosine))
            full = torch.empty((*honest.shape[:-2], senders, senders), dtype=F64, device=honest.device)
            full[..., honest_index.unsqueeze(-1), honest_index] = gram
            full[..., honest_index.unsqueeze(-1), byzantine_index] = cosine.unsqueeze(-1)
            full[..., byzantine_index.unsqueeze(-1), honest_index] = cosine.unsqueeze(-2)
            same = torch.where(nonzero, 1.0, 0.0).to(F64)[..., None, None]
            full[..., byzantine_index.unsqueeze(-1), byzantine_index] = same
            labels, sizes = agglomerate(1.0 - full.clamp(-1.0, 1.0), present, "average", clusters=2)
            return largest_cluster(labels, sizes).index_select(-1, byzantine_index).all(dim=-1)

        return kept

    def probe_kept(self, messages: Tensor, byzantine: Tensor, u: Tensor, v: Tensor, m: Tensor,
                   probe: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        """The membership test through the defense's ``aggregate`` probe: the rows are
        kept when turning them further out changes the aggregate."""
        share = int(byzantine.sum()) / byzantine.shape[0]
        tolerance = 0.01 * PROBE_TURN * min(self.scale, 1.0) * share * m.squeeze(-1).squeeze(-1)  # [...]

        def deliver(theta: Tensor) -> Tensor:
            delivered = messages.clone()
            delivered[..., byzantine, :] = self.rows(theta, u, v, m).to(messages.dtype)
            return probe(delivered).to(F64)

        def kept(theta: Tensor) -> Tensor:
            change = norm(deliver(theta) - deliver(theta + PROBE_TURN), keepdim=False)  # [..., R]
            change = torch.nan_to_num(change, nan=0.0)
            return change.amax(dim=-1) > tolerance

        return kept


# -- SignGuard -------------------------------------------------------------------------------
def _window_rank(key: Tensor, window: int) -> Tensor:
    """``[..., d]`` the rank of every coordinate's ``key`` within its window of
    ``window`` consecutive coordinates (ascending; ties: the lower coordinate)."""
    d = key.shape[-1]
    which = torch.arange(d, device=key.device) // window
    by_key = key.argsort(dim=-1, stable=True)
    by_window = which[by_key].argsort(dim=-1, stable=True)
    order = by_key.gather(-1, by_window)  # coordinates sorted by (window, key)
    position = torch.arange(d, device=key.device).expand_as(order)
    start = which[order] * window
    return torch.empty_like(order).scatter_(-1, order, position - start)


def _window_counts(fraction: Tensor, window: int) -> Tensor:
    """``[..., d]`` for each coordinate, how many of its window's coordinates should
    carry a property whose per-coordinate frequency is ``fraction[..., d]``: the
    rounded running total at the window's end minus that at its start, so that any
    run of whole windows gets the rounded total of its frequencies."""
    d = fraction.shape[-1]
    total = torch.cat([torch.zeros_like(fraction[..., :1]), fraction.cumsum(dim=-1)], dim=-1).round()
    which = torch.arange(d, device=fraction.device) // window
    start = which * window
    end = torch.clamp(start + window, max=d)
    return total.index_select(-1, end) - total.index_select(-1, start)


@register
@attack_options
class SignGuardAttack(AttackBase):
    """The attack on SignGuard of Blades (Li et al., IEEE TBD 2023) against SignGuard
    (Xu, Huang, Song & Lan, ICDCS 2022): rows whose sign statistics and norm are the
    honest rows' (so SignGuard's norm filter and sign clustering keep them) and whose
    values oppose the honest mean (omniscient).

    SignGuard keeps rows with ``L <= norm / median norm <= R`` that fall in the larger
    cluster of the (positive, zero, negative) coordinate fractions on a random block of
    coordinates.  Blades' adversary sends uniform random magnitudes with the honest
    mean's numbers of positive, zero and negative coordinates, shuffled: it survives
    the filters but carries no signal (its rows are nearly orthogonal to the mean).
    Here the sign pattern is chosen to push against the mean.  The coordinates are cut
    into windows of ``window`` (the default 8 keeps the rows' fractions on any block
    close to the honest average while leaving room to oppose the mean: on
    ``N(mu, 1)`` rows, 1000 coordinates and SignGuard's blocks of 100, windows of 32
    put the rows in the smaller 2-means cluster on ~3% of the block positions, 8 on
    none, and the rows' cosine with ``-mu`` is ~0.88 against ~0.91).  In each window
    the numbers of zero and negative coordinates are the honest rows' average numbers,
    rounded on running totals (so a block of whole windows gets the honest fractions up
    to one coordinate; where zeros and negatives together would exceed the window, the
    negatives are cut to fit), the rest positive.  Within a window,
    the zeros go to the coordinates of smallest ``|mu_j|`` (``mu`` the honest mean), the
    negatives to the largest ``mu_j``, the positives to the others (the most negative
    ``mu_j`` first).  The coordinates whose sign then opposes ``mu_j`` carry
    ``-mu_j``; the others (sign agreeing with ``mu_j``, or ``mu_j = 0``) a tiny
    ``tiny * m / sqrt(d)`` of their sign; the row is scaled to norm ``scale * m``,
    ``m`` the honest median norm (the statistics over the admissible honest rows).
    Deterministic: ``context.generator`` is not used.
    """

    name: ClassVar[str] = "signguard_attack"
    summary: ClassVar[str] = "honest sign fractions and median norm, magnitude where the sign opposes the mean (Blades)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "defense_aware"})
    window: Annotated[
        int, Field(ge=1, description="coordinates per window whose sign counts match the honest rows'")
    ] = 8
    scale: Annotated[float, Field(gt=0, description="the rows' norm in honest median norms")] = 1.0
    tiny: Annotated[
        float, Field(gt=0, lt=1, description="magnitude of coordinates whose sign agrees with the mean, in m/sqrt(d)")
    ] = 1e-3

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        honest = honest_rows(messages, context)
        admissible = admissible_points(honest)
        wide = torch.where(admissible.unsqueeze(-1), honest.to(F64), torch.zeros_like(honest, dtype=F64))
        count = admissible.sum(dim=-1).clamp_min(1).to(F64).unsqueeze(-1)  # [..., 1]
        mean = masked_mean(wide, admissible)  # [..., d]
        shown = admissible.unsqueeze(-1)
        negative = ((wide < 0) & shown).sum(dim=-2) / count  # per coordinate, the honest frequency
        zero = ((wide == 0) & shown).sum(dim=-2) / count
        window = min(self.window, max(messages.shape[-1], 1))
        zeros = _window_counts(zero, window)
        negatives = torch.minimum(_window_counts(negative, window), window - zeros)
        is_zero = _window_rank(mean.abs(), window) < zeros
        rank = _window_rank(torch.where(is_zero, math.inf, -mean), window)  # largest mean first, zeros last
        is_negative = ~is_zero & (rank < negatives)
        sign = torch.where(is_zero, 0.0, torch.where(is_negative, -1.0, 1.0)).to(F64)
        opposing = sign * mean < 0
        d = max(messages.shape[-1], 1)
        m = masked_median(norm(wide, keepdim=False), admissible).unsqueeze(-1)  # [..., 1]
        floor = self.tiny * m / math.sqrt(d)
        values = torch.where(opposing, -mean, sign * floor)
        values = torch.where(torch.isfinite(values), values, sign * floor)
        row = self.scale * m * unit(values)
        return expand_rows(row.unsqueeze(-2), messages, context)
