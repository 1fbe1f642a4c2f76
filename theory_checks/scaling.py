"""Scaling studies of Werner et al.'s rates: measured errors against one variable at a
time, a fitted exponent per variable and the bound's hidden constant.

* :func:`clustering_study`: Threshold-Clustering alone, Thm 3.1 (eq. 13-14), against
  ``n_i``, ``beta_i`` and ``Delta`` (:mod:`theory_checks.scaling_clustering`).
* :func:`fc_rate_study`: Federated-Clustering against ``T``, Thm 3.3 (eq. 22-23).
* :func:`mc_rate_study`: Momentum-Clustering against ``T``, with and without attack,
  Thm 3.4 (eq. 27-28) (both in :mod:`theory_checks.scaling_rates`).

Each returns a :class:`ScalingStudy` (tidy rows ``{"variable", "x", "repeat",
"error"}``, the fitted :class:`~theory_checks.types.PowerLaw` per variable, the
fitted :class:`~theory_checks.types.FittedConstant`); ``budget`` is ``"quick"`` or
``"full"``.
"""

from theory_checks.scaling_clustering import (
    CLUSTERING_BUDGETS,
    ClusteringSizes,
    clustering_errors,
    clustering_study,
    two_point_random_start,
)
from theory_checks.scaling_common import ROW_KEYS, Budget, Row, ScalingStudy, Sweep, describe_laws
from theory_checks.scaling_rates import RATE_BUDGETS, RateSizes, fc_rate_study, mc_rate_study

__all__ = [
    "CLUSTERING_BUDGETS",
    "RATE_BUDGETS",
    "ROW_KEYS",
    "Budget",
    "ClusteringSizes",
    "RateSizes",
    "Row",
    "ScalingStudy",
    "Sweep",
    "clustering_errors",
    "clustering_study",
    "describe_laws",
    "fc_rate_study",
    "mc_rate_study",
    "two_point_random_start",
]
