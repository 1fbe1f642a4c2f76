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
from theory_checks.controls import margin_control
from theory_checks.statements import instances
from theory_checks.statements.registry import Budget, register, statement_seed
from theory_checks.statements.search import TOLERANCE, Instance, described, exact_verdict
from theory_checks.types import CheckResult, NegativeControl

_INSTANCES: dict[str, int] = {"quick": 2000, "full": 40000}

# Instances of each negative control (whatever the budget: a control needs only show
# the claim can fail).
_CONTROL_INSTANCES = 300


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
    return claimed_optimum_gradients(hessians, optima, clusters, clusters)


def claimed_optimum_gradients(hessians: np.ndarray, optima: np.ndarray, clusters: np.ndarray,
                              minimisers: np.ndarray) -> np.ndarray:
    """``grad f_j(x_i*)``, ``[B, N (i), N (j), d]``, with ``x_i*`` the optimum of ``i``'s
    cluster (``optima[clusters[i]]``) and ``f_j`` minimised at ``optima[minimisers[j]]``
    (Lemma 1 has ``minimisers = clusters``: one optimum per cluster)."""
    claimed = client_optima(optima, clusters)
    own = client_optima(optima, minimisers)
    return np.einsum("bjkl,bijl->bijk", hessians, claimed[:, :, None, :] - own[:, None, :, :])


def minimisers_of(instance: Instance) -> np.ndarray:
    """Which optimum each client's loss has: ``instance["minimisers"]`` where a control
    breaks Lemma 1's shared optimum (:func:`instances.mislabelled_clusters`), else its
    cluster label (the hypothesis)."""
    return instance.get("minimisers", instance["clusters"])


def other_cluster(clusters: np.ndarray) -> np.ndarray:
    """``[B, N, N]`` mask of the pairs ``(i, j)`` in different clusters."""
    return clusters[:, :, None] != clusters[:, None, :]


def pair_sides(instance: Instance) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (19) per pair at ``instance["point"]``: ``lhs[B, N, N] = ||grad f_i(x) -
    grad f_j(x)||^2`` and the corrected ``rhs = 1/2 ||grad f_j(x_i*)||^2 - D^2
    ||grad f_i(x)||^2`` (meaningful where :func:`other_cluster`).  The losses' optima
    are :func:`minimisers_of` the instance."""
    hessians, optima, clusters, point = (instance[k] for k in ("hessians", "optima", "clusters", "point"))
    minimisers = minimisers_of(instance)
    grads = gradients(hessians, optima, minimisers, point)
    lhs = np.square(grads[:, :, None, :] - grads[:, None, :, :]).sum(-1)
    norms = np.linalg.norm(claimed_optimum_gradients(hessians, optima, clusters, minimisers), axis=-1)
    own = np.square(grads).sum(-1)
    rhs = lemma1_separation(norms, "pair") - separation_constant(hessians)[:, None, None] * own[:, :, None]
    return lhs, rhs


def pair_margin_at_point(instance: Instance) -> np.ndarray:
    """Eq. (19)'s per-pair gap at ``instance["point"]``, ``(lhs - rhs) / ||grad
    f_j(x_i*)||^2`` (the normalisation of :func:`pair_worst_margin`, which is its
    minimum over ``x``), minimised over the pairs in different clusters, ``[B]``.
    Pairs with ``grad f_j(x_i*) = 0`` have ``rhs <= 0 <= lhs`` and are left out."""
    lhs, rhs = pair_sides(instance)
    hessians, optima, clusters = instance["hessians"], instance["optima"], instance["clusters"]
    norm2 = np.square(claimed_optimum_gradients(hessians, optima, clusters, minimisers_of(instance))).sum(-1)
    constrained = other_cluster(clusters) & (norm2 > 0)
    gap = np.divide(lhs - rhs, norm2, out=np.full_like(lhs, np.inf), where=constrained)
    return gap.min(axis=(1, 2))


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


def own_cluster_means(values: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """Each client's cluster mean of ``values[B, N, ...]`` (its Hessian, its gradient),
    ``[B, N, ...]``: the ``fbar_i`` of Assumption 4 (eq. 16)."""
    clusters = clusters.astype(int)
    onehot = (clusters[..., None] == np.arange(int(clusters.max()) + 1)).astype(float)  # [B, N, K]
    sums = np.einsum("bnk,bn...->bk...", onehot, values)
    counts = np.maximum(onehot.sum(1), 1.0).reshape(onehot.shape[0], -1, *([1] * (values.ndim - 2)))
    index = clusters.reshape(*clusters.shape, *([1] * (values.ndim - 2)))
    return np.take_along_axis(sums / counts, index, axis=1)


def assumption4_constant(hessians: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """The exact ``A`` of Assumption 4 (eq. 16) on quadratics sharing an optimum per
    cluster: ``max_i ||(H_i - Hbar_i) Hbar_i^{-1}||_2`` (``Hbar_i`` the mean Hessian of
    ``i``'s cluster), ``[B]``; Lemma 1 claims ``A <= 2L/mu``."""
    own_mean = own_cluster_means(hessians, clusters)
    spread = (hessians - own_mean) @ np.linalg.inv(own_mean)
    return np.linalg.norm(spread, ord=2, axis=(-2, -1)).max(-1)


def assumption4_ratio(instance: Instance) -> np.ndarray:
    """Assumption 4's ratio at ``instance["point"]``, ``max_i ||grad f_i(x) - grad
    fbar_i(x)|| / ||grad fbar_i(x)||`` (eq. 16), ``[B]``: a lower bound of ``A``, its
    supremum over ``x``, for any losses (optima from :func:`minimisers_of`).  A zero
    ``grad fbar_i`` gives ``inf`` unless ``grad f_i`` vanishes too (then 0: any ``A``
    meets eq. 16 there)."""
    grads = gradients(instance["hessians"], instance["optima"], minimisers_of(instance), instance["point"])
    mean = own_cluster_means(grads, instance["clusters"])
    spread = np.linalg.norm(grads - mean, axis=-1)
    scale = np.linalg.norm(mean, axis=-1)
    ratio = np.divide(spread, scale, out=np.where(spread > 0, np.inf, 0.0), where=scale > 0)
    return ratio.max(-1)


def _relative_to_claim(hessians: np.ndarray, constant: np.ndarray) -> np.ndarray:
    """``(2L/mu - A) / (2L/mu)``: eq. (18)'s margin for an Assumption-4 constant ``A``."""
    smoothness, convexity = curvature_range(hessians)
    claimed = lemma1_constants(smoothness, convexity)["A"]
    return (claimed - constant) / claimed


def assumption4_margin(instance: Instance) -> np.ndarray:
    """``(2L/mu - A) / (2L/mu)`` per instance (eq. 18), ``[B]``."""
    return _relative_to_claim(instance["hessians"], assumption4_constant(instance["hessians"], instance["clusters"]))


def assumption4_margin_at_point(instance: Instance) -> np.ndarray:
    """Eq. (18)'s margin ``(2L/mu - A) / (2L/mu)`` with ``A`` bounded below by
    :func:`assumption4_ratio` at ``instance["point"]`` (so at least as large as the
    margin of the exact ``A``), ``[B]``."""
    return _relative_to_claim(instance["hessians"], assumption4_ratio(instance))


def near_cluster_optimum(instance: Instance) -> np.ndarray:
    """Lemma 1-A's control point ``[B, d]``: ``xbar* + r w`` with ``xbar*`` the optimum
    of the mean loss of client 0's cluster, ``w`` a fixed direction and ``r = eps G /
    L``, ``G = max_i ||grad f_i(xbar*)||`` over the cluster, ``eps = 1 / (1 + 4 L/mu)``.

    There ``grad fbar = Hbar r w`` has norm ``<= L r``, while the client ``i`` with
    ``||grad f_i(xbar*)|| = G`` has ``||grad f_i - grad fbar|| >= G - ||H_i - Hbar|| r
    >= G - L r``; the ratio of eq. (16) is ``>= 1/eps - 1 = 4L/mu``, twice the claimed
    ``A``, whenever ``G > 0``, i.e. whenever the cluster's losses do not share their
    optimum (:func:`instances.mislabelled_clusters`)."""
    hessians, optima, clusters = instance["hessians"], instance["optima"], instance["clusters"]
    members = (clusters == clusters[:, :1]).astype(float)  # [B, N]: client 0's cluster
    own = client_optima(optima, minimisers_of(instance))
    curvature = np.einsum("bn,bnij->bij", members, hessians)
    pull = np.einsum("bn,bnij,bnj->bi", members, hessians, own)
    centre = np.linalg.solve(curvature, pull[..., None])[..., 0]  # where the cluster's mean gradient is 0
    at_centre = np.linalg.norm(gradients(hessians, optima, minimisers_of(instance), centre), axis=-1)
    largest = (at_centre * members).max(-1)
    smoothness, convexity = curvature_range(hessians)
    eps = 1.0 / (1.0 + 4.0 * smoothness / convexity)
    direction = np.zeros_like(centre)
    direction[:, 0] = 1.0
    return centre + (eps * largest / smoothness)[:, None] * direction


def _quadratic_batches(budget: Budget, seed: int) -> list[Instance]:
    """Random quadratic families in a handful of shapes (clients, clusters, dims)."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 2, 1), (4, 2, 2), (6, 3, 3), (8, 4, 4), (5, 2, 3)]
    size = _INSTANCES[budget] // len(shapes)
    return [instances.quadratic_clusters(rng, size, n, k, d) for n, k, d in shapes]


def _batches_verdict(name: str, batches: list[Instance], margins: list[np.ndarray], what: str,
                     sides: list | None = None, details: dict | None = None,
                     control: NegativeControl | None = None) -> CheckResult:
    """:func:`exact_verdict` over several batches (``margins`` per batch); a
    counterexample is described from its own batch, with ``sides[batch]`` if given."""
    sizes = np.cumsum([m.size for m in margins])

    def describe(index: int) -> dict:
        chunk = int(np.searchsorted(sizes, index, side="right"))
        offset = index - (int(sizes[chunk - 1]) if chunk else 0)
        return described(batches[chunk], None if sides is None else sides[chunk])(offset)

    return exact_verdict(name, np.concatenate(margins), describe, what=what, details=details, control=control)


ASSUMPTION4_MARGIN = "(2L/mu - A_exact) / (2L/mu) over all x"
PAIR_MARGIN = "min over x and pairs of (lhs - rhs) / ||grad f_j(x_i*)||^2"
#: (clients, clusters, d) of the Lemma 1 controls: every cluster 0 has two clients.
_MISLABELLED_SHAPES: tuple[tuple[int, int, int], ...] = ((3, 2, 1), (6, 3, 3), (5, 2, 3))


def _mislabelled_batches(seed: int) -> list[Instance]:
    rng = instances.control_rng(seed)
    size = _CONTROL_INSTANCES // len(_MISLABELLED_SHAPES)
    return [instances.mislabelled_clusters(rng, size, n, k, d) for n, k, d in _MISLABELLED_SHAPES]


def lemma1_a_control(seed: int) -> NegativeControl:
    """Eq. (18) on losses that do not share one optimum per cluster
    (:func:`instances.mislabelled_clusters`): at :func:`near_cluster_optimum` the
    ratio of eq. (16) is at least ``4L/mu``, so every margin is at most ``-1`` (at
    ``xbar*`` itself ``A`` is infinite: ``grad fbar = 0`` while some ``grad f_i != 0``)."""
    batches = [{**batch, "point": near_cluster_optimum(batch)} for batch in _mislabelled_batches(seed)]
    margins = np.concatenate([assumption4_margin_at_point(batch) for batch in batches])
    # eq. (16)'s ratio at one x bounds A below, so this margin bounds the exact one above
    return margin_control("a client of cluster 0 with another cluster's optimum (no shared optimum)", margins,
                          ASSUMPTION4_MARGIN, TOLERANCE, details={"A": "eq. (16)'s ratio at xbar* + r w"})


def lemma1_pair_control(seed: int) -> NegativeControl:
    """Eq. (19)'s per-pair form on losses that do not share one optimum per cluster
    (:func:`instances.mislabelled_clusters`: client 0 of cluster 0 has cluster ``k``'s
    optimum).  At ``x = x_k*`` the pair ``(0, j)``, ``j`` in cluster ``k``, has ``lhs = 0``
    (both gradients vanish) and ``rhs = 1/2 ||grad f_j(x_0*)||^2 > 0``: a margin of
    ``-1/2``.  The proof's step ``||grad f_i(x)|| >= mu ||x - x_i*||`` needs ``grad
    f_i(x_i*) = 0``, which the mislabelled client breaks."""
    margins = np.concatenate([pair_margin_at_point(batch) for batch in _mislabelled_batches(seed)])
    # the gap at one x bounds its minimum over x above
    return margin_control("a client of cluster 0 with another cluster's optimum (no shared optimum)", margins,
                          PAIR_MARGIN, TOLERANCE, details={"x": "x_k*, the mislabelled client's optimum"})


@register(
    "lemma1-A",
    "Lemma 1, eq. (18)",
    "L-smooth, mu-strongly convex losses with one optimum per cluster satisfy Assumption 4 with A = 2L/mu",
    "exact",
)
def check_lemma1_a(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    stream = statement_seed(201, seed)
    batches = _quadratic_batches(budget, stream)
    margins = [assumption4_margin(batch) for batch in batches]
    # A_exact / (2L/mu) = 1 - margin: how loose eq. (18) is
    return _batches_verdict("lemma1-A", batches, margins, ASSUMPTION4_MARGIN,
                            details={"largest_A_over_2L_mu": float(1.0 - np.concatenate(margins).min())},
                            control=lemma1_a_control(stream))


@register(
    "lemma1-pair",
    "Lemma 1, eq. (19), derivation in A.3 (corrected)",
    "per pair j not~ i: ||grad f_i(x) - grad f_j(x)||^2 >= 1/2 ||grad f_j(x_i*)||^2 - 2(1 + (L/mu)^2) "
    "||grad f_i(x)||^2; hence Assumption 5 with Delta^2 = 1/2 min_j ||grad f_j(x_i*)||^2",
    "corrected",
)
def check_lemma1_pair(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    stream = statement_seed(202, seed)
    batches = _quadratic_batches(budget, stream)
    return _batches_verdict("lemma1-pair", batches, [pair_worst_margin(batch) for batch in batches], PAIR_MARGIN,
                            control=lemma1_pair_control(stream))


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
    variance, sigma2 = _enumerated_variance(values, probabilities, index, weights)
    formula = sigma2 / size if replacement else sigma2 / size * (atoms - size) / (atoms - 1)
    return variance, formula


def copied_batch_variance(values: np.ndarray, probabilities: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Lemma 7's negative control: ``(E||mean_B - E mean_B||^2, sigma^2 / |B|)`` for a
    "batch" of ``|B|`` copies of one draw (the samples are not independent, which eq.
    (124) needs).  Its mean is the draw itself, of variance ``sigma^2``: the equality
    misses by a factor ``|B|``, a margin of ``-(|B| - 1)``, whenever ``sigma^2 > 0``."""
    index = np.repeat(np.arange(values.shape[1])[:, None], size, axis=1)  # batch a = (a, ..., a)
    variance, sigma2 = _enumerated_variance(values, probabilities, index, probabilities)
    return variance, sigma2 / size


def _enumerated_variance(values: np.ndarray, probabilities: np.ndarray, index: np.ndarray,
                         weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(variance of the batch mean, sigma^2)`` over the batches ``index[S, |B|]`` with
    probabilities ``weights[B, S]``, for the law ``values`` / ``probabilities``."""
    means = values[:, index].mean(axis=2)  # [B, S, d]
    centre = np.einsum("bs,bsd->bd", weights, means)
    variance = np.einsum("bs,bs->b", weights, np.square(means - centre[:, None]).sum(-1))
    population = np.einsum("bm,bmd->bd", probabilities, values)
    sigma2 = np.einsum("bm,bm->b", probabilities, np.square(values - population[:, None]).sum(-1))
    return variance, sigma2


def _equality_margin(exact: np.ndarray, formula: np.ndarray) -> np.ndarray:
    return -np.abs(exact - formula) / np.maximum(formula, np.finfo(float).tiny)


LEMMA7_MARGIN = "-(relative difference from the formula)"
# (atoms, |B|, d) of the cases
_LEMMA7_CASES: list[tuple[int, int, int]] = [(2, 1, 3), (3, 2, 2), (4, 3, 1), (5, 2, 3), (6, 3, 2), (4, 4, 2)]


def lemma7_control(seed: int) -> NegativeControl:
    """Eq. (124) on batches of copies of one draw (:func:`copied_batch_variance`) in
    the cases with ``|B| >= 2``: every margin is ``-(|B| - 1) <= -1``."""
    rng = instances.control_rng(seed)
    cases = [case for case in _LEMMA7_CASES if case[1] >= 2]
    size = _CONTROL_INSTANCES // len(cases)
    margins = []
    for atoms, batch_size, dim in cases:
        law = instances.finite_distributions(rng, size, atoms, dim)
        margins.append(_equality_margin(*copied_batch_variance(law["values"], law["probabilities"], batch_size)))
    return margin_control("a batch of |B| copies of one draw (samples not independent)", np.concatenate(margins),
                          LEMMA7_MARGIN, TOLERANCE)


@register(
    "lemma7",
    "Lemma 7, eq. (124)",
    "a batch of |B| iid samples has variance sigma^2/|B| (equality); sampling without replacement from n "
    "points gives sigma^2/|B| (n - |B|)/(n - 1) instead",
    "exact",
)
def check_lemma7(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    stream = statement_seed(203, seed)
    rng = np.random.default_rng(stream)
    size = _INSTANCES[budget] // (2 * len(_LEMMA7_CASES))
    margins, largest = [], 0.0
    for atoms, batch_size, dim in _LEMMA7_CASES:
        weighted = instances.finite_distributions(rng, size, atoms, dim)
        uniform = instances.finite_distributions(rng, size, atoms, dim, uniform=True)
        with_replacement = _equality_margin(
            *batch_mean_variance(weighted["values"], weighted["probabilities"], batch_size))
        without = _equality_margin(*batch_mean_variance(uniform["values"], uniform["probabilities"], batch_size, False))
        margins += [with_replacement, without]
        largest = max(largest, float(-with_replacement.min()), float(-without.min()))
    return exact_verdict("lemma7", np.concatenate(margins), what=LEMMA7_MARGIN,
                         details={"largest_relative_difference": largest, "cases": _LEMMA7_CASES},
                         control=lemma7_control(stream))


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


def momentum_variances_repeated_noise(alpha: np.ndarray | float, sigma2: np.ndarray | float,
                                      steps: int) -> np.ndarray:
    """Lemma 14's negative control: ``Var m_t``, ``t = 1..steps``, when every step
    reuses one noise draw (perfectly correlated noise; eq. (228) needs independent
    noise).  The deviation ``D_t = alpha xi + (1 - alpha) D_{t-1}`` stays a multiple
    ``s_t xi`` of the draw, ``s_t = alpha + (1 - alpha) s_{t-1}``, ``s_0 = 0``, so
    ``Var m_t = s_t^2 sigma^2 = (1 - (1 - alpha)^t)^2 sigma^2``, ``[steps, ...]``: above
    ``alpha sigma^2`` once ``(1 - (1 - alpha)^t)^2 > alpha``, for every ``alpha < 1``
    and ``t`` large enough."""
    alpha, sigma2 = np.asarray(alpha, float), np.asarray(sigma2, float)
    scale = np.zeros(np.broadcast(alpha, sigma2).shape)
    out = []
    for _ in range(steps):
        scale = alpha + (1.0 - alpha) * scale
        out.append(scale**2 * sigma2)
    return np.stack(out)


def momentum_bound_margin(alpha: np.ndarray | float, sigma2: np.ndarray | float,
                          variance: np.ndarray) -> np.ndarray:
    """Eq. (228)'s margin ``(alpha sigma^2 - Var m_t) / (alpha sigma^2)``."""
    bound = np.asarray(alpha, float) * np.asarray(sigma2, float)
    return (bound - variance) / bound


# Monte-Carlo agreement within this many standard errors.
MC_STANDARD_ERRORS = 4.0
LEMMA14_STEPS = 200


def lemma14_control(alphas: np.ndarray) -> NegativeControl:
    """Eq. (228)'s bound on momentum whose noise repeats one draw every step
    (:func:`momentum_variances_repeated_noise`), at every ``alpha`` of the grid after
    :data:`LEMMA14_STEPS` steps: every ``alpha < 1`` violates it (``alpha = 0.01``: a
    margin near ``-74``)."""
    variance = momentum_variances_repeated_noise(alphas, 1.0, LEMMA14_STEPS)[-1]
    return margin_control("the same noise draw at every step (noise not independent)",
                          momentum_bound_margin(alphas, 1.0, variance), "(alpha sigma^2 - Var m_T) / (alpha sigma^2)",
                          TOLERANCE)


@register(
    "lemma14",
    "Lemma 14, eq. (228)",
    "momentum m_t = alpha g_t + (1 - alpha) m_{t-1} (deterministic m_0) has variance <= alpha sigma^2; "
    "exactly alpha sigma^2 (1 - (1 - alpha)^{2t}) / (2 - alpha) -> alpha sigma^2 / (2 - alpha)",
    "exact",
)
def check_lemma14(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    alphas = np.concatenate([np.linspace(0.01, 1.0, 100), [1e-4, 0.5]])
    steps = LEMMA14_STEPS
    recursion = momentum_variances(alphas, 1.0, steps)
    closed = momentum_variance_closed_form(alphas, 1.0, steps)
    bound = np.broadcast_to(alphas, recursion.shape)
    stationary = np.broadcast_to(alphas / (2.0 - alphas), recursion.shape)
    margins = np.concatenate([
        momentum_bound_margin(bound, 1.0, recursion).ravel(),
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
                                  "chains": chains},
                         control=lemma14_control(alphas))


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


DESCENT_MARGIN = "(f(x) - eta/2 ||g||^2 - f(x - eta g)) / (eta/2 ||g||^2)"


def descent_control(seed: int) -> NegativeControl:
    """The descent inequality with steps ``eta`` in ``(2/L, 4/L)`` (it needs ``eta <=
    1/L``) on :func:`instances.steep_quadratic_steps`, whose gradient is a top
    eigenvector: ``f(x) - f(x - eta g) = eta ||g||^2 (1 - eta L / 2) < 0 < eta/2
    ||g||^2``, a margin of ``1 - eta L < -1`` (nearer 0 only where ``1e-3 |f(x)|`` sets
    the scale)."""
    rng = instances.control_rng(seed)
    batches = [instances.steep_quadratic_steps(rng, _CONTROL_INSTANCES // 2, dim) for dim in (1, 3)]
    return margin_control("steps eta in (2/L, 4/L) along the top curvature",
                          np.concatenate([quadratic_descent_margin(batch) for batch in batches]), DESCENT_MARGIN,
                          TOLERANCE)


@register(
    "descent",
    "descent step of A.4 / A.5 (L-smoothness, Assumption 7)",
    "f(x - eta grad f(x)) <= f(x) - (eta/2) ||grad f(x)||^2 for eta <= 1/L on L-smooth f",
    "exact",
)
def check_descent(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    stream = statement_seed(205, seed)
    rng = np.random.default_rng(stream)
    size = _INSTANCES[budget] // 4
    quadratics = [instances.convex_quadratics(rng, size, dim) for dim in (1, 3)]
    logistic = [instances.logistic_problems(rng, size, samples, dim) for samples, dim in ((5, 2), (12, 4))]
    margins = [quadratic_descent_margin(b) for b in quadratics] + [logistic_descent_margin(b) for b in logistic]
    sides = [quadratic_descent_sides] * 2 + [logistic_descent_sides] * 2
    return _batches_verdict("descent", quadratics + logistic, margins, DESCENT_MARGIN, sides,
                            control=descent_control(stream))
