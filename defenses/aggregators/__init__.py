"""Classic Byzantine-robust aggregators and pre-aggregators, by kind.

* :mod:`~defenses.aggregators.base`: the :class:`Aggregator` interface, its registry
  :data:`AGGREGATORS` and the Byzantine-budget base class;
* :mod:`~defenses.aggregators.factory`: :func:`make_aggregator`, a config's spec to an
  aggregator (with its ``pre`` steps);
* :mod:`~defenses.aggregators.statistics`: what several kinds share (Krum scores,
  bucket means, exact rescaling, clipped means);
* kinds: :mod:`~defenses.aggregators.coordinatewise` (mean, median, trimmed mean,
  Meamed), :mod:`~defenses.aggregators.distance_based` (Krum, Multi-Krum, geometric
  median, MoNNA, CAF), :mod:`~defenses.aggregators.subset_search` (MDA, SMEA),
  :mod:`~defenses.aggregators.clipping` (centered clipping),
  :mod:`~defenses.aggregators.bucketing`, :mod:`~defenses.aggregators.filtering`
  (Bulyan, DnC, ClippedClustering, SignGuard, FLAME);
* :mod:`~defenses.aggregators.preaggregation`: NNM, bucketing, clipping and ARC in front
  of any aggregator.

Masked statistics, distances and the budget's fields come from the row floor,
:mod:`robust_pfl.engine.rows`, which the attacks read too.
"""

from defenses.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    AggregatorSpec,
    BudgetedAggregator,
    aggregator_options,
    describe,
    register,
)
from defenses.aggregators.bucketing import Bucketing
from defenses.aggregators.clipping import CenteredClipping
from defenses.aggregators.coordinatewise import CoordinateMedian, Meamed, Mean, TrimmedMean
from defenses.aggregators.distance_based import CovarianceBoundAgnosticFilter, GeometricMedian, KrumFamily, Krum, MoNNA, MultiKrum
from defenses.aggregators.factory import make_aggregator
from defenses.aggregators.filtering import Bulyan, ClippedClustering, DnC, Flame, SignGuard, sign_features, two_means
from defenses.aggregators.preaggregation import (
    PRE_AGGREGATORS,
    AdaptiveRobustClipping,
    BucketMeans,
    BudgetedPreAggregator,
    NearestNeighbourMixing,
    PreAggregated,
    PreAggregator,
    PreAggregatorSpec,
    StaticClipping,
    make_pre_aggregator,
    make_pre_aggregators,
    pre_aggregated,
    pre_aggregator_options,
)
from defenses.aggregators.statistics import bucket_means, krum_scores, scaled_rows
from defenses.aggregators.subset_search import (
    MAX_SUBSETS,
    MinimumDiameterAveraging,
    SmallestMaximumEigenvalueAveraging,
    SubsetSearch,
)
from robust_pfl.engine.rows import Rows

__all__ = [
    "AGGREGATORS", "Aggregator", "AggregatorSpec", "BudgetedAggregator", "aggregator_options", "describe", "register",
    "Bucketing", "CenteredClipping", "CoordinateMedian", "Meamed", "Mean", "TrimmedMean",
    "CovarianceBoundAgnosticFilter", "GeometricMedian", "KrumFamily", "Krum", "MoNNA", "MultiKrum",
    "make_aggregator", "Bulyan", "ClippedClustering", "DnC", "Flame", "SignGuard", "sign_features", "two_means",
    "PRE_AGGREGATORS", "AdaptiveRobustClipping", "BucketMeans", "BudgetedPreAggregator", "NearestNeighbourMixing",
    "PreAggregated", "PreAggregator", "PreAggregatorSpec", "StaticClipping", "make_pre_aggregator",
    "make_pre_aggregators", "pre_aggregated", "pre_aggregator_options", "bucket_means", "krum_scores", "scaled_rows",
    "MAX_SUBSETS", "MinimumDiameterAveraging", "SmallestMaximumEigenvalueAveraging", "SubsetSearch", "Rows",
]
