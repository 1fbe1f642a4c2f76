"""Rate studies on the separated-momenta family of
:mod:`theory_checks.separated_instance`, where the momentum-separation hypothesis
holds at every round: Momentum-Clustering against Werner et al.'s Thm 3.4 (eq. 28),
PFL-TC (Option 1) against the workshop paper's Thm 3 (eq. 4) and PDL-TC against its
Thm 4.

Measured, as in :mod:`theory_checks.scaling_rates`: ``(1/T) sum_t mean_i ||grad
f_i(x_{i,t-1})||^2`` over the clients with their full local gradients, averaged over
the repeats (different batch seeds), and the hypotheses on the runs themselves.  Each
horizon ``T`` starts the clients ``R_T = h eta T`` up their ramps, so ``F_0`` grows
like ``T`` (the module docstring of the instance says why any such family must);
every bound is evaluated with that ``F_0``, and the exponent it claims along the
family is the fitted slope of its own right-hand side (0 to rounding: both the
measured quantity and the bounds stay flat).  Every method runs at the radius
``sqrt(delta sqrt(alpha) rho Delta)`` of Thm 3.4 (A.5) and eq. (27)'s rounds: the
workshop's proof prints its radius as ``tau^2 = sqrt(delta (c^2 + rho^2)) Delta /
rho`` (A.1, line 263), which has the units of a length, not of a squared length, so
the main paper's radius stands in for it.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Callable, Literal

import numpy as np

import defenses
from theory_checks import bounds
from theory_checks.scaling_common import Budget, ScalingStudy, Sweep, assemble
from theory_checks.scaling_rates import HorizonPaths, average_gradient_norm, horizon_paths, run_hypotheses
from theory_checks.separated_instance import (
    CLUSTERS,
    SEPARATED_BUDGETS,
    SeparatedProblem,
    SeparatedSizes,
    separated_problem,
)

Method = Literal["mc", "pfl_tc", "pdl_tc"]
# rhs(problem, horizons, gaps, paths) -> the bound at every horizon (constant 1)
Bound = Callable[[SeparatedProblem, np.ndarray, np.ndarray, list[HorizonPaths]], np.ndarray]


def _sigma_rho_separation(problem: SeparatedProblem, paths: list[HorizonPaths]) -> tuple[np.ndarray, np.ndarray]:
    """Per horizon: ``rho = sigma / sqrt(b)`` of the batch gradients clustered (the
    largest spread visited) and the smallest gradient separation visited."""
    rho = np.sqrt([path.noise / problem.sizes.batch_size for path in paths])
    return rho, np.array([path.separation for path in paths])


def mc_bound(problem: SeparatedProblem, horizons: np.ndarray, gaps: np.ndarray,
             paths: list[HorizonPaths]) -> np.ndarray:
    """Thm 3.4 with ``F_0`` and ``L`` explicit (:func:`theory_checks.bounds.descent_rate`)."""
    rho, separation = _sigma_rho_separation(problem, paths)
    error = bounds.clustering_error(rho, separation, problem.sizes.clients_per_cluster)
    return bounds.descent_rate(error, problem.smoothness, gaps, horizons)


def pfl_tc_bound(problem: SeparatedProblem, horizons: np.ndarray, gaps: np.ndarray,
                 paths: list[HorizonPaths]) -> np.ndarray:
    """The workshop's eq. (4) with ``C = 1``."""
    rho, separation = _sigma_rho_separation(problem, paths)
    return bounds.workshop_pfl_rate(problem.smoothness, gaps, rho, problem.sizes.clients_per_cluster, CLUSTERS,
                                    separation, horizons)


def pdl_tc_bound(problem: SeparatedProblem, horizons: np.ndarray, gaps: np.ndarray,
                 paths: list[HorizonPaths]) -> np.ndarray:
    """The workshop's Thm 4 with ``C = 1``."""
    rho, separation = _sigma_rho_separation(problem, paths)
    return bounds.workshop_pdl_rate(problem.smoothness, gaps, rho, problem.sizes.clients_per_cluster,
                                    separation, horizons)


BOUNDS: dict[Method, tuple[str, Bound]] = {
    "mc": ("thm3.4-separated", mc_bound),
    "pfl_tc": ("ws-thm3", pfl_tc_bound),
    "pdl_tc": ("ws-thm4", pdl_tc_bound),
}


def separated_rate_study(method: Method, budget: Budget = "quick", sizes: SeparatedSizes | None = None,
                         seed: int = 0) -> ScalingStudy:
    """``method`` on the separated family at every horizon of the budget (repeat ``r``
    uses federation seed ``1000 seed + r``), against its theorem's bound."""
    chosen = sizes or SEPARATED_BUDGETS[budget]
    problem = separated_problem(chosen)
    theorem, bound = BOUNDS[method]
    options = problem.clustering_options(method)
    learning_rate = float(options["lr"])
    clusters = problem.cluster_ids.numpy()
    horizons = np.array(chosen.horizons, dtype=float)
    errors = np.empty((len(chosen.horizons), chosen.repeats))
    paths = []
    for row, horizon in enumerate(chosen.horizons):
        runs = []
        for repeat in range(chosen.repeats):
            federation = problem.federation(horizon, seed * 1000 + repeat, learning_rate)
            algorithm = defenses.build(method, federation, options)
            algorithm.snapshot_records = False
            errors[row, repeat], path = average_gradient_norm(algorithm, federation, horizon)
            runs.append(path)
        paths.append(horizon_paths(horizon, runs, clusters))
    gaps = np.array([problem.optimality_gap(horizon, learning_rate) for horizon in chosen.horizons])
    rhs = bound(problem, horizons, gaps, paths)
    claimed = float(np.polyfit(np.log(horizons), np.log(rhs), 1)[0])
    sweep = Sweep("T", tuple(float(h) for h in horizons), errors, tuple(float(r) for r in rhs), claimed)
    settings = {**asdict(chosen), "method": method, "L": problem.smoothness, "sigma_sample": problem.sample_sigma,
                "rho": problem.batch_sigma, "delta": problem.cluster_fraction, **options,
                "F0": [float(g) for g in gaps], "paths": [asdict(p) for p in paths], "seed": seed}
    names = ("Assumption 6", "Assumption 9") if method == "mc" else ("Assumption 5", "Assumption 6")
    hypotheses = run_hypotheses(problem.cluster_fraction, chosen.batch_size, paths, momentum=True,
                                start_note="every model (the ramps' noise does not depend on x)", names=names)
    findings = {"claimed_exponent_along_family": claimed,
                "learning_rate_constant": _learning_rate_constant(problem, learning_rate, horizons, gaps, paths),
                "other_radii": _other_radii(problem, method, options, chosen, seed, float(rhs[-1]))}
    return assemble(theorem, [sweep], settings, seed, findings, hypotheses)


def _other_radii(problem: SeparatedProblem, method: Method, options: dict[str, Any], sizes: SeparatedSizes,
                 seed: int, bound: float) -> dict[str, dict[str, float]]:
    """The largest horizon again at two more radii, same seeds: the proof's ``tau^2 =
    c^2 + delta rho Delta`` (A.5, eq. 213) with ``c`` at its largest after round 1,
    ``alpha (1 - alpha)`` (the distance ``E m`` moves in round 2, where the warm start
    lags most), and the practical quantile radius ``q = delta / 2``; each row's mean
    error and its ratio to the bound."""
    alpha, rho = problem.sizes.alpha, problem.batch_sigma
    lag = alpha * (1 - alpha)
    radii: dict[str, Any] = {
        "eq213": math.sqrt(lag**2 + problem.cluster_fraction * rho * math.sqrt(2.0)),
        "quantile": {"policy": "quantile", "q": problem.cluster_fraction / 2},
    }
    horizon = max(sizes.horizons)
    out = {}
    for name, radius in radii.items():
        errors = []
        for repeat in range(sizes.repeats):
            federation = problem.federation(horizon, seed * 1000 + repeat, float(options["lr"]))
            algorithm = defenses.build(method, federation, {**options, "radius": radius})
            algorithm.snapshot_records = False
            errors.append(average_gradient_norm(algorithm, federation, horizon)[0])
        mean = float(np.mean(errors))
        out[name] = {"T": horizon, "mean_error": mean, "ratio_to_bound": mean / bound}
    return out


def _learning_rate_constant(problem: SeparatedProblem, learning_rate: float, horizons: np.ndarray,
                            gaps: np.ndarray, paths: list[HorizonPaths]) -> list[float]:
    """``c`` in ``eta = c sqrt(F_0 / (L T E))`` per horizon (Thm 3.4's second branch;
    below 1 means the ``eta = 1/L`` branch is the binding one)."""
    rho, separation = _sigma_rho_separation(problem, paths)
    error = bounds.clustering_error(rho, separation, problem.sizes.clients_per_cluster)
    return [float(c) for c in learning_rate / np.sqrt(gaps / (problem.smoothness * horizons * error))]
