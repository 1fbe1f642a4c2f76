"""The row floor attacks and defenses share: which rows are admissible, masked
statistics, distances, agglomerative clustering and the Byzantine budget.  One copy
of each rule, so an attack's prediction of a defense cannot drift from the defense."""

from robust_pfl.engine.rows.admissible import WIDENED_DTYPES, admissible_points, rowdot, squared_norms
from robust_pfl.engine.rows.budget import ByzantineBudget, budget_of, budgets_of, check_one_budget
from robust_pfl.engine.rows.distances import (
    cosine_distances,
    euclidean_distances,
    gram_squared_distances,
    squared_distances,
    squared_from_products,
    wide_squared_distances,
)
from robust_pfl.engine.rows.linkage import absent_pairs, agglomerate, largest_cluster
from robust_pfl.engine.rows.statistics import (
    Rows,
    admissible_previous,
    coordinate_median,
    masked_mean,
    masked_median,
    mean_nearest_median,
    mean_of_order_statistics,
    per_problem,
    row_norms,
    sort_columns,
    sorted_columns,
    stable_argsort_rows,
    weighted_sum,
)

__all__ = [
    "WIDENED_DTYPES", "admissible_points", "rowdot", "squared_norms",
    "ByzantineBudget", "budget_of", "budgets_of", "check_one_budget",
    "cosine_distances", "euclidean_distances", "gram_squared_distances", "squared_distances",
    "squared_from_products", "wide_squared_distances",
    "absent_pairs", "agglomerate", "largest_cluster",
    "Rows", "admissible_previous", "coordinate_median", "masked_mean", "masked_median", "mean_nearest_median",
    "mean_of_order_statistics", "per_problem", "row_norms", "sort_columns", "sorted_columns",
    "stable_argsort_rows", "weighted_sum",
]
