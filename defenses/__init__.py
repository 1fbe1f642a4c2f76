"""Defenses: aggregators and personalised-FL algorithms, registered by name.

The threshold-clustering family of Werner et al. ("Provably Personalized and Robust
Federated Learning") comes first (Alg. 1-4, and the workshop paper's PFL-TC and
decentralised PDL-TC), then the clustered-PFL systems of the field (IFCA, HypCluster,
CFL, CLoVE, CGPFL, FedSPD, Ditto, KNN-Per);
the classic robust aggregators live in :mod:`defenses.aggregators`, by kind
(coordinate-wise: median, trimmed mean, Meamed; distance-based: Krum, RFA, MoNNA, CAF;
subset search: MDA, SMEA; centered clipping; bucketing; filtering: Bulyan, DnC,
ClippedClustering, SignGuard, FLAME), and plug into ``global``, after the
pre-aggregators of :mod:`defenses.aggregators.preaggregation` (``pre = ["nnm", ...]``).
"""

from defenses.base import REGISTRY, Algorithm, AlgorithmParams, build, register
from defenses.conformance import check_aggregator, check_algorithm
from defenses.optimiser import HeavyBall
from defenses.radius import (
    CenterDistanceRadius,
    FixedRadius,
    QuantileRadius,
    RadiusPolicy,
    TheoryRadius,
    make_radius,
)
from defenses.aggregators import (
    AGGREGATORS,
    PRE_AGGREGATORS,
    Aggregator,
    Bucketing,
    CenteredClipping,
    CoordinateMedian,
    GeometricMedian,
    Krum,
    Mean,
    MultiKrum,
    PreAggregated,
    PreAggregator,
    TrimmedMean,
    make_aggregator,
    make_pre_aggregator,
)
from defenses.aggregators import describe as describe_aggregator
from defenses.aggregators import register as register_aggregator
from defenses.aggregators.preaggregation import register as register_pre_aggregator
from defenses.threshold_clustering import (
    ClusteringResult,
    nearest_centre,
    threshold_clustering,
)
from robust_pfl.engine.conformance import ConformanceError

# Importing the modules registers their algorithms (imported for that side effect).
from defenses import baselines, cfl, cgpfl, clustering_algorithms, clove, decentralised_clustering, ditto, fedspd, hypcluster, ifca, knn_per, trust_aggregation  # noqa: E402,F401  isort: skip

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
    "AGGREGATORS",
    "Aggregator",
    "make_aggregator",
    "register_aggregator",
    "check_aggregator",
    "check_algorithm",
    "ConformanceError",
    "describe_aggregator",
    "Mean",
    "CoordinateMedian",
    "TrimmedMean",
    "Krum",
    "MultiKrum",
    "GeometricMedian",
    "CenteredClipping",
    "Bucketing",
    "PRE_AGGREGATORS",
    "PreAggregator",
    "PreAggregated",
    "make_pre_aggregator",
    "register_pre_aggregator",
]
