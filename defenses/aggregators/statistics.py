"""Statistics several kinds of aggregator share and the row floor
(:mod:`robust_pfl.engine.rows`) does not hold: exact rescaling, per-problem budgets,
clipped means, bucket means and the top covariance eigenvalue."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from defenses.aggregators.base import BudgetedAggregator
from robust_pfl.engine.rows import ByzantineBudget, Rows, per_problem, row_norms, squared_distances


def scaled_rows(rows: Rows) -> Tensor:
    """The rows in float64, divided per problem by the power of two ``2^e`` with
    ``max_j ||x_j|| < 2^e <= 2 max_j ||x_j||`` over the admissible rows (``e = 0`` when
    every row is zero): every scaled admissible row has norm below 1, so their
    distances, Gram and covariance entries are at most 4, and the scaling is exact."""
    wide = rows.values.double()
    top = row_norms(wide).amax(-1) if wide.shape[-2] else wide.new_zeros(wide.shape[:-2])
    _, exponent = torch.frexp(top)
    exponent = torch.where(top > 0, exponent, torch.zeros_like(exponent))
    return torch.ldexp(wide, (-exponent)[..., None, None].to(wide.dtype))


def checked_budget(agg: ByzantineBudget, n: int) -> int:
    """``f`` for ``n`` rows after the ``2f < n`` check (the papers' ``f < n/2``) of the
    rules and pre-aggregators that need it."""
    f = agg.budget(n)
    if not 2 * f < n:
        raise ValueError(f"{agg.name}: needs 2*f < n, got f={f}, n={n}")
    return f


def problem_budgets(agg: BudgetedAggregator, rows: Rows) -> Tensor:
    """Per-problem ``f``: the configured one, at most ``(count - 1) // 2``."""
    return agg.budgets(rows.count, (rows.count - 1) // 2)


def stream_or_default(generator: torch.Generator | None) -> torch.Generator:
    """``generator``, or a fresh one seeded 0 where none is given."""
    return generator if generator is not None else torch.Generator().manual_seed(0)


def clip_scale(norms: Tensor, bound: Tensor) -> Tensor:
    """``min(1, bound / ||x||)`` per row (1 for a zero row), ``norms[..., N]``,
    ``bound[...]``."""
    bound = bound.unsqueeze(-1)
    return torch.where(norms > bound, bound / torch.where(norms > 0, norms, torch.ones_like(norms)),
                       torch.ones_like(norms))


def clipped_mean(values: Tensor, norms: Tensor, bound: Tensor, chosen: Tensor) -> Tensor:
    """Mean over ``chosen`` rows of ``values`` clipped to norm ``bound`` (per problem)."""
    scale = torch.where(chosen, clip_scale(norms, bound), torch.zeros_like(norms))
    total = (scale.to(values.dtype).unsqueeze(-2) @ values).squeeze(-2)
    return total / chosen.sum(-1).clamp_min(1).to(values.dtype).unsqueeze(-1)


def bucket_means(rows: Rows, s: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Karimireddy, He, Jaggi 2022, Alg. 1 lines 1-2: the admissible rows permuted at
    random (one float64 ``rand`` of shape ``[..., N]`` from ``generator``, inadmissible
    rows last; without a generator the given order) and the means of consecutive
    buckets of ``s``: ``(means[..., ceil(N / s), d], present[..., ceil(N / s)])``,
    ``present`` False for a bucket without an admissible row."""
    values, admissible, _ = rows
    n, d = values.shape[-2:]
    batch = values.shape[:-2]
    if generator is None:
        keys = torch.arange(n, dtype=torch.float64, device=values.device).expand(*batch, n)
    else:
        keys = torch.rand((*batch, n), generator=generator, dtype=torch.float64, device=generator.device)
        keys = keys.to(values.device)
    keys = torch.where(admissible, keys, torch.full_like(keys, math.inf))  # inadmissible last
    order = keys.argsort(dim=-1, stable=True)
    if batch:
        permuted = values.gather(-2, order.unsqueeze(-1).expand(*batch, n, d))
    else:  # one problem: a row gather, without an index per coordinate
        permuted = values.index_select(0, order)
    present = admissible.gather(-1, order)
    buckets = math.ceil(n / s)
    pad = buckets * s - n
    if pad:
        permuted = torch.cat([permuted, permuted.new_zeros(*batch, pad, d)], dim=-2)
        present = torch.cat([present, present.new_zeros(*batch, pad)], dim=-1)
    sums = permuted.reshape(*batch, buckets, s, d).sum(-2)
    sizes = present.reshape(*batch, buckets, s).sum(-1)
    return sums / per_problem(sizes, sums), sizes > 0


def top_covariance_eigenvalue(gram: Tensor) -> Tensor:
    """``lambda_max`` of the empirical covariance ``(1/k) sum_i (x_i - mu)(x_i - mu)^T``
    of ``k`` rows from their Gram block ``[..., k, k]``: the top eigenvalue of the
    doubly centred Gram ``H G H / k`` (``H = I - 11^T / k``), which has the
    covariance's non-zero eigenvalues."""
    k = gram.shape[-1]
    centred = (
        gram
        - gram.mean(-1, keepdim=True)
        - gram.mean(-2, keepdim=True)
        + gram.mean((-1, -2), keepdim=True)
    )
    return torch.linalg.eigvalsh(centred)[..., -1] / k


def krum_scores(rows: Rows, f: Tensor) -> Tensor:
    """Krum scores ``[..., N]`` (Blanchard et al. 2017, Sec. 4): for each row, the sum of
    squared distances to its ``n - f - 2`` nearest other admissible rows (at least 1).

    Distances are taken between admissible rows only (inadmissible ones are zeroed and
    their distances set to ``inf``); a distance that overflows is ``inf`` ("very far").
    Admissible scores are clamped to the dtype's maximum, inadmissible ones are
    ``inf``, so ranking by score always puts admissible rows first and no NaN arises.
    """
    values, admissible, count = rows
    n = values.shape[-2]
    squared = squared_distances(values)
    self_or_absent = torch.eye(n, dtype=torch.bool, device=values.device) | ~admissible.unsqueeze(-2)
    squared = torch.where(self_or_absent | torch.isnan(squared), torch.full_like(squared, math.inf), squared)
    nearest = squared.sort(dim=-1).values.cumsum(-1)  # only +inf is ever added: no inf - inf
    k = (count - f - 2).clamp_min(1)
    index = (k - 1)[..., None, None].expand(*nearest.shape[:-1], 1)
    scores = nearest.gather(-1, index).squeeze(-1)
    biggest = torch.finfo(values.dtype).max
    scores = torch.nan_to_num(scores, nan=biggest, posinf=biggest)
    return torch.where(admissible, scores, torch.full_like(scores, math.inf))
