"""Convergence rates in ``T`` of Federated-Clustering (Werner et al., Thm 3.3, eq.
22-23) and Momentum-Clustering (Thm 3.4, eq. 27-28) on the synthetic linear
regression of Sec. 4.1.

Measured: ``(1/T) sum_t mean_i ||grad f_i(x_{i,t-1})||^2`` over the honest clients,
with true full local gradients, for the learning rate that the theorems prescribe for
each horizon ``T``.  Claimed exponent in ``T``: -1/2 (and -1/4 for MC's ``beta`` term).

The instance (built by :mod:`theory_checks.scaling_rate_problem`; every choice has a
reason):

* ``noise > 0`` on the targets and batches of ``b`` out of ``m`` samples, float64, so
  the gradients stay stochastic at the optimum.
* Every client of a cluster holds the same data set (its cluster's first client's),
  and draws its own batches.  Then ``f_i`` is the cluster's loss, Assumption 4 holds
  with ``A = 0`` and Assumption 1's iid gradients hold.  With each client's own
  noisy data the local minimisers differ, ``grad f_i`` does not vanish where
  ``grad fbar_i`` does (``A = inf``), and the measured quantity floors at
  ``||grad f_i(xbar*)||^2``: the finding ``independent_data_floor`` computes it.
* ``sigma``: linear regression's per-sample gradient noise grows with ``||x - x*||``
  (no finite bound over all ``x``, Assumption 6), so it is taken at the cluster
  minimisers, where it sets the rate's stochastic term.  ``Delta``: the smallest
  cross-cluster gradient distance ``||grad f_i(x) - grad f_j(x)||`` at the origin
  (near the start) and at the minimisers (Assumption 5 with ``D = 0``).  ``L`` and
  ``mu``: extreme eigenvalues of the clients' Hessians ``A_i^T A_i / m``.
* Learning rate, Thm 3.4 (and the standard choice for Thm 3.3, whose proof instead
  keeps ``eta = 1/L`` and grows the batch with ``T``, eq. 121, which a fixed batch
  below ``m`` rules out): ``eta_T = min(1/L, c sqrt(F_0 / (L T E)))``, ``E =
  rho^2/n + rho^3/Delta``, ``F_0 = f_i(x_0) - f_i*`` (the smallest over the honest
  clients).  The hidden constant ``c`` is set so that ``eta = lr_cap / L`` at the
  smallest ``T``: the ``sqrt`` branch is then the active one on the whole sweep.
  ``lr_cap = 0.2`` rather than 1: at ``eta = 1/L`` (so ``alpha = 1``) MC's messages
  move further than the radius in one round and leave its warm-started centres
  behind; both methods use the same rule.
* FC: radius ``tau = sqrt(delta rho Delta)`` and rounds of eq. (22), ``rho =
  sigma / sqrt(b)`` (Lemma 7).  MC: ``alpha = L eta`` (``alpha >~ L eta``), rounds of
  eq. (27), and the theorem's radius ``sqrt(delta sqrt(alpha) rho Delta)``.  MC's
  momenta start at 0 (eq. 29), so at first they are only ``alpha Delta`` apart, and
  they all tend to 0 as the models converge: Assumption 9's separation cannot hold
  for all ``t``.  With that fixed radius the warm-started centres then merge (for
  good: identical centres stay identical) or lose every point; the finding
  ``quantile_radius`` measures MC with the practical quantile radius (``q = delta /
  2``) at the smallest and largest horizon.
* MC under attack: one Byzantine client per cluster running the ball-edge attack
  (the paper's threat model: just inside the current ball, pushing away).

The hypotheses are measured on the runs themselves (:class:`PathStatistics`):
Assumption 6's ``sigma`` as the largest per-sample gradient spread at any model a run
visits (the bound is evaluated with it, so Assumption 6 holds on the run), Assumption
5's ``Delta`` as the smallest cross-cluster gradient distance at the visited models
(FC's clustering reads ``g_j(x_i)`` at the receiver's model), ``Delta >~ rho /
delta_i`` with ``rho`` the noise of the batch gradients clustered (read with constant
1), and for MC Assumption 9, ``||E m_i,t - E m_j,t|| >= Delta`` for every round, with
the expectation over the repeats.

The repeats use different federation seeds (batches and the initial model); each
repeat is a separate run, as the algorithms are stateful objects.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import torch

import defenses
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.rounds import Stepping, run_rounds
from robust_pfl.engine.types import RoundRecord
from defenses.clustering_algorithms import ALG4_PRINTED_RULES
from theory_checks import bounds
from theory_checks.assigned_controls import ASSIGNMENTS, AssignedMomentum, schedule
from theory_checks.controls import rate_control
from theory_checks.estimators import gradient_noise
from theory_checks.scaling_common import Budget, ScalingStudy, Sweep, assemble
from theory_checks.types import Hypothesis, NegativeControl
from theory_checks.scaling_rate_problem import (
    RATE_BUDGETS,
    RateProblem,
    RateSizes,
    federation_for,
    independent_data_floor,
    learning_rate,
    optimality_gap,
    rate_problem,
)


#: Alg. 4 as printed: the theorems are about it, not about MC's defaults (docs/mc.md).
PRINTED_MC = ALG4_PRINTED_RULES


@dataclass(frozen=True)
class PathStatistics:
    """The constants of Assumptions 5, 6 and 9 on the models one run visited (honest
    clients, their own full data): ``noise`` the largest per-sample gradient spread
    ``mean_s ||g_s(x_i) - grad f_i(x_i)||^2``; ``separation`` the smallest
    ``||grad f_i(x_i) - grad f_j(x_i)||`` over clients ``j`` of other clusters;
    ``momenta`` the honest clients' momenta after every round, ``[T, H, d]``, for a
    method that sends momenta (``Algorithm.sends_momenta``); ``split_at_start``
    whether round 1's assignment put the honest clients of one cluster, and only
    them, on one centre (``None`` for a method without an assignment)."""

    noise: float
    separation: float
    momenta: np.ndarray | None = None
    split_at_start: bool | None = None


class Measured(Stepping, Protocol):
    """What the rate studies run: a defense (``defenses.Algorithm``) or a control
    (:class:`theory_checks.assigned_controls.AssignedMomentum`)."""

    sends_momenta: bool

    def client_models(self) -> torch.Tensor: ...


def average_gradient_norm(algorithm: Measured, federation: Federation, horizon: int,
                          measured: torch.Tensor | None = None) -> tuple[float, PathStatistics]:
    """``(1/T) sum_{t=1}^T mean_i ||grad f_i(x_{i,t-1})||^2`` over honest clients (or the
    honest clients of the ``[N]`` mask ``measured``), with full local gradients (the
    left side of eq. 23 and eq. 28), and the run's :class:`PathStatistics` at the same
    models (every honest client)."""
    honest = federation.honest
    chosen = (measured if measured is not None else torch.ones_like(honest))[honest]
    data = federation.train.select(honest)
    clusters = federation.cluster_ids[honest]
    other = clusters.unsqueeze(0) != clusters.unsqueeze(1)  # [H, H]: j in another cluster than i
    total = torch.zeros((), dtype=torch.float64)
    noise, separation = 0.0, math.inf
    momenta = [] if algorithm.sends_momenta else None

    def before(round_index: int) -> None:
        nonlocal total, noise, separation
        models = algorithm.client_models()[honest]
        cross = federation.objective.cross_gradients(models, data)  # [H models, H clients, d]
        own = torch.diagonal(cross, dim1=0, dim2=1).T  # grad f_i(x_i), [H, d]
        total += own[chosen].square().sum(-1).mean()
        noise = max(noise, gradient_noise(federation.objective, models, data).value)
        distances = (own.unsqueeze(1) - cross).norm(dim=-1)  # [i, j]: at x_i
        separation = min(separation, float(distances[other].min()))

    split: list[bool] = []

    def after(done: int, record: RoundRecord) -> None:
        if momenta is not None:
            momenta.append(record.momenta[honest].numpy().copy())
        if done == 1 and record.assignment is not None:
            split.append(same_partition(record.assignment[honest], clusters))

    run_rounds(algorithm, horizon, before=before, after=after)
    path = PathStatistics(noise, separation, None if momenta is None else np.stack(momenta),
                          split[0] if split else None)
    return float(total) / horizon, path


def anchored_error(algorithm: Measured, federation: Federation, horizon: int, measured: torch.Tensor) -> float:
    """The left side of :func:`average_gradient_norm` alone (``(1/T) sum_t mean_i ||grad
    f_i(x_{i,t-1})||^2`` over the clients of the ``[N]`` mask ``measured``), without the
    path statistics: what a control run is judged on."""
    data = federation.train.select(measured)
    total = torch.zeros((), dtype=torch.float64)

    def before(round_index: int) -> None:
        nonlocal total
        own = federation.objective.paired_gradients(algorithm.client_models()[measured], data)
        total += own.square().sum(-1).mean()

    run_rounds(algorithm, horizon, before=before)
    return float(total) / horizon


def same_partition(assignment: torch.Tensor, clusters: torch.Tensor) -> bool:
    """Whether ``assignment`` groups the clients exactly as ``clusters`` does (up to
    the labels)."""
    together = assignment.unsqueeze(0) == assignment.unsqueeze(1)
    return bool(torch.equal(together, clusters.unsqueeze(0) == clusters.unsqueeze(1)))


def fc_options(problem: RateProblem, eta: float) -> dict[str, Any]:
    """FC's settings of Thm 3.3: radius ``sqrt(delta rho Delta)``, rounds of eq. (22)."""
    tau = float(bounds.clustering_radius(problem.cluster_fraction, problem.batch_sigma, problem.separation))
    rounds = bounds.clustering_rounds(problem.sample_sigma, problem.separation, problem.cluster_fraction,
                                      batch_size=problem.batch_size)
    return {"lr": eta, "radius": tau, "clustering_rounds": rounds}


def mc_options(problem: RateProblem, eta: float, radius: str = "quantile") -> dict[str, Any]:
    """MC's settings of Thm 3.4: ``alpha = L eta``, rounds of eq. (27); the radius is the
    quantile ``delta / 2`` or (``radius="theory"``) ``sqrt(delta sqrt(alpha) rho Delta)``."""
    alpha = min(1.0, problem.smoothness * eta)
    noise = math.sqrt(alpha) * problem.batch_sigma
    if radius == "theory":
        spec: Any = float(bounds.clustering_radius(problem.cluster_fraction, noise, problem.separation))
    else:
        spec = {"policy": "quantile", "q": problem.cluster_fraction / 2}
    rounds = bounds.clustering_rounds(problem.batch_sigma, problem.separation, problem.cluster_fraction, alpha=alpha)
    return {"lr": eta, "alpha": alpha, "radius": spec, "clustering_rounds": rounds, **PRINTED_MC}


def _run(problem: RateProblem, method: str, horizon: int, seed: int, sizes: RateSizes,
         attack: str | None = None, radius: str = "quantile") -> tuple[float, dict[str, Any], PathStatistics]:
    """One run: the measured average, the options used with (MC) ``merged``: whether
    every honest client ends on one centre although there are two or more clusters
    (warm-started centres that met stay together, Alg. 4), and its path statistics."""
    federation = federation_for(problem, seed, attack)
    eta = learning_rate(problem, optimality_gap(problem, federation), horizon, sizes)
    options = fc_options(problem, eta) if method == "fc" else mc_options(problem, eta, radius)
    algorithm = defenses.build(method, federation, options)
    algorithm.snapshot_records = False
    error, path = average_gradient_norm(algorithm, federation, horizon)
    if method == "mc":
        honest_centres = algorithm.assignment[federation.honest].unique().numel()
        options = {**options, "merged": honest_centres == 1 < federation.clusters}
    return error, options, path


@dataclass(frozen=True)
class HorizonPaths:
    """The path statistics of one horizon's repeats: the largest ``noise``, the smallest
    ``separation``, and (MC) the smallest ``||E m_i,t - E m_j,t||`` over rounds and
    cross-cluster pairs with the expectation over the repeats, at round ``round``."""

    horizon: int
    noise: float
    separation: float
    momentum_separation: float | None = None
    round: int | None = None


def horizon_paths(horizon: int, paths: list[PathStatistics], clusters: np.ndarray,
                  pooled: bool = False) -> HorizonPaths:
    """One horizon's :class:`HorizonPaths` from its repeats' paths.  ``E m_i,t`` is the
    mean over the repeats; with ``pooled``, over the repeats and the clients of ``i``'s
    cluster, whose momenta are iid where Assumption 8 holds (clients sharing their
    cluster's data set), an estimate ``n_i`` times less noisy."""
    noise = max(path.noise for path in paths)
    separation = min(path.separation for path in paths)
    if paths[0].momenta is None:
        return HorizonPaths(horizon, noise, separation)
    mean = np.mean([path.momenta for path in paths], axis=0)  # [T, H, d]: E m over the repeats
    if pooled:
        labels = np.unique(clusters)
        members = clusters[:, None] == labels[None, :]  # [H, K]
        centres = np.einsum("thd,hk->tkd", mean, members) / members.sum(0)[None, :, None]
        mean = centres[:, np.searchsorted(labels, clusters)]  # every client: its cluster's mean
    gaps = np.linalg.norm(mean[:, :, None] - mean[:, None, :], axis=-1)  # [T, H, H]
    gaps = np.where(clusters[:, None] != clusters[None, :], gaps, np.inf).min(axis=(1, 2))  # [T]
    return HorizonPaths(horizon, noise, separation, float(gaps.min()), int(gaps.argmin()) + 1)


def _horizon_sweep(problem: RateProblem, method: str, variable: str, claimed: float, sizes: RateSizes,
                   seed: int, rhs, attack: str | None = None, radius: str = "quantile"
                   ) -> tuple[Sweep, list[dict[str, Any]], list[HorizonPaths]]:
    """Errors ``[horizons, repeats]`` (repeat ``r`` uses federation seed ``seed * 1000
    + r``), per horizon the options of repeat 0 (with, for MC, how many repeats ended
    with merged centres) and the path statistics; ``rhs(horizons, paths)`` gives the
    bound at every horizon from its paths' constants."""
    errors = np.empty((len(sizes.horizons), sizes.repeats))
    clusters = problem.task.cluster_ids[~problem.task.byzantine].numpy()
    used, paths = [], []
    for row, horizon in enumerate(sizes.horizons):
        merged = 0
        runs = []
        for repeat in range(sizes.repeats):
            errors[row, repeat], options, path = _run(problem, method, horizon, seed * 1000 + repeat, sizes, attack,
                                                      radius)
            runs.append(path)
            merged += int(options.pop("merged", False))
            if repeat == 0:
                first = {"T": horizon, **options}
        used.append({**first, "merged_runs": merged} if method == "mc" else first)
        paths.append(horizon_paths(horizon, runs, clusters))
    values = tuple(float(h) for h in sizes.horizons)
    bound = rhs(np.array(values), paths)
    return Sweep(variable, values, errors, tuple(float(r) for r in bound), claimed), used, paths


def assigned_controls(problem: RateProblem, method: str, sizes: RateSizes, seed: int,
                      sweep: Sweep) -> tuple[NegativeControl, ...]:
    """The clustering controls of Thm 3.3 / 3.4 on the regression
    (:mod:`theory_checks.assigned_controls`): the method's step with an assignment that
    ignores the clusters in place of its clustering (FC: ``alpha = 1``, each group
    averaging its clients' gradients; MC: its ``alpha = L eta``, momenta from 0 as eq.
    29 starts them), on the sweep's federations (repeat ``r``: seed ``1000 seed + r``)
    with each run's own learning rate; the honest clients' average squared gradient
    judged against the sweep's bound."""
    clusters = problem.task.cluster_ids
    groups = int(clusters.max()) + 1
    controls = []
    for assignment, description in ASSIGNMENTS.items():
        errors = np.empty((len(sizes.horizons), sizes.repeats))
        for row, horizon in enumerate(sizes.horizons):
            for repeat in range(sizes.repeats):
                federation = federation_for(problem, seed * 1000 + repeat)
                eta = learning_rate(problem, optimality_gap(problem, federation), horizon, sizes)
                alpha = 1.0 if method == "fc" else float(mc_options(problem, eta)["alpha"])
                algorithm = AssignedMomentum(federation, eta, alpha, schedule(
                    assignment, clusters, groups, federation.rng(f"control-{assignment}")), groups)
                errors[row, repeat] = anchored_error(algorithm, federation, horizon, federation.honest)
        controls.append(rate_control(f"{description}: {method.upper()}'s step with that grouping", sweep.values,
                                     errors, sweep.rhs, sweep.claimed, seed=seed))
    return tuple(controls)


def run_hypotheses(delta: float, batch: int, paths: list[HorizonPaths], momentum: bool = False,
                   start_note: str = "the start",
                   names: tuple[str, str] = ("Assumption 6", "Assumption 9")) -> list[Hypothesis]:
    """The rate theorems' hypotheses on the runs (worst horizon), for clusters of
    fraction ``delta`` and batches of ``batch``: Assumption 6 holds by the choice of
    ``sigma`` (the largest spread visited; ``start_note`` says where); ``Delta >~ rho /
    delta_i`` with the visited separation and ``rho = sigma / sqrt(b)`` (constant 1);
    with ``momentum``, Assumption 9 (``||E m_i,t - E m_j,t|| >= Delta`` with ``Delta >~
    rho / delta_i``, constant 1).  ``names``: what the paper calls the noise and the
    momentum-separation assumptions (the workshop: Assumptions 5 and 6)."""
    ratios = [(path.separation * delta * math.sqrt(batch / path.noise), path) for path in paths]
    worst, where = min(ratios, key=lambda item: item[0])
    spread = max(path.noise for path in paths)
    out = [
        Hypothesis(f"{names[0]} on the runs", "sigma^2 = the largest per-sample gradient spread at a visited model "
                   "(the bound uses it)", spread, spread, True, start_note),
        Hypothesis("Delta >~ rho/delta_i", "delta_i Delta / rho >= 1 (constant 1), Delta the smallest cross-cluster "
                   "gradient distance at a visited model, rho = sigma / sqrt(b)", worst, 1.0, worst >= 1.0,
                   f"T = {where.horizon}"),
    ]
    if momentum:
        gaps = [(path.momentum_separation * delta * math.sqrt(batch / path.noise), path) for path in paths]
        gap, at = min(gaps, key=lambda item: item[0])
        out.append(Hypothesis(names[1], "delta_i min_t ||E m_i,t - E m_j,t|| / rho >= 1 (Delta >~ rho / "
                              "delta_i, constant 1; E over the repeats)", gap, 1.0, gap >= 1.0,
                              f"T = {at.horizon}, round {at.round}"))
    return out


def _start_note(problem: RateProblem) -> str:
    return f"the start; at the cluster minimisers it is {problem.sample_sigma ** 2:.3g}"


def _problem_settings(problem: RateProblem, sizes: RateSizes) -> dict[str, Any]:
    return {**asdict(sizes), "L": problem.smoothness, "mu": problem.strong_convexity,
            "sigma_sample": problem.sample_sigma, "rho": problem.batch_sigma, "Delta": problem.separation,
            "delta": problem.cluster_fraction, "beta": problem.byzantine_fraction, "E": problem.base_error}


def fc_rate_study(budget: Budget = "quick", sizes: RateSizes | None = None, seed: int = 0) -> ScalingStudy:
    """Thm 3.3: FC's average squared gradient norm against ``T`` (claimed ``T^{-1/2}``),
    and the hidden constant of eq. (23) (``A = 0``, ``beta = 0``, ``sigma`` per sample
    as eq. 23 states it)."""
    chosen = sizes or RATE_BUDGETS[budget]
    problem = rate_problem(chosen)

    def rhs(horizons: np.ndarray, paths: list[HorizonPaths]) -> np.ndarray:
        sigma = np.sqrt([path.noise for path in paths])
        separation = np.array([path.separation for path in paths])
        return bounds.fc_rate(0.0, sigma, separation, problem.cluster_size, 0.0, horizons)

    sweep, used, paths = _horizon_sweep(problem, "fc", "T", -0.5, chosen, seed, rhs)
    floor = independent_data_floor(chosen)
    floor["measured_at_largest_T"] = float(sweep.errors[-1].mean())
    settings = {**_problem_settings(problem, chosen), "runs": used, "paths": [asdict(p) for p in paths], "seed": seed}
    return assemble("thm3.3", [sweep], settings, seed, {"independent_data_floor": floor},
                    run_hypotheses(problem.cluster_fraction, problem.batch_size, paths,
                                   start_note=_start_note(problem)),
                    controls=assigned_controls(problem, "fc", chosen, seed, sweep))


def mc_rate_study(budget: Budget = "quick", sizes: RateSizes | None = None, seed: int = 0) -> ScalingStudy:
    """Thm 3.4: MC's average squared gradient norm against ``T``, without attack
    (claimed ``T^{-1/2}``) and under the ball-edge attack (claimed ``T^{-1/4}`` where
    the ``beta`` term dominates), and the hidden constant of eq. (28).  Where the clean
    runs' hypotheses fail and the sizes say so (``extras_when_unmet`` off: the quick
    budget), the attacked sweep and the quantile-radius runs are left out: the unmet
    hypotheses decide the status."""
    chosen = sizes or RATE_BUDGETS[budget]
    clean = rate_problem(chosen)
    attacked = rate_problem(chosen, chosen.byzantine_per_cluster)

    def rhs_for(problem: RateProblem):
        def rhs(horizons: np.ndarray, paths: list[HorizonPaths]) -> np.ndarray:
            rho = np.sqrt([path.noise / problem.batch_size for path in paths])
            separation = np.array([path.separation for path in paths])
            return bounds.mc_rate(rho, separation, problem.cluster_size, problem.byzantine_fraction, horizons)
        return rhs

    sweep, used, paths = _horizon_sweep(clean, "mc", "T", -0.5, chosen, seed, rhs_for(clean), radius="theory")
    hypotheses = run_hypotheses(clean.cluster_fraction, clean.batch_size, paths, momentum=True,
                                start_note=_start_note(clean))
    settings = {**_problem_settings(clean, chosen), "beta_attacked": attacked.byzantine_fraction,
                "delta_attacked": attacked.cluster_fraction, "runs": used, "paths": [asdict(p) for p in paths],
                "seed": seed}
    controls = assigned_controls(clean, "mc", chosen, seed, sweep)
    if not chosen.extras_when_unmet and not all(hypothesis.holds for hypothesis in hypotheses):
        return assemble("thm3.4", [sweep], settings, seed, {"quantile_radius": {}}, hypotheses, controls=controls)
    attacked_sweep, attacked_used, attacked_paths = _horizon_sweep(
        attacked, "mc", "T_attacked", -0.25, chosen, seed, rhs_for(attacked), attack="ball_edge", radius="theory")
    findings = {"quantile_radius": quantile_radius_runs(clean, chosen, seed, sweep)}
    settings = {**settings, "runs_attacked": attacked_used, "paths_attacked": [asdict(p) for p in attacked_paths]}
    return assemble("thm3.4", [sweep, attacked_sweep], settings, seed, findings, hypotheses, controls=controls)


def quantile_radius_runs(problem: RateProblem, sizes: RateSizes, seed: int, theory_sweep: Sweep) -> dict[str, Any]:
    """MC with the practical quantile radius ``q = delta / 2`` at the smallest and
    largest horizon (same seeds), beside the sweep's mean errors at the theorem's radius
    ``sqrt(delta sqrt(alpha) rho Delta)``."""
    out: dict[str, Any] = {}
    for index in (0, len(sizes.horizons) - 1):
        horizon = sizes.horizons[index]
        runs = [_run(problem, "mc", horizon, seed * 1000 + r, sizes, radius="quantile") for r in range(sizes.repeats)]
        errors = [error for error, _, _ in runs]
        out[f"T={horizon}"] = {"quantile_radius_mean_error": float(np.mean(errors)),
                               "quantile_radius_errors": errors,
                               "quantile_radius_merged_runs": sum(int(options["merged"]) for _, options, _ in runs),
                               "theory_radius_mean_error": float(theory_sweep.errors[index].mean())}
    return out
