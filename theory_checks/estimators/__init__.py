"""Estimators of the constants in Werner et al.'s assumptions, batched over clients,
each returning a :class:`theory_checks.types.Estimate` that names the instance that
decided it:

* gradients (Assumptions 4-5, eq. 16-17, estimated by eq. 31-32):
  :func:`intra_cluster_ratio`, :func:`separation`, :func:`separation_frontier`, and
  per client at its own model (Fig. 2) :func:`own_model_ratios`,
  :func:`own_model_separations`;
* noise (Assumption 6, Lemma 7, Lemma 14): :func:`gradient_noise`,
  :func:`batch_noise`, :func:`momentum_noise`;
* curvature (Assumption 7, Lemma 1): :func:`smoothness`, :func:`strong_convexity`;
* point clouds (Assumptions 1-3 and 8-9): :func:`cloud_noise`,
  :func:`cloud_separation`, :func:`momentum_constants`;
* the fractions ``n_i``, ``delta_i``, ``beta_i``: :func:`federation_fractions`.
"""

from theory_checks.estimators.curvature import smoothness, strong_convexity
from theory_checks.estimators.fractions import federation_fractions
from theory_checks.estimators.gradient_constants import (
    SeparationFrontier,
    full_gradients,
    intra_cluster_ratio,
    own_model_ratios,
    own_model_separations,
    separation,
    separation_frontier,
)
from theory_checks.estimators.noise import batch_noise, gradient_noise, momentum_noise
from theory_checks.estimators.point_clouds import cloud_noise, cloud_separation, momentum_constants

__all__ = [
    "SeparationFrontier",
    "batch_noise",
    "cloud_noise",
    "cloud_separation",
    "federation_fractions",
    "full_gradients",
    "gradient_noise",
    "intra_cluster_ratio",
    "momentum_constants",
    "momentum_noise",
    "own_model_ratios",
    "own_model_separations",
    "separation",
    "separation_frontier",
    "smoothness",
    "strong_convexity",
]
