"""Five robust aggregators that ByzFL ships (LPD-EPFL/byzfl, ``byzfl.aggregators``),
written for this project's contract: batched over leading problem dimensions,
inadmissible (NaN / Inf / overflowing) rows treated as absent, ``f`` (or
``fraction``) per problem shrunk to what the admissible count supports, and no Python
loop over clients or problems (:mod:`defenses.robust_aggregators`).

* ``mda``: mean of the ``n - f`` rows of smallest diameter; ``C(n, f)`` subsets.
* ``monna``: mean of the ``n - f`` nearest neighbours of a trusted row; ``N d``.
* ``meamed``: per coordinate, mean of the ``n - f`` values nearest the median;
  ``N d log N``.
* ``caf``: covariance-bound agnostic filter (iterative spectral filtering);
  ``N^2 d + f N^3``.
* ``smea``: mean of the ``n - f`` rows whose covariance has the smallest top
  eigenvalue; ``C(n, f)`` subsets.

Conventions shared with ByzFL and where they differ (each class says more):

* ``f`` is the number of rows the rule discards: ByzFL's ``n - f`` rows are this
  module's ``n - f`` rows (no ``n - f - 2`` as in Krum).  Every rule needs ``2f < n``
  (ByzFL raises on ``2f >= n`` too); with fewer admissible rows, ``f`` shrinks to
  ``(n - 1) // 2``.  Neither ``f`` nor ``fraction`` means ``f = 1`` (ByzFL: 0).
* Ties are broken deterministically: the first subset in ``itertools.combinations``
  order of the admissible rows (MDA, SMEA), the lowest index (MoNNA), the lower value
  (Meamed).  ByzFL leaves Meamed's and MoNNA's ties to ``argpartition``.
* Where ByzFL approximates the top eigenvalue of a covariance by one power
  iteration from a *random* start (CAF, SMEA; so its output is random), this module
  computes it exactly with ``torch.linalg`` on the small ``[N, N]`` (or ``[k, k]``)
  centred Gram matrix, which has the same non-zero eigenvalues as the ``d x d``
  covariance.

Quadratic quantities (distances, Gram matrices) are taken in float64 on the rows
divided by a per-problem power of two that brings the largest admissible row norm
below 1 (exact, and no admissible row can make them overflow); the aggregates are
means of the original rows.

MDA and SMEA enumerate subsets: ``C(n, f)`` of them, exponential in ``f``.  Their
``check(n)`` refuses sizes with more than ``max_subsets`` (default ``10**6``) subsets.
Measured on one CPU thread, ``n = 25`` rows: MDA scores about ``3 * 10^5`` subsets a
second, SMEA (a ``k x k`` eigenvalue problem each) about ``5 * 10^4``, so the cap
means up to a few seconds (MDA) or some twenty seconds (SMEA) per call.  Only subset *indices* are enumerated
(``itertools.combinations``, in chunks); each chunk is scored by one batched gather
of the ``[N, N]`` distance or Gram matrix.  A problem with fewer admissible rows is
searched over its admissible rows (``C(m, f_m) <= C(n, f)``); problems sharing an
admissible count are searched together, one pass per distinct count.
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
import math
from collections.abc import Callable
from typing import Annotated, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from defenses.primitives import euclidean_distances
from defenses.robust_aggregators import (
    Rows,
    _ByzantineBudget,
    _masked_mean,
    _weighted_sum,
    aggregator_options,
    mean_nearest_median,
    register,
    row_norms,
)

#: Default cap on the number ``C(n, f)`` of subsets MDA and SMEA may enumerate.
MAX_SUBSETS = 10**6

#: Elements of the gathered ``[problems, subsets, k, k]`` block scored at once.
_CHUNK_ELEMENTS = 1 << 21


# -- shared helpers -------------------------------------------------------------------------
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


def _budget_check(agg: _ByzantineBudget, n: int) -> int:
    """``f`` for ``n`` rows after the ``2f < n`` check shared by every rule here."""
    f = agg.budget(n)
    if not 2 * f < n:
        raise ValueError(f"{agg.name}: needs 2*f < n, got f={f}, n={n}")
    return f


def _per_problem_f(agg: _ByzantineBudget, rows: Rows) -> Tensor:
    """Per-problem ``f``: the configured one, at most ``(count - 1) // 2``."""
    return agg._budget(rows.count, (rows.count - 1) // 2)


def _subset_search(
    rows: Rows,
    f: Tensor,
    matrix: Tensor,
    score: Callable[[Tensor], Tensor],
) -> Tensor:
    """``[..., N]`` mask of the size ``m - f`` subset of each problem's ``m``
    admissible rows with the lowest ``score``; ties go to the first subset in
    ``itertools.combinations`` order (of the admissible rows, in their given order).

    ``matrix[..., N, N]`` is a pairwise matrix of the rows (distances, Gram);
    ``score`` maps its gathered blocks ``[P, S, k, k]`` (``P`` problems, ``S`` subsets
    of ``k`` rows) to ``[P, S]``.  Loops run over distinct admissible counts and over
    chunks of subset indices only."""
    n = rows.values.shape[-2]
    batch = rows.values.shape[:-2]
    device = matrix.device
    admissible = rows.admissible.reshape(-1, n)
    count, f = rows.count.reshape(-1), f.reshape(-1)
    # admissible rows first, in their given order
    order = (~admissible).to(torch.int8).argsort(dim=-1, stable=True)  # [B, N]
    flat = matrix.reshape(-1, n, n)
    flat = flat.gather(-2, order.unsqueeze(-1).expand(-1, n, n)).gather(-1, order.unsqueeze(-2).expand(-1, n, n))
    chosen = torch.zeros_like(admissible)  # in compacted positions
    key = count * (n + 1) + f
    for value in torch.unique(key).tolist():
        m, fm = divmod(value, n + 1)
        if m == 0:
            continue
        k = m - fm
        problems = (key == value).nonzero().squeeze(-1)
        block = flat[problems][:, :m, :m]  # [P, m, m]
        per_chunk = max(1, _CHUNK_ELEMENTS // (len(problems) * k * k))
        best = torch.full((len(problems),), math.inf, dtype=block.dtype, device=device)
        best_subset = torch.zeros(len(problems), k, dtype=torch.long, device=device)
        combinations = itertools.combinations(range(m), k)
        while True:
            chunk = list(itertools.islice(combinations, per_chunk))
            if not chunk:
                break
            subsets = torch.tensor(chunk, dtype=torch.long, device=device)  # [S, k]
            scores = score(block[:, subsets[:, :, None], subsets[:, None, :]])  # [P, S]
            low, at = scores.min(-1)  # the first minimum of the chunk
            better = low < best  # strict: an earlier chunk keeps its tie
            best = torch.where(better, low, best)
            best_subset = torch.where(better.unsqueeze(-1), subsets[at], best_subset)
        chosen[problems] = torch.zeros(len(problems), n, dtype=torch.bool, device=device).scatter_(-1, best_subset, True)
    # back to the given positions
    selected = torch.zeros_like(chosen).scatter_(-1, order, chosen)
    return selected.reshape(*batch, n)


@aggregator_options
class _SubsetSearch(_ByzantineBudget):
    """Shared by MDA and SMEA: ``2f < n`` and at most ``max_subsets`` subsets."""

    max_subsets: Annotated[
        int, Field(ge=1, description="largest number C(n, f) of subsets enumerated (check(n) refuses more)")
    ] = MAX_SUBSETS

    #: Operations per subset of ``k`` rows, a power of ``k`` (:meth:`flops`); calibrated
    #: on the 2-core CPU of ``benchmarks/`` (MDA about 3e5 subsets a second, SMEA about
    #: 5e4, at n = 25), at its effective 1e11 FLOP/s.
    subset_flops: ClassVar[tuple[float, int]] = (800.0, 2)

    def flops(self, n: int, d: int) -> float:
        k = n - self.budget(n)
        scale, power = self.subset_flops
        return 3.0 * n * n * d + math.comb(n, self.budget(n)) * scale * k**power

    @staticmethod
    @abstractmethod
    def pair_matrix(scaled: Tensor) -> Tensor:
        """The ``[..., N, N]`` matrix of the (scaled) rows whose subset blocks are scored."""

    @staticmethod
    @abstractmethod
    def subset_score(block: Tensor) -> Tensor:
        """The score of each subset's ``[..., k, k]`` block (the lowest wins)."""

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        matrix = self.pair_matrix(scaled_rows(rows))
        chosen = _subset_search(rows, _per_problem_f(self, rows), matrix, self.subset_score)
        return _masked_mean(rows.values, chosen)

    def check(self, n: int) -> None:
        super().check(n)
        f = _budget_check(self, n)
        subsets = math.comb(n, f)
        if subsets > self.max_subsets:
            raise ValueError(
                f"{self.name}: enumerates C(n, f) = C({n}, {f}) = {subsets} subsets, more than "
                f"max_subsets={self.max_subsets}; lower f or n (the cost grows like n^f), or raise max_subsets"
            )


# -- MDA -----------------------------------------------------------------------------------
@register
@aggregator_options
class MinimumDiameterAveraging(_SubsetSearch):
    """Minimum-diameter averaging (MDA)::

        MDA_f(x_1..x_n) = (1 / (n - f)) sum_{i in S*} x_i,
        S* in argmin_{S subset [n], |S| = n - f} max_{i, j in S} ||x_i - x_j||

    as defined in ByzFL's ``MDA`` (citing El Mhamdi, Guerraoui, Guirguis, Hoang,
    Rouault 2020, PODC, "Genuinely distributed Byzantine machine learning"); the rule
    is also used by El Mhamdi, Guerraoui, Rouault (ICLR 2021, "Distributed momentum
    for Byzantine-resilient stochastic gradient descent"), after Rousseeuw's (1985)
    minimum-volume estimators.  Same subset size ``n - f`` as ByzFL.

    Exhaustive: ``C(n, f)`` subsets, each scored by the largest entry of its block of
    the ``[N, N]`` squared-distance matrix (computed once, float64, exact differences).
    ``check(n)`` refuses ``C(n, f) > max_subsets``.  Ties: the first subset in
    ``itertools.combinations`` order of the admissible rows (as ByzFL's strict ``<``).
    """

    name = "mda"
    summary = "mean of the n-f rows with the smallest diameter (exhaustive, C(n, f) subsets)"
    reference = (
        "El Mhamdi, Guerraoui, Guirguis, Hoang, Rouault 2020 (PODC), Genuinely distributed Byzantine ML, MDA; "
        "as in ByzFL's MDA"
    )

    @staticmethod
    def pair_matrix(scaled: Tensor) -> Tensor:
        return euclidean_distances(scaled, scaled).square()

    @staticmethod
    def subset_score(block: Tensor) -> Tensor:
        return block.amax((-1, -2))  # the diameter, squared


# -- SMEA ----------------------------------------------------------------------------------
def _top_covariance_eigenvalue(gram: Tensor) -> Tensor:
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


@register
@aggregator_options
class SmallestMaximumEigenvalueAveraging(_SubsetSearch):
    """Smallest maximum eigenvalue averaging (SMEA; Allouah, Guerraoui, Gupta, Pinot,
    Stephan 2023, ICML, "On the privacy-robustness-utility trilemma in distributed
    learning")::

        S* in argmin_{S subset [n], |S| = n - f} lambda_max(Sigma_S),
        Sigma_S = (1/|S|) sum_{i in S} (x_i - mu_S)(x_i - mu_S)^T,
        SMEA_f(x_1..x_n) = mu_{S*} = (1/|S*|) sum_{i in S*} x_i

    Exhaustive like MDA (``C(n, f)`` subsets, ``check(n)`` refuses more than
    ``max_subsets``).  ``lambda_max`` is exact: the top eigenvalue of each subset's
    centred ``k x k`` Gram block (``torch.linalg.eigvalsh``, batched over subsets),
    where ByzFL approximates it by one power iteration from a random vector.  Ties:
    the first subset in ``itertools.combinations`` order of the admissible rows.
    """

    name = "smea"
    subset_flops = (250.0, 3)  # an eigenvalue of each subset's k x k matrix
    summary = "mean of the n-f rows whose covariance has the smallest top eigenvalue (C(n, f) subsets)"
    reference = (
        "Allouah, Guerraoui, Gupta, Pinot, Stephan 2023 (ICML), privacy-robustness-utility trilemma, SMEA; "
        "as in ByzFL's SMEA"
    )

    @staticmethod
    def pair_matrix(scaled: Tensor) -> Tensor:
        return scaled @ scaled.transpose(-1, -2)  # the Gram matrix

    @staticmethod
    def subset_score(block: Tensor) -> Tensor:
        return _top_covariance_eigenvalue(block)


# -- MoNNA ---------------------------------------------------------------------------------
@register
@aggregator_options
class MoNNA(_ByzantineBudget):
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
        _budget_check(self, n)
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
        keep = rows.count - _per_problem_f(self, rows)
        chosen = (rank < keep.unsqueeze(-1)) & admissible
        return _masked_mean(rows.values, chosen)


# -- Meamed --------------------------------------------------------------------------------
@register
@aggregator_options
class Meamed(_ByzantineBudget):
    """Mean around median (Xie, Koyejo, Gupta 2018, "Generalized Byzantine-tolerant
    SGD", arXiv:1802.10116, the "mean around median" rule)::

        [Meamed_f(x_1..x_n)]_k = (1 / (n - f)) sum_{j = 1}^{n - f} [x_{pi_k(j)}]_k

    with ``pi_k`` ordering the rows by ``|[x_j]_k - median_k|``, nearest first, per
    coordinate ``k``.  The median is the statistical one (mean of the two middle values
    for an even count, as ``numpy.median``; ByzFL's torch path uses torch's lower
    median).  Ties in distance go to the lower value, so the rule does not depend on
    the rows' order (ByzFL: ``argpartition``'s choice).
    """

    name = "meamed"
    summary = "per coordinate, mean of the n-f values nearest to the coordinate-wise median"
    reference = "Xie, Koyejo, Gupta 2018 (arXiv:1802.10116), Generalized Byzantine-tolerant SGD, mean around median"

    def check(self, n: int) -> None:
        super().check(n)
        _budget_check(self, n)

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        return mean_nearest_median(rows, rows.count - _per_problem_f(self, rows))


# -- CAF -----------------------------------------------------------------------------------
@register
@aggregator_options
class CovarianceBoundAgnosticFilter(_ByzantineBudget):
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
        _budget_check(self, n)

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        scaled = scaled_rows(rows)
        gram = scaled @ scaled.transpose(-1, -2)  # [..., N, N], entries at most 1
        count = rows.count
        f = _per_problem_f(self, rows)
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
        return _weighted_sum(rows.values, best_c.to(rows.values.dtype)) / total
