"""Rate studies on the one-sided separated family of
:mod:`theory_checks.separated_instance`, where the momentum-separation hypothesis
holds at every round and the anchored cluster's ``F_0`` does not grow with ``T``:
Momentum-Clustering against Werner et al.'s Thm 3.4 (eq. 28), PFL-TC (Option 1)
against the workshop paper's Thm 3 (eq. 4) and PDL-TC against its Thm 4.

Measured, as in :mod:`theory_checks.scaling_rates`: ``(1/T) sum_t mean_i ||grad
f_i(x_{i,t-1})||^2`` over the anchored cluster's clients with their full local
gradients, averaged over the repeats (different batch seeds), and the hypotheses on
the runs themselves.  Every bound is a formula of named constants (``T``, ``L``,
``F_0``, ``rho``, ``n_i``, ``Delta``) evaluated with the anchored cluster's ``F_0`` and
the noise and separation the runs visited; the exponent it claims along ``T`` is read
from the formula itself, far past the sweep (its slowest-decaying term's, ``-1/2`` for
all three), so a slip in the formula moves the claim.

Controls.  A frozen model (``x`` stays at ``x_0``), whose measured quantity
``sigmoid(s a)^2`` does not decay, is the sanity control; the three clustering
controls (no clustering, a wrong fixed partition, a random assignment each round:
:mod:`theory_checks.assigned_controls`) run the method's momentum step without its
clustering on the same instances, and must violate a bound about clustering.

The formula, not only its exponent.  The bounds hide an absolute constant, the same
for every admissible instance, so the instance's constants (``sigma``, ``F_0``,
``L``, ``n_i``, ``Delta``, ``delta_i``, ``K``: :data:`SWEPT_CONSTANTS`) are swept over
three values each at one horizon; the ratio error / bound must not grow along any of them.  Every
method runs at the radius ``sqrt(delta sqrt(alpha) rho Delta)`` of Thm 3.4 (A.5) and
eq. (27)'s rounds: the workshop's proof prints its radius as ``tau^2 = sqrt(delta
(c^2 + rho^2)) Delta / rho`` (A.1, line 263), which has the units of a length, not of
a squared length, so the main paper's radius stands in for it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

import numpy as np

import defenses
from theory_checks import bounds
from theory_checks.assigned_controls import ASSIGNMENTS, AssignedMomentum, Assignment, schedule
from theory_checks.controls import rate_control
from theory_checks.scaling_common import (
    BoundFormula,
    Budget,
    ConstantSweep,
    Formula,
    ScalingStudy,
    Sweep,
    assemble,
    evaluate,
)
from theory_checks.scaling_rates import (
    HorizonPaths,
    PathStatistics,
    anchored_error,
    average_gradient_norm,
    horizon_paths,
    run_hypotheses,
)
from theory_checks.separated_instance import (
    SEPARATED_BUDGETS,
    Method,
    SeparatedProblem,
    SeparatedSizes,
    separated_problem,
)
from theory_checks.types import Hypothesis


def mc_formula(c: Mapping[str, np.ndarray]) -> np.ndarray:
    """Thm 3.4 with ``F_0`` and ``L`` explicit (:func:`theory_checks.bounds.descent_rate`)."""
    error = bounds.clustering_error(c["rho"], c["separation"], c["n"])
    return bounds.descent_rate(error, c["L"], c["F0"], c["T"])


def pfl_tc_formula(c: Mapping[str, np.ndarray]) -> np.ndarray:
    """The workshop's eq. (4) with ``C = 1``."""
    return bounds.workshop_pfl_rate(c["L"], c["F0"], c["rho"], c["n"], c["K"], c["separation"], c["T"])


def pdl_tc_formula(c: Mapping[str, np.ndarray]) -> np.ndarray:
    """The workshop's Thm 4 with ``C = 1``."""
    return bounds.workshop_pdl_rate(c["L"], c["F0"], c["rho"], c["n"], c["separation"], c["T"])


#: Each method's statement, bound formula, and the coefficient of ``L F_0 / T`` in it.
BOUNDS: dict[Method, tuple[str, Formula, float]] = {
    "mc": ("thm3.4-separated", mc_formula, 1.0),
    "pfl_tc": ("ws-thm3", pfl_tc_formula, 6.0),
    "pdl_tc": ("ws-thm4", pdl_tc_formula, 6.0),
}
FROZEN = "a frozen model (x stays at x_0: the anchored clients never descend)"
#: Each swept constant's name among the bound's arguments.
CONSTANT_KEYS = {"sigma": "rho", "F0": "F0", "L": "L", "n": "n", "Delta": "separation", "delta": "delta", "K": "K"}
#: Constants the hypotheses bound: delta_i Delta / rho >= 1 caps sigma at delta_i Delta sqrt(b),
#: and delta_i <= 1.
BOUNDED_CONSTANTS = frozenset({"sigma", "delta"})
#: The instance's constants swept beside ``T`` (at :attr:`SeparatedSizes.instance_horizon`),
#: one at a time, each by factors of the size behind it (sigma: the noise; F_0: the
#: anchor a; L: the sharpness; n_i: the clients per cluster; Delta: the runners' slope;
#: delta_i: the runner clusters' clients, 8, 4 and 2 beside the anchored 8; K: the
#: runner clusters, 1, 2 and 4, sharing 8 clients so that delta_0 stays 1/2); the
#: sweep's variable is the constant as the bound reads it (sigma per sample, F_0, L,
#: n_i, the smallest gradient separation the runs visited, delta_0, K).  Noise only
#: goes down, Delta and delta_0 only up: the other way the separation hypothesis
#: (delta_i Delta / rho >= 1) fails within a factor of two.  ``L`` is swept at a fixed
#: ``F_0`` (the anchor moved to keep it); the family is scale-invariant (``y = s x``
#: maps sharpness ``s`` and anchor ``a`` to sharpness 1 and anchor ``s a``, with ``s
#: eta`` unchanged), so its runs see ``L`` and ``F_0`` only through ``L F_0``, as eq.
#: (28) does.
SWEPT_CONSTANTS: dict[str, tuple[float, ...]] = {
    "sigma": (0.25, 0.5, 1.0),
    "F0": (0.5, 1.0, 2.0),
    "L": (0.5, 1.0, 2.0),
    "n": (0.5, 1.0, 2.0),
    "Delta": (1.0, 2.0, 4.0),
    "delta": (1.0, 0.5, 0.25),
    "K": (1.0, 2.0, 4.0),
}


def swept_sizes(sizes: SeparatedSizes, name: str, factor: float) -> SeparatedSizes:
    """``sizes`` with the constant ``name`` of :data:`SWEPT_CONSTANTS` scaled by ``factor``
    (``sizes`` itself at factor 1)."""
    if factor == 1.0:
        return sizes
    if name == "sigma":
        return replace(sizes, noise=factor * float(sizes.noise))
    if name == "F0":
        return replace(sizes, anchor=factor * sizes.anchor)
    if name == "L":  # F_0 = softplus(s a) / s kept: a = softplus^-1(s F_0) / s
        sharpness = factor * sizes.sharpness
        gap = math.log1p(math.exp(sizes.sharpness * sizes.anchor)) / sizes.sharpness
        return replace(sizes, sharpness=sharpness, anchor=math.log(math.expm1(sharpness * gap)) / sharpness)
    if name == "n":
        return replace(sizes, clients_per_cluster=max(1, round(factor * sizes.clients_per_cluster)))
    if name == "Delta":
        return replace(sizes, slope=factor * sizes.slope)
    if name == "delta":
        return replace(sizes, runner_clients=max(1, round(factor * sizes.clients_per_runner)))
    if name == "K":
        return replace(sizes, clusters=1 + round(factor * (sizes.clusters - 1)))
    raise ValueError(f"unknown constant {name!r}: choose from {sorted(SWEPT_CONSTANTS)}")


def bound_arguments(problem: SeparatedProblem, horizon: int, path: HorizonPaths) -> dict[str, float]:
    """The bound's arguments at one horizon: ``L``, the anchored cluster's ``F_0``, ``rho
    = sigma / sqrt(b)`` with the largest spread visited, ``n_i``, the smallest gradient
    separation visited, ``K`` and ``delta_0`` (which the bounds that do not name them
    ignore)."""
    return {"T": float(horizon), "L": problem.smoothness, "F0": problem.optimality_gap(),
            "rho": math.sqrt(path.noise / problem.sizes.batch_size), "n": float(problem.sizes.clients_per_cluster),
            "separation": path.separation, "K": float(problem.clusters), "delta": problem.cluster_fraction}


@dataclass(frozen=True)
class HorizonRuns:
    """One horizon's repeats of a method: their errors, paths, settings, and the
    theorem's hypotheses measured on them."""

    errors: np.ndarray  # [repeats]
    paths: HorizonPaths
    runs: list[PathStatistics]
    options: dict[str, Any]


def horizon_runs(problem: SeparatedProblem, method: Method, horizon: int, seed: int) -> HorizonRuns:
    """``method`` at ``horizon`` (repeat ``r`` uses federation seed ``1000 seed + r``)."""
    options = problem.clustering_options(method, horizon)
    errors, runs = np.empty(problem.sizes.repeats), []
    for repeat in range(problem.sizes.repeats):
        federation = problem.federation(horizon, seed * 1000 + repeat, float(options["lr"]))
        algorithm = defenses.build(method, federation, options)
        algorithm.snapshot_records = False
        errors[repeat], path = average_gradient_norm(algorithm, federation, horizon, problem.anchored)
        runs.append(path)
    paths = horizon_paths(horizon, runs, problem.cluster_ids.numpy(), pooled=True)
    return HorizonRuns(errors, paths, runs, {"T": horizon, **options})


def separated_hypotheses(problem: SeparatedProblem, method: Method, found: list[HorizonRuns]) -> list[Hypothesis]:
    """The theorem's hypotheses on the runs of ``found``: the separation and momentum
    separation (worst horizon), ``alpha`` against ``L eta``, and the start."""
    names = ("Assumption 6", "Assumption 9") if method == "mc" else ("Assumption 5", "Assumption 6")
    hypotheses = run_hypotheses(problem.cluster_fraction, problem.sizes.batch_size, [f.paths for f in found],
                                momentum=True, start_note="every model (the ramps' noise does not depend on x)",
                                names=names)
    hypotheses.append(_momentum_hypothesis(problem, method, [f.options for f in found]))
    starts = [path.split_at_start for f in found for path in f.runs if path.split_at_start is not None]
    if starts:
        share = sum(starts) / len(starts)
        hypotheses.append(Hypothesis(
            "start", "the share of runs whose round-1 centres split the clients by cluster (the start within sigma "
            "of Thm 3.1 that Thm 3.4's clustering inherits; the workshop's Assumption 7)", share, 1.0, share == 1.0,
            f"{len(starts)} runs"))
    return hypotheses


def separated_rate_study(method: Method, budget: Budget = "quick", sizes: SeparatedSizes | None = None,
                         seed: int = 0) -> ScalingStudy:
    """``method`` on the one-sided separated family at every horizon of the budget
    (repeat ``r`` uses federation seed ``1000 seed + r``), against its theorem's bound
    (the exponent it claims along ``T`` read from the formula itself), with a frozen
    model and the three clustering controls (:mod:`theory_checks.assigned_controls`)
    as negative controls, and the instance's constants swept at one horizon
    (:data:`SWEPT_CONSTANTS`)."""
    chosen = (sizes or SEPARATED_BUDGETS[budget]).for_method(method)
    problem = separated_problem(chosen)
    theorem, formula, descent_coefficient = BOUNDS[method]
    horizons = np.array(chosen.horizons, dtype=float)
    found = [horizon_runs(problem, method, horizon, seed) for horizon in chosen.horizons]
    errors = np.stack([f.errors for f in found])
    bound = BoundFormula(formula, "T", tuple(bound_arguments(problem, h, f.paths)
                                             for h, f in zip(chosen.horizons, found)))
    rhs, claimed = evaluate(formula, bound.arguments), bound.claimed()
    sweep = Sweep("T", tuple(float(h) for h in horizons), errors, tuple(float(r) for r in rhs), claimed)
    frozen = np.full(errors.shape, problem.frozen_error())
    control = rate_control(FROZEN, horizons, frozen, rhs, claimed, seed=seed)
    controls = tuple(rate_control(ASSIGNMENTS[assignment], horizons,
                                  assigned_errors(problem, method, assignment, seed), rhs, claimed, seed=seed)
                     for assignment in ASSIGNMENTS)
    settings = {**asdict(chosen), "method": method, "L": problem.smoothness, "sigma_sample": problem.sample_sigma,
                "rho": problem.batch_sigma, "delta": problem.cluster_fraction, "F0": problem.optimality_gap(),
                "options": [f.options for f in found], "paths": [asdict(f.paths) for f in found], "seed": seed}
    hypotheses = separated_hypotheses(problem, method, found)
    descent_share = descent_coefficient * problem.smoothness * problem.optimality_gap() / horizons / rhs
    findings = {"bound_slope_over_sweep": float(np.polyfit(np.log(horizons), np.log(rhs), 1)[0]),
                "claimed_exponent": claimed,
                "descent_term_share": [float(x) for x in descent_share],
                "frozen_error": problem.frozen_error(),
                # two more radii at the largest horizon: information, run on the full budget only
                "other_radii": _other_radii(problem, method, chosen, seed, float(rhs[-1])) if budget == "full" else {}}
    base = found[chosen.horizons.index(chosen.instance_horizon)]
    sweeps = [_constant_sweep(name, chosen, method, formula, seed, base) for name in SWEPT_CONSTANTS]
    return assemble(theorem, [sweep], settings, seed, findings, hypotheses, control=control, controls=controls,
                    bound=bound, constant_sweeps=sweeps)


def assigned_errors(problem: SeparatedProblem, method: Method, assignment: Assignment, seed: int) -> np.ndarray:
    """``[horizons, repeats]``: the anchored clients' error under ``method``'s momentum
    step with ``assignment`` in place of the clustering (same seeds, learning rate and
    ``alpha``)."""
    sizes = problem.sizes
    errors = np.empty((len(sizes.horizons), sizes.repeats))
    for row, horizon in enumerate(sizes.horizons):
        options = problem.clustering_options(method, horizon)
        for repeat in range(sizes.repeats):
            federation = problem.federation(horizon, seed * 1000 + repeat, float(options["lr"]))
            groups = schedule(assignment, problem.cluster_ids, problem.clusters,
                              federation.rng(f"control-{assignment}"))
            first_alpha = options.get("first_alpha")
            algorithm = AssignedMomentum(federation, float(options["lr"]), float(options["alpha"]), groups,
                                         problem.clusters,
                                         first_alpha=None if first_alpha is None else float(first_alpha))
            errors[row, repeat] = anchored_error(algorithm, federation, horizon, problem.anchored)
    return errors


def _constant_sweep(name: str, sizes: SeparatedSizes, method: Method, formula: Formula, seed: int,
                    base: HorizonRuns) -> ConstantSweep:
    """One constant of :data:`SWEPT_CONSTANTS` over its values at the sizes'
    ``instance_horizon`` (the base value's runs are the T sweep's), each instance's
    hypotheses measured on its own runs."""
    horizon = sizes.instance_horizon
    values, errors, arguments, admissible = [], [], [], []
    for factor in SWEPT_CONSTANTS[name]:
        instance = swept_sizes(sizes, name, factor)
        problem = separated_problem(instance)
        runs = base if instance is sizes else horizon_runs(problem, method, horizon, seed)
        entry = bound_arguments(problem, horizon, runs.paths)
        values.append(problem.sample_sigma if name == "sigma" else entry[CONSTANT_KEYS[name]])
        errors.append(runs.errors)
        arguments.append(entry)
        admissible.append(all(h.holds for h in separated_hypotheses(problem, method, [runs])))
    return ConstantSweep.of(name, CONSTANT_KEYS[name], values, np.stack(errors), arguments, admissible, formula,
                            bounded=name in BOUNDED_CONSTANTS)


def _momentum_hypothesis(problem: SeparatedProblem, method: Method, used: list[dict[str, Any]]) -> Hypothesis:
    """The theorems' condition on ``alpha``: ``alpha >~ L eta`` (Thm 3.4, constant 1) or
    ``alpha >= 3 L eta`` (the workshop's proofs), at the worst horizon."""
    factor = 1.0 if method == "mc" else 3.0
    ratios = [(float(row["alpha"]) / (factor * problem.smoothness * float(row["lr"])), row["T"]) for row in used]
    worst, horizon = min(ratios)
    text = "alpha / (L eta) >= 1 (Thm 3.4's alpha >~ L eta, constant 1)" if method == "mc" else \
        "alpha / (3 L eta) >= 1 (the workshop's proofs set alpha >= 3 L eta)"
    return Hypothesis("momentum parameter", text, worst, 1.0, worst >= 1.0, f"T = {horizon}")


def _other_radii(problem: SeparatedProblem, method: Method, sizes: SeparatedSizes, seed: int,
                 bound: float) -> dict[str, dict[str, float]]:
    """The largest horizon again at two more radii, same seeds: the proof's ``tau^2 =
    c^2 + delta rho Delta`` (A.5, eq. 213) with ``c`` at its largest after round 1,
    ``alpha (1 - alpha)`` (the distance ``E m`` moves in round 2, where the warm start
    lags most), and the practical quantile radius ``q = delta / 2``; each row's mean
    error and its ratio to the bound."""
    horizon = max(sizes.horizons)
    options = problem.clustering_options(method, horizon)
    alpha, rho = float(options["alpha"]), problem.batch_sigma
    lag = alpha * (1 - alpha)
    radii: dict[str, Any] = {
        "eq213": math.sqrt(lag**2 + problem.cluster_fraction * rho * problem.separation),
        "quantile": {"policy": "quantile", "q": problem.cluster_fraction / 2},
    }
    out = {}
    for name, radius in radii.items():
        errors = []
        for repeat in range(sizes.repeats):
            federation = problem.federation(horizon, seed * 1000 + repeat, float(options["lr"]))
            algorithm = defenses.build(method, federation, {**options, "radius": radius})
            algorithm.snapshot_records = False
            errors.append(average_gradient_norm(algorithm, federation, horizon, problem.anchored)[0])
        mean = float(np.mean(errors))
        out[name] = {"T": horizon, "mean_error": mean, "ratio_to_bound": mean / bound}
    return out
