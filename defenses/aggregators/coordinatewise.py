"""Coordinate-wise rules: the mean (undefended), the median, the trimmed mean and
Meamed, each per coordinate over the admissible rows."""

from __future__ import annotations

import torch
from torch import Tensor

from defenses.aggregators.base import Aggregator, BudgetedAggregator, aggregator_options, register
from defenses.aggregators.statistics import checked_budget, problem_budgets
from robust_pfl.engine.rows import Rows, coordinate_median, masked_mean, mean_nearest_median, mean_of_order_statistics, sorted_columns


@register
@aggregator_options
class Mean(Aggregator):
    """The plain average of the admissible rows (FedAvg, McMahan et al. 2017): no
    defense at all, a single large row moves it arbitrarily far."""

    name = "mean"
    summary = "average of the admissible rows (undefended FedAvg)"
    reference = "McMahan et al. 2017, Communication-efficient learning of deep networks (FedAvg)"

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        return masked_mean(rows.values, rows.admissible)


@register
@aggregator_options
class CoordinateMedian(Aggregator):
    """Coordinate-wise median (Yin et al. 2018, "Byzantine-robust distributed learning:
    towards optimal statistical rates", Def. 1).  For an even number of admissible rows
    it returns the average of the two middle values (the statistical median, as
    ``numpy.median``), not torch's lower median."""

    name = "median"
    summary = "coordinate-wise median (mean of the two middle values for even counts)"
    reference = "Yin, Chen, Ramchandran, Bartlett 2018 (ICML), coordinate-wise median, Def. 1"

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        return coordinate_median(rows)


@register
@aggregator_options
class TrimmedMean(BudgetedAggregator):
    """Coordinate-wise trimmed mean (Yin et al. 2018, Def. 2): per coordinate, drop the
    ``f`` largest and ``f`` smallest values and average the remaining ``n - 2f``.
    Requires ``2f < n``; with fewer admissible rows, ``f`` shrinks to ``(n - 1) // 2``
    (the median)."""

    name = "trimmed_mean"
    summary = "coordinate-wise mean after dropping the f largest and f smallest values"
    reference = "Yin, Chen, Ramchandran, Bartlett 2018 (ICML), coordinate-wise trimmed mean, Def. 2"

    def check(self, n: int) -> None:
        super().check(n)
        checked_budget(self, n)

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        count = rows.count
        f = problem_budgets(self, rows)
        return mean_of_order_statistics(sorted_columns(rows), count, f, count - f, consume=True)


@register
@aggregator_options
class Meamed(BudgetedAggregator):
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
        checked_budget(self, n)

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        return mean_nearest_median(rows, rows.count - problem_budgets(self, rows))
