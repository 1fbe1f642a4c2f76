"""Ball membership of Threshold-Clustering (Werner et al., Alg. 3, eq. 24) and its
rounding checks, shared by every distance evaluation in
:mod:`defenses.threshold_clustering` and :mod:`defenses.pairwise_clustering`."""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

# Widening of the distance intervals for rounding, in units of the dtype's epsilon
# times ``sqrt(d) (||z_j||^2 + ||v||^2)``: the rounding error of a length-d inner
# product stays well inside it, so a point decided by its interval is decided as its
# computed distance would decide it.
ROUNDING_SLACK = 4.0

# A squared distance whose rounding slack (see ``ROUNDING_SLACK``) exceeds this share
# of it is resolved far worse by inner products than by coordinates (whose relative
# rounding is about the slack's share of ``d^2`` without the norms).
RESOLVABLE = 1e-2


def inside_ball(distances: Tensor, tau: Tensor, strict: bool) -> Tensor:
    """``[..., K, N]``: the points within radius ``tau[..., K]`` (``<`` when
    ``strict``); a point at infinite distance (inadmissible) never is."""
    tau = tau.unsqueeze(-1)
    within = distances < tau if strict else distances <= tau
    return within & torch.isfinite(distances)


def mask_distances(distances: Tensor, excluded: Tensor) -> Tensor:
    """``inf`` for NaN distances and for the points in ``excluded`` (``[..., 1, N]``,
    the inadmissible ones: ``~admissible.unsqueeze(-2)``)."""
    return distances.masked_fill(excluded | torch.isnan(distances), math.inf)


def decided_by_rounding(distances: Tensor, tau: Tensor, slack: Tensor) -> bool:
    """Whether, in some round, some ball had two or more points within their rounding
    slack of its radius, each with a slack above ``RESOLVABLE`` of its squared
    distance: their order, hence their memberships, was then rounding, where the
    direct evaluation would resolve it.  (One such point alone is usually the point the
    quantile radius is read from, e.g. a single point sitting on its centre.)  All
    rounds at once: ``distances[R, B, K, N]``, ``tau[R, B, K]`` and the rounding slack
    of every squared distance, ``slack[R, B, K, N]``."""
    squared = distances.square()
    near = (squared - tau.unsqueeze(-1).square()).abs() <= slack
    unresolved = near & (slack > RESOLVABLE * squared) & torch.isfinite(squared)
    return bool((unresolved.sum(-1) >= 2).any())


def warn_decided_by_rounding(method: str) -> None:
    """The warning of an inner-product evaluation whose :func:`decided_by_rounding`
    held; it points at the caller of ``threshold_clustering``."""
    warnings.warn(
        f"Threshold-Clustering (method={method!r}): a point at a ball's boundary is closer "
        "to the centre than float32 inner products of vectors this large resolve (e.g. "
        "1e6-sized attack rows near each other), so its membership is decided by "
        "rounding; method='direct' or float64 evaluates it exactly",
        RuntimeWarning,
        stacklevel=4,
    )
