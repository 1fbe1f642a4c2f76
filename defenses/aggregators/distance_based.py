"""Rules that weigh rows by their distances to each other: Krum, Multi-Krum, the
geometric median, MoNNA and CAF."""

from __future__ import annotations

import math
from typing import Annotated

import torch
from pydantic import Field
from torch import Tensor

from defenses.aggregators.base import Aggregator, BudgetedAggregator, aggregator_options, register
from defenses.aggregators.statistics import checked_budget, krum_scores, problem_budgets, scaled_rows
from robust_pfl.engine.rows import Rows, coordinate_median, masked_mean, row_norms, weighted_sum


@aggregator_options
class KrumFamily(BudgetedAggregator):
    """Shared by Krum and Multi-Krum: scores, then the mean of the ``m`` lowest."""

    def check(self, n: int) -> None:
        super().check(n)
        f = self.budget(n)
        if not n > 2 * f + 2:
            raise ValueError(f"{self.name}: needs n > 2*f + 2, got f={f}, n={n}")

    def flops(self, n: int, d: int) -> float:
        return 3.0 * n * n * d  # the pairwise distances

    def _selected(self, count: Tensor, f: Tensor) -> Tensor:
        raise NotImplementedError

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        count = rows.count
        f = self.budgets(count, (count - 3) // 2)  # largest f with n > 2f + 2
        scores = krum_scores(rows, f)
        rank = scores.argsort(dim=-1, stable=True).argsort(dim=-1)
        chosen = (rank < self._selected(count, f).unsqueeze(-1)) & rows.admissible
        return masked_mean(rows.values, chosen)


@register
@aggregator_options
class Krum(KrumFamily):
    """Krum (Blanchard, El Mhamdi, Guerraoui, Stainer 2017, Sec. 4): the row with the
    smallest score ``sum_{j in n-f-2 nearest} ||x_i - x_j||^2``.  Requires
    ``n > 2f + 2``; ties go to the lowest index."""

    name = "krum"
    summary = "the row whose n-f-2 nearest neighbours are closest (squared distances)"
    reference = "Blanchard, El Mhamdi, Guerraoui, Stainer 2017 (NeurIPS), Krum, Sec. 4"

    def _selected(self, count: Tensor, f: Tensor) -> Tensor:
        return torch.ones_like(count)


@register
@aggregator_options
class MultiKrum(KrumFamily):
    """Multi-Krum (Blanchard et al. 2017, the m-Krum variant): the mean of the ``m`` rows with the
    lowest Krum scores; ``m = n - f`` by default (El Mhamdi et al. 2018).  Requires
    ``n > 2f + 2`` and ``m <= n``."""

    name = "multi_krum"
    summary = "mean of the m rows with the lowest Krum scores (default m = n - f)"
    reference = "Blanchard, El Mhamdi, Guerraoui, Stainer 2017 (NeurIPS), Multi-Krum (m-Krum)"

    m: Annotated[int | None, Field(ge=1, description="rows averaged (default n - f)")] = None

    def check(self, n: int) -> None:
        super().check(n)
        if self.m is not None and self.m > n:
            raise ValueError(f"{self.name}: needs m <= n, got m={self.m}, n={n}")

    def _selected(self, count: Tensor, f: Tensor) -> Tensor:
        if self.m is None:
            return count - f
        return count.clamp_max(self.m)


@register
@aggregator_options
class GeometricMedian(Aggregator):
    """Geometric median ``argmin_z sum_j ||z - x_j||`` by Weiszfeld iterations, as in
    RFA (Pillutla, Kakade, Harchaoui 2022, "Robust aggregation for federated
    learning", smoothed Weiszfeld algorithm), for ``iterations`` steps::

        T(z) = sum_{j far} w_j x_j / sum_{j far} w_j,   w_j = 1 / ||z - x_j||
        z   <- z + (1 - min(1, eta / r)) (T(z) - z)

    where rows within ``nu`` of ``z`` (RFA's smoothing parameter) count as coinciding
    with it, ``eta`` is their number and ``r = ||sum_{j far} w_j (x_j - z)||``: the
    Vardi & Zhang (2000, PNAS, "The multivariate L1-median and associated data depth")
    correction.  Without it, RFA's weight ``1 / max(nu, 0) = 1 / nu`` pins an iterate
    that sits on a row to that row for many steps (measured: a start on a non-optimal
    row barely moves); with it, ``z`` stays on a row only when that row is optimal
    (``r <= eta``), and the steps are plain Weiszfeld steps (weights ``1 / ||z - x_j||``)
    otherwise.

    It starts from the coordinate-wise median rather than the mean, so one huge row
    (a 1e6 large gradient) cannot place the start far away; in low dimension that
    start is often a row, hence the correction.  Every iterate lies between the
    previous one and a convex combination of admissible rows, hence is finite.
    """

    name = "geometric_median"
    summary = "Weiszfeld geometric median (RFA), started at the coordinate-wise median"
    reference = (
        "Pillutla, Kakade, Harchaoui 2022 (IEEE TSP), RFA, smoothed Weiszfeld; "
        "Vardi & Zhang 2000 (PNAS), modified Weiszfeld"
    )

    iterations: Annotated[int, Field(ge=0, description="Weiszfeld steps")] = 10
    nu: Annotated[float, Field(gt=0, description="RFA's smoothing: rows within nu of z coincide with it")] = 1e-6

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        z = coordinate_median(rows)
        scratch = torch.empty_like(rows.values) if self.iterations else None  # one [N, d] for every step
        for _ in range(self.iterations):
            difference = torch.sub(rows.values, z.unsqueeze(-2), out=scratch)
            distance = row_norms(difference)
            far = rows.admissible & (distance > self.nu)
            weight = torch.where(far, distance.reciprocal(), torch.zeros_like(distance))  # inf: 0
            total = weight.sum(-1, keepdim=True)  # 0: every row coincides with z or is infinitely far
            pull = weighted_sum(difference, weight)  # r's vector, sum_j w_j (x_j - z)
            step = pull / torch.where(total > 0, total, torch.ones_like(total))  # T(z) - z
            eta = (rows.admissible & ~far).sum(-1, keepdim=True).to(z.dtype)  # rows at z
            stay = (eta / row_norms(pull.unsqueeze(-2))).clamp_max(1.0)  # r = 0: inf -> 1
            stay = torch.where(eta > 0, stay, torch.zeros_like(stay))
            z = z + (1 - stay) * step
        return z


@register
@aggregator_options
class MoNNA(BudgetedAggregator):
    """The nearest-neighbour averaging step of MoNNA (Farhadkhani, Guerraoui, Gupta,
    Hoang, Pinot, Stephan 2023, ICML, "Robust collaborative learning with linear
    gradient overhead"; the algorithm adds local momentum, which this project's
    optimiser provides)::

        MoNNA_{f, idx}(x_1..x_n) = (1 / (n - f)) sum_{i in N_idx} x_i

    with ``N_idx`` the ``n - f`` rows nearest to ``x_idx``, ``x_idx`` itself included
    (ByzFL's ``MoNNA(f, idx)``, same ``idx``: the 0-based position of the trusted row
    among the ``N`` messages; ByzFL's ``x_{idx+1}`` in 1-based notation).

    In the paper's peer-to-peer setting ``x_idx`` is the aggregating node's own,
    trusted, vector.  At a server no row is trusted: the default ``idx = 0`` trusts the
    first client, and a Byzantine row there is not resisted.  If row ``idx`` is
    inadmissible (never the case for a trusted row), the first admissible row is the
    centre.  Ties in distance go to the lower index.  Not Allouah et al. 2023 ("Fixing
    by mixing"), whose NNM replaces *every* row by such a neighbourhood mean.
    """

    name = "monna"
    summary = "mean of the n-f rows nearest to the trusted row idx (itself included)"
    reference = (
        "Farhadkhani, Guerraoui, Gupta, Hoang, Pinot, Stephan 2023 (ICML), Robust collaborative learning "
        "with linear gradient overhead, MoNNA; as in ByzFL's MoNNA"
    )

    idx: Annotated[int, Field(ge=0, description="position of the trusted row the neighbourhood is centred on")] = 0

    def check(self, n: int) -> None:
        super().check(n)
        checked_budget(self, n)
        if not self.idx < n:
            raise ValueError(f"{self.name}: needs idx < n, got idx={self.idx}, n={n}")

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        admissible = rows.admissible
        first = admissible.to(torch.int8).argmax(-1)  # the first admissible row (0 if none)
        centre = torch.where(admissible[..., self.idx], torch.full_like(first, self.idx), first)
        scaled = scaled_rows(rows)
        at = centre[..., None, None].expand(*centre.shape, 1, scaled.shape[-1])
        distance = (scaled - scaled.gather(-2, at)).square().sum(-1)  # [..., N]
        distance = torch.where(admissible, distance, torch.full_like(distance, math.inf))
        rank = distance.argsort(dim=-1, stable=True).argsort(dim=-1)
        keep = rows.count - problem_budgets(self, rows)
        chosen = (rank < keep.unsqueeze(-1)) & admissible
        return masked_mean(rows.values, chosen)


@register
@aggregator_options
class CovarianceBoundAgnosticFilter(BudgetedAggregator):
    """Covariance-bound agnostic filter (CAF; Allouah, Guerraoui, Stephan 2025, ICML,
    "Towards trustworthy federated learning with untrusted participants"), as ByzFL's
    ``CAF`` states it.  Weights ``c_i = 1``; while ``sum_i c_i > n - 2f``::

        mu_c    = sum_i c_i x_i / sum_i c_i
        Sigma_c = sum_i c_i (x_i - mu_c)(x_i - mu_c)^T / sum_i c_i
        (lambda, v) = top eigenpair of Sigma_c
        tau_i   = ((x_i - mu_c)^T v)^2
        c_i    <- c_i (1 - tau_i / max_{j: c_j > 0} tau_j)

    and return the ``mu_c`` of the smallest ``lambda`` met (the first on ties).  With
    ``f = 0`` the loop never runs and the plain mean is returned (ByzFL returns None).

    Differences from ByzFL, on purpose: ``(lambda, v)`` is exact (``torch.linalg.eigh``
    of the ``[N, N]`` matrix ``W^1/2 K W^1/2``, ``K`` the centred Gram and
    ``W = diag(c / sum c)``, which has ``Sigma_c``'s non-zero eigenvalues; ByzFL does
    one power iteration from a random vector); ``tau``'s maximum is over the rows still
    weighted (ByzFL: all rows), so every round zeroes a weighted row and the loop ends
    within ``2f`` rounds; a covariance of zero (``lambda = 0``) ends it at once (its
    ``mu_c`` is optimal; ByzFL divides 0 by 0).  Cost: one ``N^2 d`` Gram product, then
    ``O(f N^3)``.
    """

    name = "caf"
    summary = "iterative down-weighting along the top covariance eigenvector; mean of least spread"
    reference = (
        "Allouah, Guerraoui, Stephan 2025 (ICML), Towards trustworthy FL with untrusted participants, CAF; "
        "as in ByzFL's CAF"
    )

    def check(self, n: int) -> None:
        super().check(n)
        checked_budget(self, n)

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        scaled = scaled_rows(rows)
        gram = scaled @ scaled.transpose(-1, -2)  # [..., N, N], entries at most 1
        count = rows.count
        f = problem_budgets(self, rows)
        floor = (count - 2 * f).to(gram.dtype)
        c = rows.admissible.to(gram.dtype)
        best_c = c  # the weights of the best mu_c so far: at first the plain mean's
        best = torch.full(count.shape, math.inf, dtype=gram.dtype, device=gram.device)
        active = (count > 0) & (c.sum(-1) > floor)
        rounds = 2 * int(f.max()) + 1 if f.numel() else 0
        for _ in range(rounds):
            if not bool(active.any()):
                break
            w = c / c.sum(-1, keepdim=True).clamp_min(1.0)  # active problems weigh > n - 2f >= 1
            gw = (gram @ w.unsqueeze(-1)).squeeze(-1)  # <x_i, mu>
            centred = gram - gw.unsqueeze(-1) - gw.unsqueeze(-2) + (w * gw).sum(-1)[..., None, None]  # K
            root = w.sqrt()
            values, vectors = torch.linalg.eigh(root.unsqueeze(-1) * centred * root.unsqueeze(-2))
            top = values[..., -1].clamp_min(0.0)
            better = active & (top < best)
            best = torch.where(better, top, best)
            best_c = torch.where(better.unsqueeze(-1), c, best_c)
            # (x_i - mu)^T v with v = Y^T W^1/2 u / sqrt(lambda): (K W^1/2 u)_i / sqrt(lambda)
            projection = (centred @ (root * vectors[..., -1]).unsqueeze(-1)).squeeze(-1)
            tau = projection.square() / torch.where(top > 0, top, torch.ones_like(top)).unsqueeze(-1)
            weighted = c > 0
            tau_max = torch.where(weighted, tau, torch.zeros_like(tau)).amax(-1, keepdim=True)
            moving = active & (top > 0) & (tau_max.squeeze(-1) > 0)
            shrink = (1 - tau / torch.where(tau_max > 0, tau_max, torch.ones_like(tau_max))).clamp(0.0, 1.0)
            c = torch.where(moving.unsqueeze(-1), c * shrink, c)
            active = moving & (c.sum(-1) > floor)
        # sum_i c_i x_i / sum_i c_i, as the plain mean for c = 1 (c_i <= 1: the sum of an
        # admissible row's n multiples cannot overflow); a kept c sums to more than
        # n - 2f >= 1, or to 0 without admissible rows (the base class's fallback then)
        total = best_c.sum(-1, keepdim=True).clamp_min(1.0).to(rows.values.dtype)
        return weighted_sum(rows.values, best_c.to(rows.values.dtype)) / total
