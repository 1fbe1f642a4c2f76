"""Seeded random instances shared by the statement checks.

Every generator takes a ``numpy.random.Generator`` and a batch size and returns an
:data:`~theory_checks.statements.search.Instance`: a dict of float64 (or integer)
arrays with a leading batch axis.  Sizes are small: the checks want many cheap
instances, not large ones.
"""

from __future__ import annotations

import numpy as np

from theory_checks.statements.search import Instance

# Points placed on a ball's sphere sit this much inside it (relative), so that the
# rounding of their computed distance cannot put them outside.
ON_SPHERE = 1.0 - 1e-12


def unit_vectors(rng: np.random.Generator, shape: tuple[int, ...], dim: int) -> np.ndarray:
    """Uniform directions ``[*shape, dim]``."""
    vectors = rng.standard_normal((*shape, dim))
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def rotations(rng: np.random.Generator, shape: tuple[int, ...], dim: int) -> np.ndarray:
    """Haar-random orthogonal matrices ``[*shape, dim, dim]`` (QR with the sign fix)."""
    q, r = np.linalg.qr(rng.standard_normal((*shape, dim, dim)))
    return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def symmetric_with_spectrum(rng: np.random.Generator, eigenvalues: np.ndarray) -> np.ndarray:
    """Random symmetric matrices ``Q diag(eigenvalues) Q^T`` (``eigenvalues[..., d]``)."""
    q = rotations(rng, eigenvalues.shape[:-1], eigenvalues.shape[-1])
    return np.einsum("...ij,...j,...kj->...ik", q, eigenvalues, q)


def point_clouds(rng: np.random.Generator, batch: int, clients: int, dim: int) -> Instance:
    """One threshold step's input: ``points[B, N, d]``, ``centre[B, d]``, ``radius[B]``
    (about half the points inside).  A quarter of the instances are tight for the
    one-step bound: a random subset of points on the sphere in one common direction."""
    centre = rng.normal(0.0, 0.5, (batch, dim))
    radius = rng.uniform(0.3, 2.5, batch) * np.sqrt(dim)
    points = rng.normal(0.0, 1.0, (batch, clients, dim)) * np.sqrt(dim) * rng.uniform(0.5, 2.0, (batch, 1, 1))
    tight = rng.random(batch) < 0.25
    on_sphere = tight[:, None] & (rng.random((batch, clients)) < 0.6)
    direction = unit_vectors(rng, (batch,), dim)
    edge = centre + ON_SPHERE * radius[:, None] * direction
    points = np.where(on_sphere[..., None], edge[:, None, :], points)
    return {"points": points, "centre": centre, "radius": radius}


def replacement_pairs(rng: np.random.Generator, batch: int, clients: int, dim: int) -> Instance:
    """:func:`point_clouds` plus ``replacements[B, N, d]`` and a mask ``replaced[B, N]``
    of the points swapped for them.  In the tight quarter the replaced points sit on
    the sphere at ``+u`` and their replacements at ``-u``."""
    cloud = point_clouds(rng, batch, clients, dim)
    centre, radius = cloud["centre"], cloud["radius"]
    replaced = rng.random((batch, clients)) < rng.uniform(0.0, 0.6, (batch, 1))
    replacements = rng.normal(0.0, 1.0, (batch, clients, dim)) * np.sqrt(dim) * rng.uniform(0.3, 4.0, (batch, 1, 1))
    tight = rng.random(batch) < 0.25
    direction = unit_vectors(rng, (batch,), dim)
    step = ON_SPHERE * radius[:, None] * direction
    swap = tight[:, None] & replaced
    points = np.where(swap[..., None], (centre + step)[:, None, :], cloud["points"])
    replacements = np.where(swap[..., None], (centre - step)[:, None, :], replacements)
    return {**cloud, "points": points, "replacements": replacements, "replaced": replaced}


def ball_around_one_cluster(
    rng: np.random.Generator, batch: int, cluster_size: int, others: int, attackers: int, dim: int
) -> Instance:
    """A cluster whose threshold ball, at every round, holds exactly its own points
    (and ``attackers`` edge attackers): ``honest[B, n_i + n_o, d]`` with the cluster
    first, ``in_cluster[B, n_i + n_o]``, ``centre[B, d]`` (the start), ``radius[B]``,
    ``direction[B, d]`` (the attackers' ``u``) and ``attackers[B]``.

    With ``q = attackers / n_i <= 1`` every centre stays within ``reach = max(s,
    q tau)`` of the cluster mean (``s``: the start's offset), since each step is a
    convex combination of the previous offset and ``q tau u``.  The cluster's points
    lie within ``tau - reach`` of its mean, the other points farther than ``tau +
    reach`` from it, so the ball never changes its membership."""
    if attackers > cluster_size:
        raise ValueError(f"the edge attacker needs beta <= delta: {attackers} attackers for {cluster_size} points")
    share = attackers / cluster_size
    mean = rng.normal(0.0, 2.0, (batch, dim))
    radius = rng.uniform(0.5, 2.0, batch)
    offset = radius * rng.uniform(0.0, 0.9, batch)
    reach = np.maximum(offset, share * radius)
    spread = (radius - reach) * rng.uniform(0.0, 0.95, batch)
    raw = rng.normal(0.0, 1.0, (batch, cluster_size, dim))
    raw = raw - raw.mean(axis=1, keepdims=True)
    largest = np.linalg.norm(raw, axis=-1).max(axis=1)
    scale = np.divide(spread, largest, out=np.zeros_like(spread), where=largest > 0)
    cluster = mean[:, None, :] + raw * scale[:, None, None]
    distance = (radius + reach)[:, None] * (1.05 + 2.0 * rng.random((batch, others)))
    far = mean[:, None, :] + distance[..., None] * unit_vectors(rng, (batch, others), dim)
    centre = mean + offset[:, None] * unit_vectors(rng, (batch,), dim)
    in_cluster = np.zeros((batch, cluster_size + others), dtype=bool)
    in_cluster[:, :cluster_size] = True
    return {
        "honest": np.concatenate([cluster, far], axis=1),
        "in_cluster": in_cluster,
        "centre": centre,
        "radius": radius,
        "direction": unit_vectors(rng, (batch,), dim),
        "attackers": np.full(batch, attackers),
    }


def quadratic_clusters(
    rng: np.random.Generator, batch: int, clients: int, clusters: int, dim: int, condition: float = 10.0
) -> Instance:
    """Lemma 1's setting: ``f_j(x) = 1/2 (x - c_k)^T H_j (x - c_k)`` for client ``j``
    in cluster ``k = clusters[j]`` (round robin, so no cluster is empty).
    ``hessians[B, N, d, d]`` with eigenvalues uniform in ``[1, kappa]``, ``kappa``
    log-uniform in ``[1, condition]``; ``optima[B, K, d]`` standard normal;
    ``point[B, d]`` near the optimum of client 0's cluster (log-uniform distance)."""
    kappa = np.exp(rng.uniform(0.0, np.log(condition), batch))
    eigenvalues = rng.uniform(1.0, kappa[:, None, None], (batch, clients, dim))
    optima = rng.standard_normal((batch, clusters, dim))
    distance = 10.0 ** rng.uniform(-3.0, 1.0, batch)
    point = optima[:, 0] + distance[:, None] * unit_vectors(rng, (batch,), dim)
    return {
        "hessians": symmetric_with_spectrum(rng, eigenvalues),
        "optima": optima,
        "clusters": np.broadcast_to(np.arange(clients) % clusters, (batch, clients)).copy(),
        "point": point,
    }


def convex_quadratics(rng: np.random.Generator, batch: int, dim: int) -> Instance:
    """``f(x) = 1/2 x^T H x + b^T x`` with ``H`` positive semidefinite (a zero
    eigenvalue in a quarter of them): ``hessian[B, d, d]``, ``linear[B, d]``,
    ``point[B, d]``, and a step ``eta[B]`` in ``(0, 1/L]`` (``1/L`` in a quarter)."""
    eigenvalues = rng.uniform(0.0, 1.0, (batch, dim)) * 10.0 ** rng.uniform(-1.0, 2.0, (batch, 1))
    flat = rng.random(batch) < 0.25
    eigenvalues[flat, 0] = 0.0
    eigenvalues[:, -1] = np.maximum(eigenvalues[:, -1], 1e-3)
    hessian = symmetric_with_spectrum(rng, eigenvalues)
    smoothness = np.linalg.eigvalsh(hessian)[:, -1]
    fraction = np.where(rng.random(batch) < 0.25, 1.0, rng.uniform(1e-3, 1.0, batch))
    return {
        "hessian": hessian,
        "linear": rng.normal(0.0, 1.0, (batch, dim)),
        "point": rng.normal(0.0, 2.0, (batch, dim)),
        "eta": fraction / smoothness,
    }


def logistic_problems(rng: np.random.Generator, batch: int, samples: int, dim: int) -> Instance:
    """Mean logistic loss ``(1/n) sum log(1 + exp(-y_s a_s^T w))``: ``features[B, n,
    d]``, ``labels[B, n]`` in ``{-1, 1}``, ``point[B, d]`` and ``step_fraction[B]``
    (``eta = step_fraction / L``; 1 in a quarter)."""
    features = rng.normal(0.0, 1.0, (batch, samples, dim)) * 10.0 ** rng.uniform(-1.0, 1.0, (batch, 1, 1))
    return {
        "features": features,
        "labels": rng.choice([-1.0, 1.0], (batch, samples)),
        "point": rng.normal(0.0, 1.0, (batch, dim)) * 10.0 ** rng.uniform(-2.0, 1.0, (batch, 1)),
        "step_fraction": np.where(rng.random(batch) < 0.25, 1.0, rng.uniform(1e-3, 1.0, batch)),
    }


def finite_distributions(rng: np.random.Generator, batch: int, atoms: int, dim: int, uniform: bool = False) -> Instance:
    """Distributions on ``atoms`` points: ``values[B, m, d]`` and ``probabilities[B,
    m]`` (Dirichlet(1), or equal weights with ``uniform``)."""
    values = rng.normal(0.0, 1.0, (batch, atoms, dim)) * 10.0 ** rng.uniform(-1.0, 1.0, (batch, 1, 1))
    weights = np.full((batch, atoms), 1.0 / atoms) if uniform else rng.dirichlet(np.ones(atoms), batch)
    return {"values": values, "probabilities": weights}


def thresholded_distributions(rng: np.random.Generator, batch: int, atoms: int, dim: int) -> Instance:
    """A finite distribution of points ``z`` around a centre ``v`` with a radius
    ``tau`` (the clipped points of Threshold-Clustering's proof): ``values[B, m, d]``
    at distance ``U(0, 2) tau`` from ``centre[B, d]``, ``probabilities[B, m]``,
    ``radius[B]``."""
    centre = rng.normal(0.0, 1.0, (batch, dim))
    radius = rng.uniform(0.5, 2.0, batch)
    distance = radius[:, None] * rng.uniform(0.0, 2.0, (batch, atoms))
    values = centre[:, None, :] + distance[..., None] * unit_vectors(rng, (batch, atoms), dim)
    return {
        "values": values,
        "probabilities": rng.dirichlet(np.ones(atoms), batch),
        "centre": centre,
        "radius": radius,
    }


# ------------------------------------------------------------------ negative controls
#
# Each sampler below breaks exactly one hypothesis of one statement (or feeds a broken
# algorithm), on instances chosen so that the statement must fail on them; each
# docstring says why it must.

#: The second entropy word of every control stream (see :func:`control_rng`).
CONTROL_STREAM = 1


def control_rng(seed: int) -> np.random.Generator:
    """The negative control's own stream at a check's ``seed``: independent of the
    real instances' ``default_rng(seed)``, so adding a control changes none of them."""
    return np.random.default_rng([seed, CONTROL_STREAM])


def one_sided_clouds(rng: np.random.Generator, batch: int, clients: int, dim: int) -> Instance:
    """The one-step bound's control instances (for the step *without* its threshold):
    ``k`` points inside the ball (``k`` uniform in ``0..N-1``) and the other ``m = N -
    k`` beyond it along one direction ``u``, each at a projection ``(z - v_0) . u >
    tau (1 + 2k/m)`` (plus noise orthogonal to ``u``).  The mean step then moves the
    centre by more than ``(1/N)(m tau + 2k tau - k tau) = tau``, while the bound allows
    ``(k / N) tau``.  Keys as :func:`point_clouds`."""
    centre = rng.normal(0.0, 0.5, (batch, dim))
    radius = rng.uniform(0.3, 2.5, batch) * np.sqrt(dim)
    inside_count = rng.integers(0, clients, batch)
    outside = np.arange(clients)[None, :] >= inside_count[:, None]
    share = 2.0 * inside_count / (clients - inside_count)
    direction = unit_vectors(rng, (batch,), dim)
    inner = unit_vectors(rng, (batch, clients), dim) * (
        radius[:, None] * ON_SPHERE * rng.uniform(0.0, 1.0, (batch, clients)))[..., None]
    along = radius[:, None] * (1.0 + share[:, None] + rng.uniform(0.1, 1.0, (batch, clients)))
    noise = rng.normal(0.0, 1.0, (batch, clients, dim)) * radius[:, None, None]
    noise -= np.einsum("bnd,bd->bn", noise, direction)[..., None] * direction[:, None, :]
    outer = along[..., None] * direction[:, None, :] + noise
    points = centre[:, None, :] + np.where(outside[..., None], outer, inner)
    return {"points": points, "centre": centre, "radius": radius}


def pushed_replacements(rng: np.random.Generator, batch: int, clients: int, dim: int) -> Instance:
    """The replacement bound's control instances (for the step *without* its
    threshold): :func:`point_clouds` with at least one point replaced, each replacement
    its point shifted by ``s_j u`` (one direction ``u``, ``s_j`` uniform in ``(2.5 tau,
    4 tau)``).  The mean step's outputs then differ by ``(1/N) sum s_j > 2.5 beta tau``,
    above the bound ``2 beta tau``.  Keys as :func:`replacement_pairs`."""
    cloud = point_clouds(rng, batch, clients, dim)
    replaced = rng.random((batch, clients)) < rng.uniform(0.0, 0.6, (batch, 1))
    replaced[np.arange(batch), rng.integers(0, clients, batch)] = True
    shift = cloud["radius"][:, None] * rng.uniform(2.5, 4.0, (batch, clients))
    direction = unit_vectors(rng, (batch,), dim)
    replacements = cloud["points"] + shift[..., None] * direction[:, None, :]
    return {**cloud, "replacements": replacements, "replaced": replaced}


def with_intruder(rng: np.random.Generator, ball: Instance) -> Instance:
    """:func:`ball_around_one_cluster`'s instance plus one point of no cluster inside
    the first ball, at ``v_0 + (tau / 2) w`` (``w`` a random direction): the ball no
    longer holds exactly cluster ``i``.  The first step then takes ``(z_o - v_0) / N``
    more than the contraction identity, a residual of ``1 / (2N)`` times ``tau``."""
    batch, dim = ball["centre"].shape
    intruder = ball["centre"] + 0.5 * ball["radius"][:, None] * unit_vectors(rng, (batch,), dim)
    outside = np.zeros((batch, 1), dtype=bool)
    return {**ball, "honest": np.concatenate([ball["honest"], intruder[:, None, :]], axis=1),
            "in_cluster": np.concatenate([ball["in_cluster"], outside], axis=1)}


def ball_with_excess_attackers(rng: np.random.Generator, batch: int, cluster_size: int, attackers: int,
                               dim: int) -> Instance:
    """The edge attacker's control instances: ``attackers > cluster_size`` (``beta >
    delta_i``, where Lemma 6 needs ``beta <= delta_i``), a cluster within ``tau / 4`` of
    its mean, the start at the mean and no other points.  Keys as
    :func:`ball_around_one_cluster`.

    While the ball holds the cluster and the attackers, the identity puts ``v_l`` at
    ``mean + d_l u`` with ``d_l = (beta / delta)(1 - (1 - delta)^l) tau``, which exceeds
    ``tau`` once ``(1 - delta)^l < 1 - delta / beta`` (:func:`rounds_to_leave`): the
    predicted fixed point lies outside the ball.  Some cluster point has then left the
    ball, and the step misses the identity by ``(1/N) sum (z - v)`` over the points
    that left, each with a component over ``tau / 2`` along ``-u``."""
    if attackers <= cluster_size:
        raise ValueError(f"the control needs beta > delta: {attackers} attackers for {cluster_size} points")
    mean = rng.normal(0.0, 2.0, (batch, dim))
    radius = rng.uniform(0.5, 2.0, batch)
    raw = rng.normal(0.0, 1.0, (batch, cluster_size, dim))
    raw = raw - raw.mean(axis=1, keepdims=True)
    largest = np.linalg.norm(raw, axis=-1).max(axis=1)
    spread = 0.25 * radius * rng.uniform(0.0, 1.0, batch)
    scale = np.divide(spread, largest, out=np.zeros_like(spread), where=largest > 0)
    return {
        "honest": mean[:, None, :] + raw * scale[:, None, None],
        "in_cluster": np.ones((batch, cluster_size), dtype=bool),
        "centre": mean,
        "radius": radius,
        "direction": unit_vectors(rng, (batch,), dim),
        "attackers": np.full(batch, attackers),
    }


def rounds_to_leave(cluster_size: int, attackers: int) -> int:
    """The first ``l`` with ``d_l = (beta / delta)(1 - (1 - delta)^l) tau > tau`` for
    :func:`ball_with_excess_attackers` (``beta > delta``): by then the cluster's mean is
    outside the ball, so some cluster point is."""
    total = cluster_size + attackers
    delta, beta = cluster_size / total, attackers / total
    return int(np.floor(np.log(1.0 - delta / beta) / np.log(1.0 - delta))) + 1


def mislabelled_clusters(rng: np.random.Generator, batch: int, clients: int, clusters: int, dim: int) -> Instance:
    """Lemma 1's setting with its shared optimum broken: :func:`quadratic_clusters`
    whose client 0, labelled cluster 0, has the optimum of cluster ``k`` (uniform in
    ``1..K-1``): ``minimisers[B, N]`` indexes each client's optimum in ``optima``
    (``clusters`` elsewhere).  ``point`` is ``x_k*``, where ``f_0`` and cluster ``k``'s
    losses all have zero gradient.  Needs ``clients > clusters >= 2`` so that cluster
    0 keeps a client with its own optimum."""
    if not clients > clusters >= 2:
        raise ValueError(f"need clients > clusters >= 2, got {clients} clients and {clusters} clusters")
    family = quadratic_clusters(rng, batch, clients, clusters, dim)
    moved_to = rng.integers(1, clusters, batch)
    minimisers = family["clusters"].copy()
    minimisers[:, 0] = moved_to
    return {**family, "minimisers": minimisers, "point": family["optima"][np.arange(batch), moved_to]}


def steep_quadratic_steps(rng: np.random.Generator, batch: int, dim: int) -> Instance:
    """The descent step's control instances: :func:`convex_quadratics` with the step
    ``eta`` uniform in ``(2/L, 4/L)`` (the descent lemma needs ``eta <= 1/L``) and the
    linear term set so that the gradient at ``point`` is a nonzero multiple of the top
    eigenvector (``g^T H g = L ||g||^2``).  Then ``f(x - eta g) = f(x) - eta ||g||^2 (1 -
    eta L / 2) > f(x) - eta/2 ||g||^2``."""
    family = convex_quadratics(rng, batch, dim)
    hessian, point = family["hessian"], family["point"]
    eigenvalues, vectors = np.linalg.eigh(hessian)
    top = vectors[..., -1]
    size = rng.choice([-1.0, 1.0], batch) * 10.0 ** rng.uniform(-1.0, 1.0, batch)
    linear = size[:, None] * top - np.einsum("bij,bj->bi", hessian, point)
    return {**family, "linear": linear, "eta": rng.uniform(2.0, 4.0, batch) / eigenvalues[:, -1]}


def misclipped_distributions(rng: np.random.Generator, batch: int, atoms: int, dim: int) -> Instance:
    """The clipped point's control instances: :func:`thresholded_distributions` with
    its first atom outside the ball (so some mass is clipped) and a clipping *target*
    ``target[B, d]`` other than ``v``, at ``U(2.5, 3.5) tau`` from it (a broken clipping:
    A.1 clips to ``v``).  Every atom lies within ``2 tau`` of ``v``, so moving the
    clipped mass to the target raises ``E||y - v||^2`` above ``E||z - v||^2``."""
    family = thresholded_distributions(rng, batch, atoms, dim)
    centre, radius = family["centre"], family["radius"]
    values = family["values"].copy()
    values[:, 0] = centre + (radius * rng.uniform(1.05, 2.0, batch))[:, None] * unit_vectors(rng, (batch,), dim)
    target = centre + (radius * rng.uniform(2.5, 3.5, batch))[:, None] * unit_vectors(rng, (batch,), dim)
    return {**family, "values": values, "target": target}
