"""The workshop paper's statements (Werner et al., "threshold-clustering" workshop
version, ``papers/threshold-clustering-workshop.txt``), checked with the same rules as
the main paper's: hypotheses measured first, the claim's statistic (an expectation:
means over repeats), a verdict only on instances that meet every hypothesis.

* ``ws-thm1`` (Thm 1, proof A.2 via A.1's Lemma 2): Threshold-Clustering's error
  ``<= (34 C + 48 C / n_i) rho^3 / Delta + 4 rho^2 / n_i`` under Assumption 1, which
  the workshop states in expectation (``E||v_{k,0} - E x_i||^2 <= rho^2``).  The
  two-point clusters of :func:`theory_checks.scaling_clustering.two_point_random_start`
  meet it with a uniformly random member as the start, and the expected error stays
  near ``rho^2`` while the right-hand side tends to 0: the ratio grows without limit,
  whatever ``C``.
* ``ws-thm2`` (Thm 2, proof A.3): the last displayed step, ``E||mu1_hat - mu1||^2 >=
  rho^4 / (4 Delta^2)`` for ``Delta^2 >= 2 rho^2``, has the main paper's algebra slip
  (``thm3.2-constant``); the statement's ``Omega`` holds with ``1/8``
  (``thm3.2-corrected`` checks that constant on the same construction).
* ``ws-thm3`` / ``ws-thm4`` (Thm 3, eq. 4, PFL-TC Option 1; Thm 4, PDL-TC): the
  explicit bounds on the separated-momenta family, where the workshop's Assumption 6
  (momenta of different clusters ``Delta`` apart at every round) holds
  (:mod:`theory_checks.scaling_separated`).  On the regression instance of the main
  paper's rate studies that assumption fails as Assumption 9 does for ``thm3.4``.
"""

from __future__ import annotations

from typing import Any

from theory_checks import bounds
from theory_checks.scaling_clustering import CLUSTERING_BUDGETS, CLUSTERS, SIGMA, two_point_random_start
from theory_checks.statements.false_claims import two_point_constant_check
from theory_checks.statements.rates import DIVERGENCE_FACTOR, separated_check
from theory_checks.statements.registry import Budget, register, statement_seed
from theory_checks.types import CheckResult, Hypothesis

# The start's error in expectation over a uniformly random member (Assumption 1 at
# its limit, c^2 = rho^2), which the proof's radius formula takes as c^2.
START_ERROR = SIGMA**2


def _radius(separation: float) -> float:
    return float(bounds.workshop_clustering_radius(separation, 1.0 / CLUSTERS, SIGMA, START_ERROR))


def _rounds(separation: float, n: int) -> int:
    return bounds.workshop_clustering_rounds(SIGMA, separation, n, CLUSTERS * n)


def proof_radius_conditions(separation: float) -> tuple[float, float]:
    """A.1's conditions on the radius (line 264), as ratios that must be ``<= 1``:
    ``(tau^2 + c^2 + rho^2) / (Delta^2 / 12)`` and ``tau^2 / (Delta^2 / 18)``."""
    tau2 = _radius(separation) ** 2
    return (tau2 + START_ERROR + SIGMA**2) / (separation**2 / 12), tau2 / (separation**2 / 18)


def _thm1_hypotheses(family: list[dict[str, Any]]) -> tuple[Hypothesis, ...]:
    """Assumptions 1-3 and the proof's radius conditions on the two-point family
    (exact: a two-point cluster's variance is ``(1 - p) rho^2``, which is also the
    expected squared distance of a uniformly random member from the mean)."""
    variance = max(1 - entry["rare_probability"] for entry in family)
    spread = max(max(proof_radius_conditions(entry["separation"])) for entry in family)
    where = f"Delta = {min(entry['separation'] for entry in family):g}"
    return (
        Hypothesis("Assumption 1", "E||v_0 - E x_i||^2 / rho^2 <= 1 over a uniformly random member", variance, 1.0,
                   variance <= 1.0, "every instance"),
        Hypothesis("Assumption 2", "E||x_i - E x_i||^2 / rho^2 <= 1", variance, 1.0, variance <= 1.0,
                   "every instance"),
        Hypothesis("Assumption 3", "||E x_i - E x_j|| / Delta >= 1 (the bound is continuous in Delta, so the "
                   "strict > Delta' holds for every Delta' < Delta at no cost)", 1.0, 1.0, True, "by construction"),
        Hypothesis("radius conditions (A.1)", "max((tau^2 + c^2 + rho^2) / (Delta^2/12), tau^2 / (Delta^2/18)) <= 1",
                   spread, 1.0, spread <= 1.0, where),
    )


@register(
    "ws-thm1",
    "workshop Thm 1; proof A.2 (A.1's Lemma 2, start in expectation)",
    "Threshold-Clustering with l of Thm 1 and A.1's radius: E||v_{k_i} - E x_i||^2 <= (34C + 48C/n_i) rho^3/Delta "
    "+ 4 rho^2/n_i under Assumptions 1-3 (Assumption 1 in expectation, as the workshop states it)",
    "up_to_constant",
)
def check_ws_thm1(budget: Budget, seed: int = 0) -> CheckResult:
    """The two-point random-start family, restricted to the instances meeting the
    proof's radius conditions, against Thm 1's right-hand side with ``C = 1``."""
    sizes = CLUSTERING_BUDGETS[budget]
    chosen = tuple((n, separation) for n, separation in sizes.random_start_family
                   if max(proof_radius_conditions(separation)) <= 1.0)
    family = two_point_random_start(chosen, seed=seed,
                                    rhs=lambda rho, separation, n: float(bounds.workshop_clustering_error(rho, separation, n)),
                                    rounds=_rounds, radius=_radius)
    hypotheses = _thm1_hypotheses(family)
    ratios = [entry["ratio_to_rhs"] for entry in family]
    growing = len(ratios) >= 2 and all(later >= DIVERGENCE_FACTOR * earlier for earlier, later in zip(ratios, ratios[1:]))
    listed = ", ".join(f"{ratio:.3g}" for ratio in ratios)
    details = {"family": family, "notes": f"E error / rhs (C = 1) = {listed} as (n, Delta/rho) grow"}
    if any(not hypothesis.holds for hypothesis in hypotheses):
        return CheckResult("ws-thm1", "hypotheses_unmet", instances=len(family), hypotheses=hypotheses,
                           evidence="; ".join(h.describe() for h in hypotheses if not h.holds), details=details)
    if not growing:
        return CheckResult("ws-thm1", "inconclusive", instances=len(family), hypotheses=hypotheses,
                           evidence=f"E error / rhs = {listed}: not growing by {DIVERGENCE_FACTOR:g}x a step",
                           details=details)
    counterexample = {
        "reason": "a start at a two-point cluster's rare value never moves, so the expected error over a uniformly "
                  "random start (Assumption 1 met) is about rho^2 while Thm 1's right-hand side tends to 0; the "
                  "ratio grows whatever C is, since C multiplies only the rho^3/Delta term",
        **family[-1], "ratios_along_family": ratios,
    }
    return CheckResult("ws-thm1", "fails", instances=len(family), counterexample=counterexample,
                       hypotheses=hypotheses, details=details,
                       evidence=f"E error / rhs (C = 1) = {listed} along the two-point family, every instance meeting "
                                f"Assumptions 1-3 and A.1's radius conditions")


@register(
    "ws-thm2",
    "workshop Thm 2, proof A.3 (last step)",
    "A.3's two-point mixture has E||mu1_hat - mu1||^2 >= rho^4 / (4 Delta^2) when Delta^2 >= 2 rho^2",
    "false_as_printed",
    provenance="the main paper's slip (thm3.2-constant) in A.3: rho^2 p / (4 (1 - p)) is rewritten with p / (1 - p) "
               "= (S - Delta) / Delta instead of (S - Delta) / (S + Delta), S = sqrt(4 rho^2 + Delta^2); the "
               "statement's Omega(rho^4/Delta^2) holds with the constant 1/8 (thm3.2-corrected)",
)
def check_ws_thm2(budget: Budget, seed: int = 0) -> CheckResult:
    return two_point_constant_check("ws-thm2", statement_seed(404, seed), budget)


@register(
    "ws-thm3",
    "workshop Thm 3, eq. (4); Assumption 6 met",
    "PFL-TC (Option 1) with eta <= 1/(3L): (1/T) sum_t E||grad f_i(x_{i,t-1})||^2 <= eq. (4) "
    "(2 sqrt(120 C L F_0 sigma^2 / (n_i T)) + ... + 6 L F_0 / T)",
    "up_to_constant",
)
def check_ws_thm3(budget: Budget, seed: int = 0) -> CheckResult:
    """PFL-TC on the separated family against eq. (4) with ``C = 1``."""
    return separated_check("pfl_tc", budget, seed)


@register(
    "ws-thm4",
    "workshop Thm 4; Assumption 6 met",
    "PDL-TC with eta <= 1/(3L): (1/T) sum_t E||grad f_i(x_{i,t-1})||^2 <= 2 sqrt(96 C L F_0 sigma^2 / (n_i T)) "
    "+ (1968 L^1.5 sigma^3/Delta)^(1/5) (2 F_0/T)^(4/5) + ... + 6 L F_0 / T",
    "up_to_constant",
)
def check_ws_thm4(budget: Budget, seed: int = 0) -> CheckResult:
    """PDL-TC on the separated family against Thm 4's bound with ``C = 1``."""
    return separated_check("pdl_tc", budget, seed)

