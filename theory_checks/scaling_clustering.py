"""Scaling of Threshold-Clustering's error, Werner et al. Thm 3.1 (eq. 13-14):
``E||v - E z_i||^2 <~ sigma^2/n_i + sigma^3/Delta + beta_i sigma Delta`` with radius
``tau = sqrt(delta_i sigma Delta)`` and ``l`` rounds from eq. (13).

Every instance has ``K = 2`` clusters of ``n`` points (``delta_i = n / N``), total
variance ``sigma^2 = 1`` (``sigma^2 = d s^2`` for isotropic noise) and cluster means
``Delta`` apart.  Cluster 0 is the one whose centre is measured; one centre starts at
a random point of it.  The repeats are independent problems run as one batch
``[B, N, d]``.  Four sweeps, each placed where its term of eq. (14) dominates the
right-hand side:

* ``n`` (claimed -1): Gaussian clusters with ``Delta = 10^4 sigma``, so ``sigma^3 /
  Delta = 10^-4`` stays under a tenth of ``sigma^2 / n`` for ``n <= 1000``; the radius
  ``tau ~ 70 sigma`` holds the whole cluster and nothing else, so the centre tends to
  the sample mean (error ``sigma^2 / n``).
* ``beta`` (claimed +1): ``beta N`` Byzantine points re-placed before every round at
  distance ``tau`` from the current centre in one fixed direction ``u`` (the paper's
  threat model, Sec. 3.1.1), ``Delta = 10^3 sigma``, ``n = 128``: ``beta sigma Delta >=
  7`` against ``sigma^2 / n < 0.01`` and ``sigma^3 / Delta = 0.001``.  The edge-attacker statement's exact
  fixed point is ``mean_0 + (beta / delta) tau u``, squared error ``beta^2 sigma Delta / delta``:
  it grows like ``beta^2`` while ``beta <= delta`` keeps it under ``beta sigma Delta``.
* ``separation_gaussian`` (claimed -1): Gaussian clusters, ``Delta / sigma`` from 2
  (the theorem's ``Delta >~ sigma / delta_i``) up, ``n`` large so ``sigma^3 / Delta``
  is the largest term of the bound.  The measured error falls much faster: what is
  left of the start after eq. (13)'s rounds, then the ``sigma^2 / n`` floor;
  mis-clustering decays like ``exp(-Delta^2 / sigma^2)``.
* ``separation_two_point`` (claimed -1): each cluster takes its bulk value with
  probability ``1 - p`` and ``bulk + h e_1`` with probability ``p``, ``h = 2 tau``
  and ``p = sigma^2 / h^2`` (variance ``(1 - p) sigma^2 <= sigma^2``, Assumption 3).
  The rare points always lie outside the ball, so the centre misses ``E z_0 - bulk =
  p h e_1``: error ``p^2 h^2 = sigma^3 / (4 delta Delta)``, the ``sigma^3 / Delta``
  term, with ``n`` large so that ``sigma^2 / n`` is smaller.  The centre starts at the
  bulk.

A start at a rare point never moves: every point within ``tau`` of it has its value,
so from there the error is ``(h - p h)^2 = (1 - p)^2 h^2`` (about ``1022 sigma^2`` at
``Delta = 8``).  Over a uniformly random start of cluster 0 the expected error is
``p (1 - p)^2 h^2 + (1 - p) (p h)^2 = (1 - p) sigma^2``, whatever ``tau``'s constant
and however many rounds, while eq. (14)'s right-hand side tends to 0 as ``n`` and
``Delta / sigma`` grow: :func:`two_point_random_start` measures this along a family of
instances, where the ratio to the bound grows without limit.

Which start the theorem allows decides whether that is a counterexample: step (v) of
the proof (A.1) assumes ``E||v_0 - E z_i||^2 <= sigma^2`` in expectation over the start
(the workshop version says so), which FC's random-member start (Alg. 2, line 6) meets,
and under which the family breaks eq. (14).  From a deterministic start within
``sigma`` of ``E z_i`` the family's error stays ``p^2 h^2``, inside the bound.
:func:`clustering_study` runs both readings (``reading="expectation"``: every sweep
from a uniformly random member of cluster 0, the two-point sweep's error taken exactly
in expectation over that start; ``"deterministic"``: every sweep from ``E z_0 + sigma
u``, the two-point sweep from the bulk) and measures the theorem's hypotheses on the
instances run.  The controls, on the ``separation_gaussian`` sweep's points
(:data:`CONTROLS`): the centre left at its start (sanity: its error stays near
``sigma^2``), and three estimates that ignore the clusters (the mean of every point, of
a wrong fixed partition's group, of a random half), whose errors grow like ``Delta^2``
where eq. (14) decays.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Literal

import numpy as np
import torch
from torch import Tensor

from defenses.threshold_clustering import threshold_clustering
from theory_checks import bounds
from theory_checks.controls import rate_control
from theory_checks.scaling_common import Budget, ScalingStudy, Sweep, assemble
from theory_checks.types import Hypothesis

Reading = Literal["expectation", "deterministic"]
READINGS: tuple[Reading, ...] = ("expectation", "deterministic")
# start(points[B, N, d], n, truth[B, d]) -> [B, d]: where cluster 0's centre starts
Start = Callable[[Tensor, int, Tensor], Tensor]

SIGMA = 1.0
CLUSTERS = 2
# Byzantine points sit this fraction inside the ball's edge: on the edge itself,
# rounding of the distance may put them outside.
EDGE_MARGIN = 1e-9


def _half_octaves(start: float, steps: int) -> tuple[float, ...]:
    """``start * 2^(k/2)`` for ``k < steps`` (half-octave steps)."""
    return tuple(start * 2 ** (k / 2) for k in range(steps))


@dataclass(frozen=True)
class ClusteringSizes:
    """Sizes of the Thm 3.1 sweeps (see the module docstring for the regimes)."""

    dim: int = 10
    repeats: int = 64
    cluster_sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    size_separation: float = 1e4
    byzantine_counts: tuple[int, ...] = (2, 4, 8, 16, 32)
    attacked_cluster_size: int = 128
    attacked_separation: float = 1e3
    gaussian_separations: tuple[float, ...] = _half_octaves(2.0, 9)
    gaussian_cluster_size: int = 1024
    two_point_separations: tuple[float, ...] = (4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
    two_point_cluster_size: int = 4096
    two_point_repeats: int = 4
    random_start_family: tuple[tuple[int, float], ...] = ((256, 8.0), (1024, 32.0), (4096, 128.0), (16384, 512.0))


CLUSTERING_BUDGETS: dict[str, ClusteringSizes] = {
    "quick": ClusteringSizes(),
    "full": ClusteringSizes(
        repeats=256,
        cluster_sizes=(8, 16, 32, 64, 128, 256, 512, 1024),
        byzantine_counts=(2, 4, 8, 16, 32, 64, 96),
        attacked_cluster_size=256,
        gaussian_separations=_half_octaves(2.0, 11),
        gaussian_cluster_size=4096,
        two_point_separations=(4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0),
        two_point_cluster_size=16384,
        random_start_family=((256, 8.0), (1024, 32.0), (4096, 128.0), (16384, 512.0), (65536, 2048.0)),
    ),
}


def clustering_study(budget: Budget = "quick", sizes: ClusteringSizes | None = None, seed: int = 0,
                     reading: Reading = "expectation") -> ScalingStudy:
    """Run the four Thm 3.1 sweeps (module docstring) from the starts that ``reading``
    allows, fit their exponents and the hidden constant of eq. (14), and measure the
    theorem's hypotheses on them.  ``sizes`` overrides the ``budget``'s sizes."""
    if reading not in READINGS:
        raise ValueError(f"reading must be one of {READINGS}, got {reading!r}")
    chosen = sizes or CLUSTERING_BUDGETS[budget]
    generator = torch.Generator().manual_seed(seed)
    direction = _unit(torch.randn(chosen.dim, generator=generator, dtype=torch.float64))
    if reading == "expectation":
        start: Start = lambda points, n, truth: _random_member(points, n, generator)  # noqa: E731
    else:
        start = lambda points, n, truth: truth + SIGMA * direction  # noqa: E731
    # the random control draws from its own stream: the sweeps' points stay those of the seed
    separation, controls = _gaussian_separation_sweep(chosen, generator, start,
                                                      torch.Generator().manual_seed(CONTROL_STREAM + seed))
    sweeps = [
        _size_sweep(chosen, generator, start),
        _byzantine_sweep(chosen, direction, generator, start),
        separation,
        _two_point_sweep(chosen, generator, reading),
    ]
    judged = {name: rate_control(CONTROLS[name], separation.values, errors, separation.rhs, separation.claimed,
                                 variable=separation.variable, seed=seed) for name, errors in controls.items()}
    findings = {"two_point_random_start": two_point_random_start(chosen.random_start_family, seed=seed)}
    settings = {"sigma": SIGMA, "clusters": CLUSTERS, "reading": reading, **asdict(chosen), "seed": seed}
    return assemble("thm3.1", sweeps, settings, seed, findings, clustering_hypotheses(chosen, reading),
                    judged["frozen"], controls=tuple(judged[name] for name in ("none", "wrong", "random")))


def clustering_hypotheses(sizes: ClusteringSizes, reading: Reading) -> tuple[Hypothesis, ...]:
    """Thm 3.1's hypotheses on the study's instances: ``Delta >~ sigma / delta_i`` and
    ``beta_i <~ delta_i`` (read with constant 1), and the start of the ``reading``
    (exact for the constructions: a Gaussian cluster's total variance is ``sigma^2``,
    a two-point cluster's ``(1 - p) sigma^2``; the bulk lies ``p h = sigma^2 / h``
    from the mean)."""
    half = 1.0 / CLUSTERS
    n = sizes.attacked_cluster_size
    separations = [  # (delta_i Delta / sigma, where)
        (half * sizes.size_separation / SIGMA, "the n sweep"),
        *((n / (CLUSTERS * n + count) * sizes.attacked_separation / SIGMA, f"beta sweep, {count} Byzantine")
          for count in sizes.byzantine_counts),
        (half * min(sizes.gaussian_separations) / SIGMA, f"Delta = {min(sizes.gaussian_separations):g}"),
        (half * min(sizes.two_point_separations) / SIGMA, f"two-point Delta = {min(sizes.two_point_separations):g}"),
        *((half * separation / SIGMA, f"family n = {size}") for size, separation in sizes.random_start_family),
    ]
    worst_separation = min(separations)
    attacked = [(count / n, f"{count} Byzantine") for count in sizes.byzantine_counts]  # beta_i / delta_i
    worst_beta = max(attacked)
    out = [
        Hypothesis("Delta >~ sigma/delta_i", "delta_i Delta / sigma >= 1 (constant 1)", worst_separation[0], 1.0,
                   worst_separation[0] >= 1.0, worst_separation[1]),
        Hypothesis("beta_i <~ delta_i", "beta_i / delta_i <= 1 (constant 1)", worst_beta[0], 1.0,
                   worst_beta[0] <= 1.0, worst_beta[1]),
    ]
    if reading == "expectation":
        out.append(Hypothesis("start, A.1 step (v)", "E||v_0 - E z_i||^2 / sigma^2 <= 1 over a random member",
                              1.0, 1.0, True, "Gaussian clusters (total variance sigma^2)"))
    else:
        jump = 2 * float(bounds.clustering_radius(half, SIGMA, min(sizes.two_point_separations)))
        out.append(Hypothesis("start within sigma", "||v_0 - E z_i|| / sigma <= 1 for a fixed start",
                              1.0, 1.0, True, f"Gaussian sweeps (E z + sigma u); two-point bulk {SIGMA / jump:.3g}"))
    return tuple(out)


def clustering_errors(points: Tensor, start: Tensor, truth: Tensor, tau: float, rounds: int,
                      byzantine: int = 0, direction: Tensor | None = None) -> Tensor:
    """``||v_l - E z||^2`` per problem after ``rounds`` rounds of eq. (24) on
    ``points[B, N, d]`` from ``start[B, d]``, against ``truth[B, d]``.

    With ``byzantine = m > 0`` the last ``m`` rows of every problem are rewritten before
    every round to ``v + tau u`` (just inside the ball, ``u = direction``): the paper's
    worst case, one round at a time."""
    centres = start.unsqueeze(1)
    if byzantine == 0:
        centres = threshold_clustering(points, centres, tau, rounds).centres
    else:
        points = points.clone()
        push = (1 - EDGE_MARGIN) * tau * direction
        for _ in range(rounds):
            points[:, -byzantine:] = centres + push
            centres = threshold_clustering(points, centres, tau, 1).centres
    return (centres[:, 0] - truth).square().sum(-1)


def _gaussian_points(cluster_size: int, separation: float, dim: int, extra: int, repeats: int,
                     generator: torch.Generator) -> Tensor:
    """``[repeats, 2 n + extra, d]``: cluster 0 at the origin, cluster 1 at
    ``Delta e_1``, per-coordinate noise ``sigma / sqrt(d)``; ``extra`` zero rows at the
    end (for Byzantine points)."""
    shape = (repeats, CLUSTERS * cluster_size + extra, dim)
    points = torch.randn(shape, generator=generator, dtype=torch.float64) * (SIGMA / math.sqrt(dim))
    points[:, cluster_size : CLUSTERS * cluster_size, 0] += separation
    points[:, CLUSTERS * cluster_size :] = 0.0
    return points


def _random_member(points: Tensor, cluster_size: int, generator: torch.Generator) -> Tensor:
    """A uniformly drawn point of cluster 0 (the first ``n`` rows) per problem."""
    index = torch.randint(cluster_size, (points.shape[0],), generator=generator)
    return points[torch.arange(points.shape[0]), index]


def _size_sweep(sizes: ClusteringSizes, generator: torch.Generator, start: Start) -> Sweep:
    separation, fraction = sizes.size_separation, 1.0 / CLUSTERS
    tau = float(bounds.clustering_radius(fraction, SIGMA, separation))
    rounds = bounds.clustering_rounds(SIGMA, separation, fraction)
    errors = []
    for n in sizes.cluster_sizes:
        points = _gaussian_points(n, separation, sizes.dim, 0, sizes.repeats, generator)
        truth = points.new_zeros(sizes.repeats, sizes.dim)
        errors.append(clustering_errors(points, start(points, n, truth), truth, tau, rounds))
    rhs = bounds.clustering_error(SIGMA, separation, np.array(sizes.cluster_sizes))
    return Sweep("n", tuple(map(float, sizes.cluster_sizes)), torch.stack(errors).numpy(), tuple(rhs), -1.0)


def _byzantine_sweep(sizes: ClusteringSizes, direction: Tensor, generator: torch.Generator, start: Start) -> Sweep:
    n, separation = sizes.attacked_cluster_size, sizes.attacked_separation
    errors, betas, rhs = [], [], []
    for count in sizes.byzantine_counts:
        total = CLUSTERS * n + count
        fraction, beta = n / total, count / total
        tau = float(bounds.clustering_radius(fraction, SIGMA, separation))
        rounds = bounds.clustering_rounds(SIGMA, separation, fraction)
        points = _gaussian_points(n, separation, sizes.dim, count, sizes.repeats, generator)
        truth = points.new_zeros(sizes.repeats, sizes.dim)
        errors.append(clustering_errors(points, start(points, n, truth), truth, tau, rounds, count, direction))
        betas.append(beta)
        rhs.append(float(bounds.clustering_error(SIGMA, separation, n, beta)))
    return Sweep("beta", tuple(betas), torch.stack(errors).numpy(), tuple(rhs), 1.0)


def _gaussian_separation_sweep(sizes: ClusteringSizes, generator: torch.Generator, start: Start,
                               control_generator: torch.Generator) -> tuple[Sweep, dict[str, np.ndarray]]:
    """The sweep, and its controls on the same points (``[levels, repeats]`` squared
    errors of cluster 0's estimate, :data:`CONTROLS`): the centre left at its start, and
    three estimates that ignore the clusters, each about ``(Delta / 2)^2``: the mean of
    every point, of a wrong fixed partition's group (every other point: half of each
    cluster) and of a random half drawn afresh for each problem."""
    n, fraction = sizes.gaussian_cluster_size, 1.0 / CLUSTERS
    errors: list[Tensor] = []
    controls: dict[str, list[Tensor]] = {name: [] for name in CONTROLS}
    for separation in sizes.gaussian_separations:
        tau = float(bounds.clustering_radius(fraction, SIGMA, separation))
        rounds = bounds.clustering_rounds(SIGMA, separation, fraction)
        points = _gaussian_points(n, separation, sizes.dim, 0, sizes.repeats, generator)
        truth = points.new_zeros(sizes.repeats, sizes.dim)
        started = start(points, n, truth)
        errors.append(clustering_errors(points, started, truth, tau, rounds))
        drawn = torch.rand(points.shape[:2], generator=control_generator, dtype=torch.float64) < 0.5  # [B, 2n]
        drawn[:, 0] = True  # never an empty group
        estimates = {
            "frozen": started,
            "none": points.mean(1),
            "wrong": points[:, ::2].mean(1),  # rows 0..n-1 are cluster 0, n..2n-1 cluster 1
            "random": (points * drawn.unsqueeze(-1)).sum(1) / drawn.sum(1, keepdim=True),
        }
        for name, estimate in estimates.items():
            controls[name].append((estimate - truth).square().sum(-1))
    rhs = bounds.clustering_error(SIGMA, np.array(sizes.gaussian_separations), n)
    sweep = Sweep("separation_gaussian", tuple(sizes.gaussian_separations), torch.stack(errors).numpy(),
                  tuple(rhs), -1.0)
    return sweep, {name: torch.stack(found).numpy() for name, found in controls.items()}


#: Offset of the random control's seed from the study's.
CONTROL_STREAM = 7919
#: The controls of Thm 3.1's checks, on the separation_gaussian sweep's points: the
#: frozen centre (sanity) and the three clustering controls.
CONTROLS = {
    "frozen": "the centre left at its start (no clustering round), on the separation_gaussian sweep's points",
    "none": "no clustering (the mean of both clusters' points), on the separation_gaussian sweep's points",
    "wrong": "a wrong fixed partition (every other point: half of each cluster), on the same points",
    "random": "a random assignment (a random half of the points, drawn afresh per problem), on the same points",
}


@dataclass(frozen=True)
class TwoPointClusters:
    """Two clusters whose points take a bulk value, or ``bulk + jump e_1`` with
    probability ``rare`` (the total variance is ``sigma^2``)."""

    points: Tensor  # [B, 2 n, d]
    truth: Tensor  # [B, d], E z_0
    bulk: Tensor  # [B, d], cluster 0's bulk value
    jump: float
    rare: float
    tau: float
    rounds: int


def _two_point_clusters(n: int, separation: float, dim: int, repeats: int,
                        generator: torch.Generator, tau: float | None = None) -> TwoPointClusters:
    """The two-point instance with ``n`` points per cluster at ``Delta = separation``:
    bulks at ``0`` and ``Delta e_2``, so the means ``bulk + p h e_1`` are exactly
    ``Delta`` apart; radius ``tau`` (default Thm 3.1's ``sqrt(delta_i sigma Delta)``)
    and jump ``h = 2 tau``."""
    fraction, dim = 1.0 / CLUSTERS, max(dim, 2)
    if tau is None:
        tau = float(bounds.clustering_radius(fraction, SIGMA, separation))
    jump = 2 * tau
    rare = SIGMA**2 / jump**2
    points = torch.zeros(repeats, CLUSTERS * n, dim, dtype=torch.float64)
    points[:, n:, 1] = separation
    points[..., 0] = jump * (torch.rand(repeats, CLUSTERS * n, generator=generator, dtype=torch.float64) < rare)
    truth = points.new_zeros(repeats, dim)
    truth[:, 0] = rare * jump
    rounds = bounds.clustering_rounds(SIGMA, separation, fraction)
    return TwoPointClusters(points, truth, points.new_zeros(repeats, dim), jump, rare, tau, rounds)


def _two_point_sweep(sizes: ClusteringSizes, generator: torch.Generator, reading: Reading) -> Sweep:
    """From the bulk (``"deterministic"``), or exactly in expectation over a uniformly
    random member of cluster 0 (``"expectation"``: the bulk's error with probability
    ``1 - p``, a rare point's with ``p``)."""
    errors = []
    for separation in sizes.two_point_separations:
        c = _two_point_clusters(sizes.two_point_cluster_size, separation, sizes.dim, sizes.two_point_repeats,
                                generator)
        from_bulk = clustering_errors(c.points, c.bulk, c.truth, c.tau, c.rounds)
        if reading == "expectation":
            from_bulk = (1 - c.rare) * from_bulk + c.rare * clustering_errors(
                c.points, _rare_start(c), c.truth, c.tau, c.rounds)
        errors.append(from_bulk)
    n = sizes.two_point_cluster_size
    rhs = bounds.clustering_error(SIGMA, np.array(sizes.two_point_separations), n)
    return Sweep("separation_two_point", tuple(sizes.two_point_separations), torch.stack(errors).numpy(),
                 tuple(rhs), -1.0)


def two_point_random_start(family: tuple[tuple[int, float], ...], dim: int = 2, seed: int = 0,
                           rhs: Callable[[float, float, int], float] | None = None,
                           rounds: Callable[[float, int], int] | None = None,
                           radius: Callable[[float], float] | None = None) -> list[dict[str, float]]:
    """For every ``(n, Delta)`` of ``family``: Threshold-Clustering's error on the
    two-point instance from the bulk and from a rare point, their mixture ``(1 - p)
    err_bulk + p err_rare`` (the expected error over a uniformly random start of
    cluster 0) and its ratio to a bound's right-hand side: ``rhs(sigma, Delta, n)``
    (default eq. 14 with constant 1), after ``rounds(Delta, n)`` rounds (default eq.
    13's) at radius ``radius(Delta)`` (default Thm 3.1's)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for n, separation in family:
        c = _two_point_clusters(n, separation, dim, 1, generator, None if radius is None else radius(separation))
        steps = c.rounds if rounds is None else rounds(separation, n)
        from_bulk = float(clustering_errors(c.points, c.bulk, c.truth, c.tau, steps)[0])
        from_rare = float(clustering_errors(c.points, _rare_start(c), c.truth, c.tau, steps)[0])
        expected = (1 - c.rare) * from_bulk + c.rare * from_rare
        bound = float(bounds.clustering_error(SIGMA, separation, n) if rhs is None else rhs(SIGMA, separation, n))
        out.append({"n": n, "separation": separation, "sigma": SIGMA, "tau": c.tau, "rounds": steps,
                    "rare_probability": c.rare, "error_from_bulk": from_bulk, "error_from_rare_point": from_rare,
                    "expected_error_random_start": expected, "rhs": bound, "ratio_to_rhs": expected / bound})
    return out


def _rare_start(clusters: TwoPointClusters) -> Tensor:
    """A start at cluster 0's rare value, ``bulk + h e_1``."""
    start = clusters.bulk.clone()
    start[:, 0] = clusters.jump
    return start


def _unit(vector: Tensor) -> Tensor:
    return vector / vector.norm()
