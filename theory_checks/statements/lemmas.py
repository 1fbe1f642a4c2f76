"""Werner et al.'s lemmas as exact checks.

* ``lemma1-A``: Lemma 1, eq. (18): on L-smooth, mu-strongly convex losses sharing an
  optimum per cluster, Assumption 4 holds with ``A = 2L/mu``.  On quadratics the
  supremum over ``x`` of ``||grad f_i - grad fbar_i|| / ||grad fbar_i||`` is the
  spectral norm ``||(H_i - Hbar_i) Hbar_i^{-1}||``, so the check is over every ``x``.
* ``lemma1-pair``: the derivation of eq. (19) (A.3) proves, per pair ``j`` not in
  ``i``'s cluster, ``||grad f_i(x) - grad f_j(x)||^2 >= 1/2 ||grad f_j(x_i*)||^2 -
  D^2 ||grad f_i(x)||^2`` with ``D^2 = 2(1 + (L/mu)^2)``; hence Assumption 5 with
  ``Delta^2 = 1/2 min_j ||grad f_j(x_i*)||^2`` (the printed max is false, see
  :mod:`.false_claims`).  On quadratics the gap is a convex quadratic in ``x``; its
  exact minimum over ``x`` is checked.
* ``lemma7``: eq. (124): a batch of ``|B|`` iid samples has variance ``sigma^2/|B|``,
  with equality, by enumerating every batch of small finite sample sets.
* ``lemma14``: eq. (228): momentum ``m_t = alpha g_t + (1 - alpha) m_{t-1}`` with iid
  noise of variance ``sigma^2`` has variance at most ``alpha sigma^2``; exactly
  ``alpha sigma^2 (1 - (1 - alpha)^{2t}) / (2 - alpha)``, stationary value
  ``alpha sigma^2 / (2 - alpha)``.
* ``descent``: ``f(x - eta grad f) <= f(x) - (eta/2) ||grad f||^2`` for ``eta <= 1/L``
  (the descent step of A.4/A.5) on quadratics and logistic losses, ``L`` exact.

Evaluators are public (instance arrays in, sides or margins out) for property tests.
"""

from __future__ import annotations

import numpy as np

from theory_checks.bounds import lemma1_constants, lemma1_separation
from theory_checks.statements import instances
from theory_checks.statements.registry import Budget, register, statement_seed
from theory_checks.statements.search import Instance, described, exact_verdict
from theory_checks.types import CheckResult

_INSTANCES: dict[str, int] = {"quick": 2000, "full": 40000}


# --------------------------------------------------------------------------- Lemma 1

def curvature_range(hessians: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(L, mu)`` per instance: the largest and smallest Hessian eigenvalue over all
    clients (``hessians[B, N, d, d]``), the tightest constants Lemma 1 may use."""
    eigenvalues = np.linalg.eigvalsh(hessians)
    return eigenvalues[..., -1].max(-1), eigenvalues[..., 0].min(-1)


def separation_constant(hessians: np.ndarray) -> np.ndarray:
    """Lemma 1's ``D^2 = 2 (1 + (L/mu)^2)`` per instance (from :func:`curvature_range`)."""
    smoothness, convexity = curvature_range(hessians)
    return lemma1_constants(smoothness, convexity)["D2"]


def client_optima(optima: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """Every client's optimum ``[B, N, d]`` from the cluster optima ``[B, K, d]``."""
    return np.take_along_axis(optima, clusters[..., None].astype(int), axis=1)


def gradients(hessians: np.ndarray, optima: np.ndarray, clusters: np.ndarray, point: np.ndarray) -> np.ndarray:
    """``grad f_j(x) = H_j (x - x_j*)`` for every client, ``[B, N, d]``."""
    return np.einsum("bnij,bnj->bni", hessians, point[:, None, :] - client_optima(optima, clusters))


def gradients_at_optima(hessians: np.ndarray, optima: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """``grad f_j(x_i*)``, ``[B, N (i), N (j), d]``."""
    centres = client_optima(optima, clusters)
    return np.einsum("bjkl,bijl->bijk", hessians, centres[:, :, None, :] - centres[:, None, :, :])


def other_cluster(clusters: np.ndarray) -> np.ndarray:
    """``[B, N, N]`` mask of the pairs ``(i, j)`` in different clusters."""
    return clusters[:, :, None] != clusters[:, None, :]


def pair_sides(instance: Instance) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (19) per pair at ``instance["point"]``: ``lhs[B, N, N] = ||grad f_i(x) -
    grad f_j(x)||^2`` and the corrected ``rhs = 1/2 ||grad f_j(x_i*)||^2 - D^2
    ||grad f_i(x)||^2`` (meaningful where :func:`other_cluster`)."""
    hessians, optima, clusters, point = (instance[k] for k in ("hessians", "optima", "clusters", "point"))
    grads = gradients(hessians, optima, clusters, point)
    lhs = np.square(grads[:, :, None, :] - grads[:, None, :, :]).sum(-1)
    norms = np.linalg.norm(gradients_at_optima(hessians, optima, clusters), axis=-1)
    own = np.square(grads).sum(-1)
    rhs = lemma1_separation(norms, "pair") - separation_constant(hessians)[:, None, None] * own[:, :, None]
    return lhs, rhs


def pair_worst_margin(instance: Instance) -> np.ndarray:
    """The exact minimum over all ``x`` of ``(lhs - rhs) / ||grad f_j(x_i*)||^2`` for
    eq. (19) per pair, minimised over pairs in different clusters, ``[B]``.

    With ``y = x - x_i*``, ``M = H_i - H_j``, ``g = grad f_j(x_i*)``: ``lhs - rhs =
    ||M y - g||^2 + D^2 ||H_i y||^2 - ||g||^2 / 2``, minimised at ``G y = M^T g``
    with ``G = M^T M + D^2 H_i^2`` (positive definite), where it equals ``||g||^2 / 2 -
    g^T M G^{-1} M^T g``."""
    hessians, optima, clusters = instance["hessians"], instance["optima"], instance["clusters"]
    g = gradients_at_optima(hessians, optima, clusters)
    difference = hessians[:, :, None] - hessians[:, None, :]  # M[b, i, j]
    squared_own = hessians @ hessians
    gram = np.swapaxes(difference, -1, -2) @ difference
    gram = gram + separation_constant(hessians)[:, None, None, None, None] * squared_own[:, :, None]
    projected = np.einsum("bijlk,bijl->bijk", difference, g)  # M^T g
    solved = np.linalg.solve(gram, projected[..., None])[..., 0]
    norm2 = np.square(g).sum(-1)
    mask = other_cluster(clusters)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = 0.5 - (projected * solved).sum(-1) / norm2
    return np.where(mask, relative, np.inf).min(axis=(1, 2))


def assumption4_constant(hessians: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """The exact ``A`` of Assumption 4 (eq. 16) on quadratics sharing an optimum per
    cluster: ``max_i ||(H_i - Hbar_i) Hbar_i^{-1}||_2`` (``Hbar_i`` the mean Hessian of
    ``i``'s cluster), ``[B]``; Lemma 1 claims ``A <= 2L/mu``."""
    clusters = clusters.astype(int)
    onehot = (clusters[..., None] == np.arange(int(clusters.max()) + 1)).astype(float)  # [B, N, K]
    means = np.einsum("bnk,bnij->bkij", onehot, hessians) / np.maximum(onehot.sum(1), 1.0)[..., None, None]
    own_mean = np.take_along_axis(means, clusters[..., None, None], axis=1)
    spread = (hessians - own_mean) @ np.linalg.inv(own_mean)
    return np.linalg.norm(spread, ord=2, axis=(-2, -1)).max(-1)


def assumption4_margin(instance: Instance) -> np.ndarray:
    """``(2L/mu - A) / (2L/mu)`` per instance (eq. 18), ``[B]``."""
    smoothness, convexity = curvature_range(instance["hessians"])
    claimed = lemma1_constants(smoothness, convexity)["A"]
    return (claimed - assumption4_constant(instance["hessians"], instance["clusters"])) / claimed


def _quadratic_batches(budget: Budget, seed: int) -> list[Instance]:
    """Random quadratic families in a handful of shapes (clients, clusters, dims)."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 2, 1), (4, 2, 2), (6, 3, 3), (8, 4, 4), (5, 2, 3)]
    size = _INSTANCES[budget] // len(shapes)
    return [instances.quadratic_clusters(rng, size, n, k, d) for n, k, d in shapes]


def _batches_verdict(name: str, batches: list[Instance], margins: list[np.ndarray], what: str,
                     sides: list | None = None, details: dict | None = None) -> CheckResult:
    """:func:`exact_verdict` over several batches (``margins`` per batch); a
    counterexample is described from its own batch, with ``sides[batch]`` if given."""
    sizes = np.cumsum([m.size for m in margins])

    def describe(index: int) -> dict:
        chunk = int(np.searchsorted(sizes, index, side="right"))
        offset = index - (int(sizes[chunk - 1]) if chunk else 0)
        return described(batches[chunk], None if sides is None else sides[chunk])(offset)

    return exact_verdict(name, np.concatenate(margins), describe, what=what, details=details)


@register(
    "lemma1-A",
    "Lemma 1, eq. (18)",
    "L-smooth, mu-strongly convex losses with one optimum per cluster satisfy Assumption 4 with A = 2L/mu",
    "exact",
)
def check_lemma1_a(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    batches = _quadratic_batches(budget, statement_seed(201, seed))
    margins = [assumption4_margin(batch) for batch in batches]
    # A_exact / (2L/mu) = 1 - margin: how loose eq. (18) is
    return _batches_verdict("lemma1-A", batches, margins, "(2L/mu - A_exact) / (2L/mu) over all x",
                            details={"largest_A_over_2L_mu": float(1.0 - np.concatenate(margins).min())})


@register(
    "lemma1-pair",
    "Lemma 1, eq. (19), derivation in A.3 (corrected)",
    "per pair j not~ i: ||grad f_i(x) - grad f_j(x)||^2 >= 1/2 ||grad f_j(x_i*)||^2 - 2(1 + (L/mu)^2) "
    "||grad f_i(x)||^2; hence Assumption 5 with Delta^2 = 1/2 min_j ||grad f_j(x_i*)||^2",
    "corrected",
)
def check_lemma1_pair(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    batches = _quadratic_batches(budget, statement_seed(202, seed))
    return _batches_verdict("lemma1-pair", batches, [pair_worst_margin(batch) for batch in batches],
                            "min over x and pairs of (lhs - rhs) / ||grad f_j(x_i*)||^2")


# --------------------------------------------------------------------------- Lemma 7

def all_batches(atoms: int, size: int, replacement: bool = True) -> np.ndarray:
    """Every ordered batch of ``size`` indices into ``atoms`` points drawn with
    replacement ``[atoms^size, size]``, or every subset (increasing tuples) without."""
    grid = np.indices((atoms,) * size).reshape(size, -1).T
    if replacement:
        return grid
    return grid[(np.diff(grid, axis=1) > 0).all(axis=1)]


def batch_mean_variance(values: np.ndarray, probabilities: np.ndarray, size: int,
                        replacement: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (124) by enumeration: ``(E||mean_B - E mean_B||^2, the formula)`` per
    instance, ``values[B, m, d]``, ``probabilities[B, m]``.  With replacement every
    ordered batch has probability ``prod p``, formula ``sigma^2 / |B|``; without,
    every subset is equally likely (``probabilities`` must be uniform), formula
    ``sigma^2/|B| (m - |B|)/(m - 1)``."""
    atoms = values.shape[1]
    index = all_batches(atoms, size, replacement)
    if replacement:
        weights = np.prod(probabilities[:, index], axis=-1)  # [B, S]
    else:
        if not np.allclose(probabilities, 1.0 / atoms):
            raise ValueError("sampling without replacement is enumerated for equal weights only")
        weights = np.full((values.shape[0], index.shape[0]), 1.0 / index.shape[0])
    means = values[:, index].mean(axis=2)  # [B, S, d]
    centre = np.einsum("bs,bsd->bd", weights, means)
    variance = np.einsum("bs,bs->b", weights, np.square(means - centre[:, None]).sum(-1))
    population = np.einsum("bm,bmd->bd", probabilities, values)
    sigma2 = np.einsum("bm,bm->b", probabilities, np.square(values - population[:, None]).sum(-1))
    formula = sigma2 / size if replacement else sigma2 / size * (atoms - size) / (atoms - 1)
    return variance, formula


def _equality_margin(exact: np.ndarray, formula: np.ndarray) -> np.ndarray:
    return -np.abs(exact - formula) / np.maximum(formula, np.finfo(float).tiny)


@register(
    "lemma7",
    "Lemma 7, eq. (124)",
    "a batch of |B| iid samples has variance sigma^2/|B| (equality); sampling without replacement from n "
    "points gives sigma^2/|B| (n - |B|)/(n - 1) instead",
    "exact",
)
def check_lemma7(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    rng = np.random.default_rng(statement_seed(203, seed))
    cases = [(2, 1, 3), (3, 2, 2), (4, 3, 1), (5, 2, 3), (6, 3, 2), (4, 4, 2)]
    size = _INSTANCES[budget] // (2 * len(cases))
    margins, largest = [], 0.0
    for atoms, batch_size, dim in cases:
        weighted = instances.finite_distributions(rng, size, atoms, dim)
        uniform = instances.finite_distributions(rng, size, atoms, dim, uniform=True)
        with_replacement = _equality_margin(
            *batch_mean_variance(weighted["values"], weighted["probabilities"], batch_size))
        without = _equality_margin(*batch_mean_variance(uniform["values"], uniform["probabilities"], batch_size, False))
        margins += [with_replacement, without]
        largest = max(largest, float(-with_replacement.min()), float(-without.min()))
    return exact_verdict("lemma7", np.concatenate(margins), what="-(relative difference from the formula)",
                         details={"largest_relative_difference": largest, "cases": cases})


# --------------------------------------------------------------------------- Lemma 14

def momentum_variances(alpha: np.ndarray | float, sigma2: np.ndarray | float, steps: int) -> np.ndarray:
    """``Var m_t`` for ``t = 1..steps`` from the recursion ``V_t = (1 - alpha)^2
    V_{t-1} + alpha^2 sigma^2``, ``V_0 = 0`` (a deterministic ``m_0``), ``[steps, ...]``."""
    alpha, sigma2 = np.asarray(alpha, float), np.asarray(sigma2, float)
    variance = np.zeros(np.broadcast(alpha, sigma2).shape)
    out = []
    for _ in range(steps):
        variance = (1.0 - alpha) ** 2 * variance + alpha**2 * sigma2
        out.append(variance)
    return np.stack(out)


def momentum_variance_closed_form(alpha: np.ndarray | float, sigma2: np.ndarray | float, steps: int) -> np.ndarray:
    """``alpha sigma^2 (1 - (1 - alpha)^{2t}) / (2 - alpha)`` for ``t = 1..steps``."""
    alpha, sigma2 = np.asarray(alpha, float), np.asarray(sigma2, float)
    t = np.arange(1, steps + 1).reshape((-1,) + (1,) * np.broadcast(alpha, sigma2).ndim)
    return alpha * sigma2 * (1.0 - (1.0 - alpha) ** (2 * t)) / (2.0 - alpha)


def momentum_monte_carlo(alpha: float, sigma2: float, steps: int, chains: int, dim: int,
                         seed: int) -> tuple[float, float]:
    """Empirical ``E||m_T - E m_T||^2`` over ``chains`` independent momentum chains with
    ``m_0 = 0`` and ``g_t = mu + noise`` (centred exponential noise, total variance
    ``sigma2``), and its standard error.  ``E m_T`` is known: ``(1 - (1 - alpha)^T) mu``."""
    rng = np.random.default_rng(seed)
    mean = rng.normal(0.0, 1.0, dim)
    scale = np.sqrt(sigma2 / dim)  # a unit exponential has variance 1
    momentum = np.zeros((chains, dim))
    for _ in range(steps):
        noise = (rng.exponential(1.0, (chains, dim)) - 1.0) * scale
        momentum = alpha * (mean + noise) + (1.0 - alpha) * momentum
    deviations = np.square(momentum - (1.0 - (1.0 - alpha) ** steps) * mean).sum(-1)
    return float(deviations.mean()), float(deviations.std(ddof=1) / np.sqrt(chains))


# Monte-Carlo agreement within this many standard errors.
MC_STANDARD_ERRORS = 4.0


@register(
    "lemma14",
    "Lemma 14, eq. (228)",
    "momentum m_t = alpha g_t + (1 - alpha) m_{t-1} (deterministic m_0) has variance <= alpha sigma^2; "
    "exactly alpha sigma^2 (1 - (1 - alpha)^{2t}) / (2 - alpha) -> alpha sigma^2 / (2 - alpha)",
    "exact",
)
def check_lemma14(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    alphas = np.concatenate([np.linspace(0.01, 1.0, 100), [1e-4, 0.5]])
    steps = 200
    recursion = momentum_variances(alphas, 1.0, steps)
    closed = momentum_variance_closed_form(alphas, 1.0, steps)
    bound = np.broadcast_to(alphas, recursion.shape)
    stationary = np.broadcast_to(alphas / (2.0 - alphas), recursion.shape)
    margins = np.concatenate([
        ((bound - recursion) / bound).ravel(),
        ((stationary - recursion) / bound).ravel(),
        -np.abs(recursion - closed).ravel() / bound.ravel(),
    ])
    chains = 4000 if budget == "quick" else 40000
    mc_alphas = (0.05, 0.3, 0.9)
    z_scores = []
    for index, alpha in enumerate(mc_alphas):
        empirical, error = momentum_monte_carlo(alpha, 2.0, 60, chains, 3, seed=statement_seed(204 + index, seed))
        exact = float(momentum_variance_closed_form(alpha, 2.0, 60)[-1])
        z_scores.append((empirical - exact) / error)
    z = np.asarray(z_scores)
    margins = np.concatenate([margins, (MC_STANDARD_ERRORS - np.abs(z)) / MC_STANDARD_ERRORS])
    return exact_verdict("lemma14", margins, what="margin (recursion, closed form, Monte-Carlo z / 4)",
                         details={"grid": f"{alphas.size} alphas x {steps} steps, 3 comparisons each",
                                  "monte_carlo_alphas": list(mc_alphas), "monte_carlo_z": z.tolist(),
                                  "chains": chains})


# --------------------------------------------------------------------------- descent

def _descent_margin(before: np.ndarray, after: np.ndarray, eta: np.ndarray, grad_norm2: np.ndarray) -> np.ndarray:
    """``(f(x) - eta/2 ||g||^2 - f(x - eta g))`` relative to the promised decrease
    (or to ``1e-3 |f(x)|`` where that is smaller, so rounding of ``f`` stays far
    below the tolerance)."""
    promised = 0.5 * eta * grad_norm2
    scale = np.maximum(promised, 1e-3 * np.abs(before))
    return (before - promised - after) / np.maximum(scale, np.finfo(float).tiny)


def quadratic_descent_sides(instance: Instance) -> tuple[np.ndarray, np.ndarray]:
    """``(f(x - eta grad f), f(x) - eta/2 ||grad f||^2)`` for ``f = 1/2 x^T H x + b^T x``."""
    hessian, linear, point, eta = (instance[k] for k in ("hessian", "linear", "point", "eta"))

    def value(x: np.ndarray) -> np.ndarray:
        return 0.5 * np.einsum("bi,bij,bj->b", x, hessian, x) + np.einsum("bi,bi->b", linear, x)

    grad = np.einsum("bij,bj->bi", hessian, point) + linear
    after = value(point - eta[:, None] * grad)
    return after, value(point) - 0.5 * eta * np.square(grad).sum(-1)


def quadratic_descent_margin(instance: Instance) -> np.ndarray:
    hessian, linear, point, eta = (instance[k] for k in ("hessian", "linear", "point", "eta"))
    grad = np.einsum("bij,bj->bi", hessian, point) + linear
    before = 0.5 * np.einsum("bi,bij,bj->b", point, hessian, point) + np.einsum("bi,bi->b", linear, point)
    after, _ = quadratic_descent_sides(instance)
    return _descent_margin(before, after, eta, np.square(grad).sum(-1))


def logistic_smoothness(features: np.ndarray) -> np.ndarray:
    """The exact ``L`` of the mean logistic loss: ``lambda_max(A^T A) / (4n)`` (its
    Hessian ``A^T diag(s(1 - s)) A / n`` is largest at ``w = 0``, where ``s = 1/2``)."""
    gram = np.swapaxes(features, -1, -2) @ features
    return np.linalg.eigvalsh(gram)[..., -1] / (4.0 * features.shape[-2])


def logistic_value_and_gradient(features: np.ndarray, labels: np.ndarray,
                                point: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean logistic loss ``(1/n) sum log(1 + exp(-y a^T w))`` and its gradient."""
    margins = labels * np.einsum("bnd,bd->bn", features, point)
    value = np.logaddexp(0.0, -margins).mean(-1)
    weights = -labels * np.exp(-np.logaddexp(0.0, margins))  # -y sigmoid(-y a^T w)
    return value, np.einsum("bn,bnd->bd", weights, features) / features.shape[-2]


def logistic_descent_sides(instance: Instance) -> tuple[np.ndarray, np.ndarray]:
    """``(f(x - eta grad f), f(x) - eta/2 ||grad f||^2)`` with ``eta = step_fraction / L``."""
    features, labels, point = instance["features"], instance["labels"], instance["point"]
    eta = instance["step_fraction"] / logistic_smoothness(features)
    before, grad = logistic_value_and_gradient(features, labels, point)
    after, _ = logistic_value_and_gradient(features, labels, point - eta[:, None] * grad)
    return after, before - 0.5 * eta * np.square(grad).sum(-1)


def logistic_descent_margin(instance: Instance) -> np.ndarray:
    features, labels, point = instance["features"], instance["labels"], instance["point"]
    eta = instance["step_fraction"] / logistic_smoothness(features)
    before, grad = logistic_value_and_gradient(features, labels, point)
    after, _ = logistic_descent_sides(instance)
    return _descent_margin(before, after, eta, np.square(grad).sum(-1))


@register(
    "descent",
    "descent step of A.4 / A.5 (L-smoothness, Assumption 7)",
    "f(x - eta grad f(x)) <= f(x) - (eta/2) ||grad f(x)||^2 for eta <= 1/L on L-smooth f",
    "exact",
)
def check_descent(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    rng = np.random.default_rng(statement_seed(205, seed))
    size = _INSTANCES[budget] // 4
    quadratics = [instances.convex_quadratics(rng, size, dim) for dim in (1, 3)]
    logistic = [instances.logistic_problems(rng, size, samples, dim) for samples, dim in ((5, 2), (12, 4))]
    margins = [quadratic_descent_margin(b) for b in quadratics] + [logistic_descent_margin(b) for b in logistic]
    sides = [quadratic_descent_sides] * 2 + [logistic_descent_sides] * 2
    return _batches_verdict("descent", quadratics + logistic, margins,
                            "(f(x) - eta/2 ||g||^2 - f(x - eta g)) / (eta/2 ||g||^2)", sides)
