"""Defenses: aggregators and personalised-FL algorithms, registered by name.

The threshold-clustering family of Werner et al. ("Provably Personalized and Robust
Federated Learning") comes first (Alg. 1-4), then the baselines it is compared with.
"""

from defenses.base import REGISTRY, Algorithm, AlgorithmParams, HeavyBall, build, register
from defenses.radius import (
    CenterDistanceRadius,
    FixedRadius,
    QuantileRadius,
    RadiusPolicy,
    TheoryRadius,
    make_radius,
)
from defenses.threshold_clustering import ClusteringResult, nearest_centre, threshold_clustering

# Importing the modules registers their algorithms (imported for that side effect).
from defenses import baselines, clustering_algorithms, ifca  # noqa: E402,F401  isort: skip

__all__ = [
    "REGISTRY",
    "Algorithm",
    "AlgorithmParams",
    "HeavyBall",
    "build",
    "register",
    "threshold_clustering",
    "nearest_centre",
    "ClusteringResult",
    "RadiusPolicy",
    "FixedRadius",
    "TheoryRadius",
    "QuantileRadius",
    "CenterDistanceRadius",
    "make_radius",
]
