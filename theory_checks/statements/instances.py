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
