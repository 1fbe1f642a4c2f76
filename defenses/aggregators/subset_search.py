"""Five robust aggregators that ByzFL ships (LPD-EPFL/byzfl, ``byzfl.aggregators``),
written for this project's contract: batched over leading problem dimensions,
inadmissible (NaN / Inf / overflowing) rows treated as absent, ``f`` (or
``fraction``) per problem shrunk to what the admissible count supports, and no Python
loop over clients or problems (:mod:`defenses.aggregators`).

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
import math
from abc import abstractmethod
from collections.abc import Callable
from typing import Annotated, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from defenses.aggregators.base import BudgetedAggregator, aggregator_options, register
from defenses.aggregators.statistics import checked_budget, problem_budgets, scaled_rows, top_covariance_eigenvalue
from robust_pfl.engine.rows import Rows, euclidean_distances, masked_mean


#: Default cap on the number ``C(n, f)`` of subsets MDA and SMEA may enumerate.
MAX_SUBSETS = 10**6


#: Elements of the gathered ``[problems, subsets, k, k]`` block scored at once.
_CHUNK_ELEMENTS = 1 << 21


def subset_search(
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
class SubsetSearch(BudgetedAggregator):
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
        chosen = subset_search(rows, problem_budgets(self, rows), matrix, self.subset_score)
        return masked_mean(rows.values, chosen)

    def check(self, n: int) -> None:
        super().check(n)
        f = checked_budget(self, n)
        subsets = math.comb(n, f)
        if subsets > self.max_subsets:
            raise ValueError(
                f"{self.name}: enumerates C(n, f) = C({n}, {f}) = {subsets} subsets, more than "
                f"max_subsets={self.max_subsets}; lower f or n (the cost grows like n^f), or raise max_subsets"
            )


@register
@aggregator_options
class MinimumDiameterAveraging(SubsetSearch):
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


@register
@aggregator_options
class SmallestMaximumEigenvalueAveraging(SubsetSearch):
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
        return top_covariance_eigenvalue(block)
