"""Defenses: aggregators and personalised-FL algorithms, registered by name.

The threshold-clustering family of Werner et al. ("Provably Personalized and Robust
Federated Learning") comes first (Alg. 1-4, and the workshop paper's PFL-TC and
decentralised PDL-TC), then the clustered-PFL systems of the field (IFCA, HypCluster,
CFL, CLoVE, CGPFL, FedSPD, Ditto, KNN-Per);
the classic robust aggregators (median, trimmed mean, Krum, RFA, centered clipping,
bucketing) live in :mod:`defenses.aggregators` (MDA, MoNNA, Meamed, CAF and SMEA in
:mod:`defenses.aggregators`; Bulyan, DnC, ClippedClustering, SignGuard and FLAME in
:mod:`defenses.aggregators`) and plug into ``global``, after
the pre-aggregators of :mod:`defenses.aggregators` (``pre = ["nnm", ...]``).
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
from defenses.aggregators import AGGREGATORS, Aggregator, Bucketing, CenteredClipping, CoordinateMedian, GeometricMedian, Krum, Mean, MultiKrum, TrimmedMean, make_aggregator
from defenses.aggregators import PRE_AGGREGATORS, PreAggregated, PreAggregator, make_pre_aggregator
from defenses.aggregators import describe as describe_aggregator
from defenses.aggregators import register as register_aggregator
from defenses.aggregators.preaggregation import register as register_pre_aggregator
from defenses.threshold_clustering import (
    ClusteringResult,
    nearest_centre,
    threshold_clustering,
)

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
