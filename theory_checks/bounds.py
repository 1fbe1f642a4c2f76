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


def descent_rate(base_error: ArrayLike, smoothness: ArrayLike, gap: ArrayLike, rounds: ArrayLike,
                 constant: float = 1.0) -> ArrayLike:
    """Thm 3.4's clean rate with ``F_0`` and ``L`` explicit: ``C [sqrt(L F_0 E / T) + L
    F_0 / T]``, ``E = sigma^2/n_i + sigma^3/Delta``.  A.5's descent step gives ``F_0 /
    (eta T) + L eta E``; Thm 3.4's ``eta = min(1/L, sqrt(F_0 / (L T E)))`` makes that
    ``2 sqrt(L F_0 E / T)`` on the second branch (eq. 28 hides ``sqrt(L F_0)`` in its
    constant) and at most ``L F_0 / T + E`` on the first, whose ``L F_0 / T`` eq. (28)
    leaves out."""
    smoothness, gap, rounds = np.asarray(smoothness, float), np.asarray(gap, float), np.asarray(rounds, float)
    return constant * (np.sqrt(smoothness * gap * np.asarray(base_error, float) / rounds) + smoothness * gap / rounds)


def workshop_clustering_error(rho: ArrayLike, separation: ArrayLike, n: ArrayLike, constant: float = 1.0) -> ArrayLike:
    """Workshop paper, Thm 1: ``(34 C + 48 C / n_i) rho^3 / Delta + 4 rho^2 / n_i``."""
    rho, separation, n = np.asarray(rho, float), np.asarray(separation, float), np.asarray(n, float)
    return (34.0 * constant + 48.0 * constant / n) * rho**3 / separation + 4.0 * rho**2 / n


def workshop_clustering_rounds(rho: float, separation: float, n: int, total: int) -> int:
    """Workshop paper, Thm 1: ``l = max(1, log(rho/Delta + 1/n_i) / log(1 - n_i^2 /
    (2 N^2)))``, rounded up."""
    ratio = rho / separation + 1.0 / n
    if ratio >= 1:
        return 1
    return max(1, math.ceil(math.log(ratio) / math.log(1 - n**2 / (2 * total**2))))


def workshop_clustering_radius(separation: ArrayLike, cluster_fraction: ArrayLike, rho: ArrayLike,
                               start_error: ArrayLike) -> ArrayLike:
    """The workshop proof's radius (A.1, line 263, used by Thm 1 through A.2):
    ``tau^2 = sqrt(delta (c^2 + rho^2)) Delta / rho`` with ``c^2`` the centre's current
    squared error.  As printed it has the units of a length, not a squared length; it is
    used here only where ``rho = 1``."""
    rho = np.asarray(rho, float)
    inner = np.asarray(cluster_fraction, float) * (np.asarray(start_error, float) + rho**2)
    return np.sqrt(np.sqrt(inner) * np.asarray(separation, float) / rho)


def _workshop_rate(first: ArrayLike, higher: ArrayLike, smoothness: ArrayLike, gap: ArrayLike,
                   rounds: ArrayLike) -> ArrayLike:
    """The shape shared by the workshop's eq. (4) and Thm 4: ``2 sqrt(first F_0 / T) +
    higher^(1/5) (2 F_0 / T)^(4/5) + higher^(2/5) (2 F_0 / T)^(3/5) + 6 L F_0 / T``."""
    per_round = np.asarray(gap, float) / np.asarray(rounds, float)
    higher = np.asarray(higher, float)
    return (2.0 * np.sqrt(np.asarray(first, float) * per_round) + higher**0.2 * (2.0 * per_round) ** 0.8
            + higher**0.4 * (2.0 * per_round) ** 0.6 + 6.0 * np.asarray(smoothness, float) * per_round)


def workshop_pfl_rate(smoothness: ArrayLike, gap: ArrayLike, sigma: ArrayLike, n: ArrayLike, clusters: int,
                      separation: ArrayLike, rounds: ArrayLike, constant: float = 1.0) -> ArrayLike:
    """Workshop paper, Thm 3, eq. (4) (PFL-TC, Option 1), with its constant ``C``."""
    smoothness, sigma = np.asarray(smoothness, float), np.asarray(sigma, float)
    first = 120.0 * constant * smoothness * sigma**2 / np.asarray(n, float)
    higher = 21600.0 * constant * clusters**2 * smoothness**1.5 * sigma**3 / np.asarray(separation, float)
    return _workshop_rate(first, higher, smoothness, gap, rounds)


def workshop_pdl_rate(smoothness: ArrayLike, gap: ArrayLike, sigma: ArrayLike, n: ArrayLike,
                      separation: ArrayLike, rounds: ArrayLike, constant: float = 1.0) -> ArrayLike:
    """Workshop paper, Thm 4 (PDL-TC), with its constant ``C``."""
    smoothness, sigma = np.asarray(smoothness, float), np.asarray(sigma, float)
    first = 96.0 * constant * smoothness * sigma**2 / np.asarray(n, float)
    higher = 1968.0 * smoothness**1.5 * sigma**3 / np.asarray(separation, float)
    return _workshop_rate(first, higher, smoothness, gap, rounds)


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
