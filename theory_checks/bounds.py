"""Right-hand sides of Werner et al.'s bounds as functions of the constants, each with
its hidden constant as a parameter, and a fit of the smallest constant that makes a
bound hold on measured errors.

Notation (docs/theory_checks.md): ``sigma`` noise (square root of the total variance),
``separation`` the inter-cluster separation Delta, ``n`` the clients in the cluster
``n_i``, ``beta`` the Byzantine fraction ``beta_i``, ``cluster_fraction`` delta_i.
Every function accepts floats or numpy arrays (broadcast).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from theory_checks.types import FittedConstant

ArrayLike = float | np.ndarray


def clustering_error(sigma: ArrayLike, separation: ArrayLike, n: ArrayLike, beta: ArrayLike = 0.0,
                     constant: float = 1.0) -> ArrayLike:
    """Thm 3.1, eq. (14): ``C (sigma^2/n_i + sigma^3/Delta + beta_i sigma Delta)``."""
    sigma, separation = np.asarray(sigma, float), np.asarray(separation, float)
    return constant * (sigma**2 / np.asarray(n, float) + sigma**3 / separation + np.asarray(beta, float) * sigma * separation)


def clustering_radius(cluster_fraction: ArrayLike, sigma: ArrayLike, separation: ArrayLike,
                      constant: float = 1.0) -> ArrayLike:
    """Thm 3.1's radius ``tau ~ sqrt(delta_i sigma Delta)`` (constant unstated)."""
    return constant * np.sqrt(np.asarray(cluster_fraction, float) * np.asarray(sigma, float) * np.asarray(separation, float))


def clustering_rounds(sigma: float, separation: float, cluster_fraction: float, batch_size: float = 1.0,
                      alpha: float = 1.0) -> int:
    """Rounds ``l`` that Thm 3.1 (eq. 13), Thm 3.3 (eq. 22, ``batch_size``) and Thm 3.4
    (eq. 27, ``alpha``) ask for: ``max(1, log(sqrt(alpha) sigma / (sqrt|B| Delta)) /
    log(1 - delta_i / 2))``, rounded up."""
    if not 0 < cluster_fraction <= 1:
        raise ValueError(f"cluster_fraction must be in (0, 1], got {cluster_fraction}")
    ratio = math.sqrt(alpha) * sigma / (math.sqrt(batch_size) * separation)
    if ratio >= 1:
        return 1
    return max(1, math.ceil(math.log(ratio) / math.log(1 - cluster_fraction / 2)))


def lower_bound(sigma: ArrayLike, separation: ArrayLike, n: ArrayLike | None = None,
                constant: float = 0.25) -> ArrayLike:
    """Thm 3.2, eq. (15): ``c (sigma^4/Delta^2 + sigma^2/n_i)``; ``n=None`` leaves out
    the sample-mean term (the two-point construction of A.2 bounds only the first).
    The proof's constant is 1/4 (false as printed: the check ``thm3.2-constant``)."""
    sigma, separation = np.asarray(sigma, float), np.asarray(separation, float)
    value = sigma**4 / separation**2
    if n is not None:
        value = value + sigma**2 / np.asarray(n, float)
    return constant * value


def fc_rate(a_squared: ArrayLike, sigma: ArrayLike, separation: ArrayLike, n: ArrayLike, beta: ArrayLike,
            rounds: ArrayLike, constant: float = 1.0) -> ArrayLike:
    """Thm 3.3, eq. (23): ``C sqrt(max(1, A^2) (sigma^2/n_i + sigma^3/Delta +
    beta_i sigma Delta) / T)``."""
    error = clustering_error(sigma, separation, n, beta)
    return constant * np.sqrt(np.maximum(1.0, np.asarray(a_squared, float)) * error / np.asarray(rounds, float))


def mc_rate(sigma: ArrayLike, separation: ArrayLike, n: ArrayLike, beta: ArrayLike, rounds: ArrayLike,
            constant: float = 1.0) -> ArrayLike:
    """Thm 3.4, eq. (28): ``C [ sqrt((sigma^2/n_i + sigma^3/Delta) / T) + beta_i sigma
    Delta / (T^{1/4} (sigma^2/n_i + sigma^3/Delta)^{1/4}) ]``."""
    base = clustering_error(sigma, separation, n, 0.0)
    rounds = np.asarray(rounds, float)
    attacked = np.asarray(beta, float) * np.asarray(sigma, float) * np.asarray(separation, float)
    return constant * (np.sqrt(base / rounds) + attacked / (rounds**0.25 * base**0.25))


def lemma1_constants(smoothness: ArrayLike, strong_convexity: ArrayLike) -> dict[str, ArrayLike]:
    """Lemma 1 (eq. 18-19): ``A = 2L/mu`` and ``D^2 = 2 (1 + (L/mu)^2)`` (floats, or
    arrays of instances).  Its ``Delta^2`` depends on the optima: see
    :func:`lemma1_separation`."""
    if np.any(np.asarray(strong_convexity) <= 0):
        raise ValueError(f"Lemma 1 needs mu > 0, got {strong_convexity}")
    kappa = smoothness / strong_convexity
    return {"A": 2 * kappa, "A2": 4 * kappa**2, "D2": 2 * (1 + kappa**2)}


def lemma1_separation(norms_at_optimum: np.ndarray, reduce: Literal["max", "min", "pair"] = "min") -> np.ndarray:
    """Lemma 1's ``Delta^2`` for client ``i`` from ``||grad f_j(x_i*)||`` over the
    clients ``j`` of other clusters (``norms_at_optimum[..., J]``): as printed,
    ``1/2 (max_j ||.||)^2`` (false: the check ``lemma1-max``); corrected, ``1/2 min_j ||.||^2``;
    ``"pair"``: ``1/2 ||.||^2`` per pair (what the derivation proves)."""
    norms = np.asarray(norms_at_optimum, float)
    if reduce == "pair":
        return 0.5 * norms**2
    chosen = norms.max(axis=-1) if reduce == "max" else norms.min(axis=-1)
    return 0.5 * chosen**2


def fit_constant(measured: ArrayLike, rhs: ArrayLike, kind: Literal["upper", "lower"] = "upper") -> FittedConstant:
    """The smallest ``C`` with ``measured <= C rhs`` on every instance (``"upper"``) or
    the largest ``c`` with ``measured >= c rhs`` (``"lower"``).  Instances with
    ``rhs == 0`` are skipped unless ``measured > 0`` there (then ``C = inf``)."""
    measured = np.atleast_1d(np.asarray(measured, float))
    rhs = np.atleast_1d(np.asarray(rhs, float))
    if measured.shape != rhs.shape:
        raise ValueError(f"measured and rhs must have one shape, got {measured.shape} and {rhs.shape}")
    if measured.size == 0:
        raise ValueError("fit_constant needs at least one instance")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(rhs > 0, measured / rhs, np.where(measured > 0, np.inf, np.nan))
    usable = ~np.isnan(ratios)
    if not usable.any():
        raise ValueError("every instance has rhs == 0 and measured == 0: no constant is decided")
    scores = np.where(usable, ratios, -np.inf if kind == "upper" else np.inf)
    decisive = int(scores.argmax() if kind == "upper" else scores.argmin())
    return FittedConstant(float(ratios[decisive]), kind, int(usable.sum()), decisive, tuple(float(r) for r in ratios))
