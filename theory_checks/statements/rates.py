"""Werner et al.'s rates as scaling checks: Thm 3.1 (eq. 14, under each reading of its
start), Thm 3.3 (eq. 23) and Thm 3.4 (eq. 28, on the regression instance and on the
separated-momenta family) hold up to hidden constants, so each
check fits the exponent of every swept variable to the mean error over the repeats
(:mod:`theory_checks.scaling`) and gives the verdict of :mod:`theory_checks.verdicts`,
after the theorem's hypotheses are measured on the instances run: a check whose
hypotheses fail reports ``hypotheses_unmet`` and which, instead of a verdict."""

from __future__ import annotations

import dataclasses
from typing import Any

from theory_checks.scaling import ScalingStudy, clustering_study, describe_laws, fc_rate_study, mc_rate_study
from theory_checks.scaling_common import constant_spread
from theory_checks.scaling_separated import separated_rate_study
from theory_checks.statements.registry import Budget, register
from theory_checks.controls import ratio_slack
from theory_checks.types import CheckResult, NegativeControl
from theory_checks.verdicts import rate_status, rate_verdict

# A ratio to the bound that grows by at least this factor at every step of a family of
# instances (each step multiplies n_i and Delta / sigma by 4) is taken as unbounded.
DIVERGENCE_FACTOR = 2.0
# Variables the theorems do not let grow without limit: beta_i is capped by delta_i
# (beta_i <~ delta_i), so a ratio growing in beta stays bounded on its domain.
BOUNDED_VARIABLES = frozenset({"beta"})


def family_of(study: ScalingStudy, variable: str) -> dict[str, Any]:
    """The sweep of ``variable`` as a family of instances: its values, mean errors,
    right-hand sides (constant 1) and their ratios."""
    table = [entry for entry in study.claimed_rhs if entry["variable"] == variable]
    return {
        "variable": variable,
        "values": [entry["x"] for entry in table],
        "mean_errors": [entry["mean_error"] for entry in table],
        "rhs": [entry["rhs"] for entry in table],
        "ratios": [entry["mean_error"] / entry["rhs"] for entry in table],
    }


def _ratio(entry: dict[str, Any]) -> float:
    return entry["mean_error"] / entry["rhs"] if entry["rhs"] > 0 else float("inf")


def largest_point(study: ScalingStudy, variable: str) -> dict[str, Any]:
    """The row of ``study.claimed_rhs`` at the largest swept value of ``variable``."""
    return max((entry for entry in study.claimed_rhs if entry["variable"] == variable), key=lambda entry: entry["x"])


def study_slack(study: ScalingStudy) -> dict[str, Any]:
    """The bound's slack on the study (:func:`theory_checks.controls.ratio_slack`): every
    swept value's mean error / bound (constant 1), and the ratio at the largest value
    of the first swept variable."""
    first = study.claimed_rhs[0]["variable"]
    last = largest_point(study, first)
    return ratio_slack([_ratio(entry) for entry in study.claimed_rhs], _ratio(last), f"{first} = {last['x']:g}")


def rate_result(statement: str, study: ScalingStudy, note: str = "",
                counterexample: dict[str, Any] | None = None, control: NegativeControl | None = None) -> CheckResult:
    """The check's result from a study.  Unmet hypotheses decide the status
    (``hypotheses_unmet``); else a variable whose verdict fails, an infinite constant
    (error where the bound is 0) or ``counterexample`` (a family breaking the bound)
    make it ``fails``, with the family as counterexample; else ``inconclusive`` or
    ``holds_with_constant`` (:func:`theory_checks.verdicts.rate_status`).  A failed or
    undecided check carries no constant.  ``note`` goes to ``details["notes"]``, the
    report's findings.  The negative control is ``control``, else the study's own;
    the slack is :func:`study_slack`."""
    verdicts = {name: rate_verdict(law, study.claimed[name], name in BOUNDED_VARIABLES)
                for name, law in study.laws.items()}
    exponents = {name: (law, study.claimed[name]) for name, law in study.laws.items()}
    status = rate_status(verdicts, study.hypotheses)
    constant = study.constant
    seed = int(study.settings.get("seed", 0))
    instance_verdicts = {sweep.variable: sweep.verdict(seed) for sweep in study.constant_sweeps}
    if status != "hypotheses_unmet":
        failing = [name for name, verdict in verdicts.items() if verdict.verdict == "fails"]
        if counterexample is None and failing:
            counterexample = {"reason": f"{verdicts[failing[0]].direction}: the mean error / bound ratio grows along "
                                        f"{failing[0]}, and every instance meets the hypotheses",
                              **family_of(study, failing[0])}
        if counterexample is None and constant.value == float("inf"):
            table = study.claimed_rhs[constant.decisive] if constant.decisive < len(study.claimed_rhs) else {}
            counterexample = {"reason": "measured error > 0 where the bound's right-hand side is 0 or below", **table}
        wrong = [name for name, verdict in instance_verdicts.items() if verdict.verdict == "fails"]
        if counterexample is None and wrong:
            sweep = next(s for s in study.constant_sweeps if s.variable == wrong[0])
            counterexample = {"reason": f"the bound's dependence on {wrong[0]} is wrong: "
                                        f"{instance_verdicts[wrong[0]].direction} along {wrong[0]} at "
                                        f"T = {sweep.arguments[0]['T']:g}, every instance meeting the hypotheses",
                              **sweep.summary(seed)}
        if counterexample is not None:
            status = "fails"
    evidence = describe_laws(study.laws, study.claimed, BOUNDED_VARIABLES)
    if status == "hypotheses_unmet":
        evidence = "; ".join(hypothesis.describe() for hypothesis in study.hypotheses if not hypothesis.holds)
    elif status == "holds_with_constant":
        evidence += f"; constant C = {constant.value:.3g}"
    control = control if control is not None else study.control

    def with_real(found: NegativeControl) -> NegativeControl:  # the real run's ratio where the control's is read
        if found.real is not None:
            return found
        return dataclasses.replace(found, real=_ratio(largest_point(study, found.details["variable"])))

    control = None if control is None else with_real(control)
    clustering = tuple(with_real(found) for found in study.controls)
    slack = study_slack(study)
    if status == "holds_with_constant":
        evidence += f"; {bound_ratio_text(study)}"
        if study.constant_sweeps:
            evidence += f"; {instances_text(study, instance_verdicts)}"
        if control is not None:
            evidence += f"; control ({control.description}) {control.ratio:.3g}"
        for found in clustering:
            evidence += f", {found.description} {found.ratio:.3g}"
    details = {"rows": study.rows, "claimed_rhs": study.claimed_rhs, "settings": study.settings,
               "findings": study.findings, "notes": note, "fitted_constant": constant,
               "constant_sweeps": [sweep.summary(seed) for sweep in study.constant_sweeps],
               **spread_of(study)}
    return CheckResult(statement, status, instances=len(study.claimed_rhs),
                       constant=constant if status == "holds_with_constant" else None, exponents=exponents,
                       counterexample=counterexample if status == "fails" else None, evidence=evidence,
                       details=details, hypotheses=study.hypotheses, verdicts=verdicts, negative_control=control,
                       slack=slack, clustering_controls=clustering)


def spread_of(study: ScalingStudy) -> dict[str, Any]:
    """The largest over the smallest mean error / bound across the study's instances:
    those of its constant sweeps where it has them, else every swept value (for Thm
    3.1's sweeps, each value an instance), and which it is."""
    if study.constant_sweeps:
        return {"constant_spread": constant_spread(study.constant_sweeps),
                "constant_spread_over": "the admissible instances of the constant sweeps"}
    ratios = [_ratio(entry) for entry in study.claimed_rhs if entry["rhs"] > 0]
    return {"constant_spread": max(ratios) / min(ratios) if ratios and min(ratios) > 0 else None,
            "constant_spread_over": "every swept value"}


def bound_ratio_text(study: ScalingStudy) -> str:
    """The error against the bound actually evaluated (constant 1), at the smallest and
    the largest value of the first swept variable."""
    first = study.claimed_rhs[0]["variable"]
    table = sorted((entry for entry in study.claimed_rhs if entry["variable"] == first), key=lambda e: e["x"])
    return (f"error / bound (as evaluated) {_ratio(table[0]):.3g} at {first} = {table[0]['x']:g}, "
            f"{_ratio(table[-1]):.3g} at {first} = {table[-1]['x']:g}")


def instances_text(study: ScalingStudy, verdicts: dict[str, Any]) -> str:
    """The constant across the instance sweep: its spread, the error's exponent along
    each swept constant against the formula's, and for a co-varying size (one that
    moves several of the bound's arguments) the exponent of error / bound against 0."""
    seed = int(study.settings.get("seed", 0))
    parts = {False: [], True: []}
    for sweep in study.constant_sweeps:
        law = sweep.law(seed, of_ratio=sweep.covarying)
        slope = "undecided" if law is None else f"{law.exponent:+.2f} [{law.low:+.2f}, {law.high:+.2f}]"
        parts[sweep.covarying].append(f"{sweep.variable} {slope} vs {sweep.claimed:+.2f} "
                                      f"({verdicts[sweep.variable].verdict})")
    spread = constant_spread(study.constant_sweeps)
    texts = [f"across instances error / bound spreads {spread:.3g}x"]
    if parts[False]:
        texts.append("the error's exponent along " + ", ".join(parts[False]))
    if parts[True]:
        texts.append("the exponent of error / bound along " + ", ".join(parts[True]))
    return "; ".join(texts)


THM31_CLAIM = ("Threshold-Clustering with tau ~ sqrt(delta_i sigma Delta) and l of eq. (13): "
               "E||v - E z_i||^2 <~ sigma^2/n_i + sigma^3/Delta + beta_i sigma Delta")
THM31_BETA_NOTE = ("beta: the edge attacker's exact fixed point mean + (beta/delta) tau u has squared error "
                   "beta^2 sigma Delta / delta, under beta sigma Delta while beta <= delta; separation_gaussian: what "
                   "is left of the start after eq. (13)'s rounds, then the sigma^2/n_i floor (sigma^3/Delta unseen)")


@register(
    "thm3.1",
    "Thm 3.1, eq. (14); start in expectation (A.1 step (v))",
    THM31_CLAIM + ", reading the proof's E||v_0 - E z_i||^2 <= sigma^2 over a random start (FC's Alg. 2 line 6)",
    "up_to_constant",
)
def check_thm31(budget: Budget, seed: int = 0) -> CheckResult:
    """Sweeps of ``n_i``, ``beta_i`` and ``Delta`` from a uniformly random member of
    the cluster; on two-point clusters the expected error over that start stays near
    ``sigma^2`` while eq. (14) tends to 0: the family of
    :func:`theory_checks.scaling_clustering.two_point_random_start` shows the ratio
    growing without limit."""
    study = clustering_study(budget, seed=seed, reading="expectation")
    family = study.findings["two_point_random_start"]
    ratios = [instance["ratio_to_rhs"] for instance in family]
    growing = len(ratios) >= 2 and all(later >= DIVERGENCE_FACTOR * earlier for earlier, later in zip(ratios, ratios[1:]))
    note = (f"{THM31_BETA_NOTE}; two-point clusters, uniformly random start: E error / rhs = "
            f"{', '.join(f'{r:.3g}' for r in ratios)} as (n, Delta/sigma) grow"
            + (" (unbounded: no constant covers it)" if growing else ""))
    counterexample = None
    if growing:
        counterexample = {
            "reason": "a start at a two-point cluster's rare value never moves (error (1 - p)^2 h^2), so the "
                      "expected error over a uniformly random start is (1 - p) sigma^2 while eq. (14)'s "
                      "right-hand side tends to 0; every instance meets Delta >~ sigma/delta_i and "
                      "E||v_0 - E z_i||^2 <= sigma^2",
            **family[-1],
            "ratios_along_family": ratios,
        }
    return rate_result("thm3.1", study, note, counterexample)


@register(
    "thm3.1-deterministic",
    "Thm 3.1, eq. (14); a fixed start within sigma",
    THM31_CLAIM + ", reading the start as a fixed point within sigma of E z_i",
    "up_to_constant",
)
def check_thm31_deterministic(budget: Budget, seed: int = 0) -> CheckResult:
    """The same sweeps from ``E z_0 + sigma u`` (the two-point clusters from their
    bulk, ``sigma^2 / h`` from the mean)."""
    study = clustering_study(budget, seed=seed, reading="deterministic")
    family = study.findings["two_point_random_start"]
    ratios = [instance["error_from_bulk"] / instance["rhs"] for instance in family]
    note = (f"{THM31_BETA_NOTE}; two-point clusters from the bulk: error / rhs = "
            f"{', '.join(f'{r:.3g}' for r in ratios)} as (n, Delta/sigma) grow")
    return rate_result("thm3.1-deterministic", study, note)


@register(
    "thm3.3",
    "Thm 3.3, eq. (23)",
    "Federated-Clustering: (1/T) sum_t E||grad f_i(x_{i,t-1})||^2 "
    "<~ sqrt(max(1, A^2) (sigma^2/n_i + sigma^3/Delta + beta_i sigma Delta) / T)",
    "up_to_constant",
)
def check_thm33(budget: Budget, seed: int = 0) -> CheckResult:
    """FC on the synthetic linear regression against ``T`` (claimed ``T^{-1/2}``)."""
    study = fc_rate_study(budget, seed=seed)
    floor = study.findings["independent_data_floor"]
    note = (f"eq. (23) hides F_0 and L in its constant; with each client's own noisy data A = inf and the "
            f"left side floors at {floor['floor']:.3g}")
    return rate_result("thm3.3", study, note)


@register(
    "thm3.4",
    "Thm 3.4, eq. (28)",
    "Momentum-Clustering: (1/T) sum_t E||grad f_i(x_{i,t-1})||^2 <~ sqrt((sigma^2/n_i + sigma^3/Delta) / T) "
    "+ beta_i sigma Delta / (T^{1/4} (sigma^2/n_i + sigma^3/Delta)^{1/4})",
    "up_to_constant",
)
def check_thm34(budget: Budget, seed: int = 0) -> CheckResult:
    """MC on the synthetic linear regression against ``T``, clean (claimed
    ``T^{-1/2}``) and under the ball-edge attack (claimed ``T^{-1/4}``; at the quick
    budget only while the clean runs' hypotheses hold)."""
    study = mc_rate_study(budget, seed=seed)
    radius = study.findings["quantile_radius"]
    runs = study.settings["repeats"] * len(study.settings["horizons"])
    merged = {key: sum(run["merged_runs"] for run in study.settings[key])
              for key in ("runs", "runs_attacked") if key in study.settings}
    note = ("the theorem's radius sqrt(delta sqrt(alpha) rho Delta): momenta start at 0 and vanish at convergence, "
            "so Assumption 9 cannot hold for all t (thm3.4-separated runs MC on a family where it does); runs ending "
            f"with all honest clients on one centre: {merged['runs']}/{runs} clean")
    if radius:
        largest = list(radius)[-1]
        theory, quantile = radius[largest]["theory_radius_mean_error"], radius[largest]["quantile_radius_mean_error"]
        note += (f", {merged['runs_attacked']}/{runs} attacked; the practical quantile radius q = delta/2 gives mean "
                 f"error {quantile:.3g} against {theory:.3g} at {largest}")
    else:
        note += ("; the attacked sweep (ball-edge attack, claimed T^-1/4) and the quantile-radius runs are not run at "
                 "this budget once the clean runs' hypotheses fail, which decides the status (the full budget runs "
                 "them)")
    return rate_result("thm3.4", study, note)


SEPARATED_NOTE = ("the one-sided separated family (theory_checks.separated_instance): opposed ramps (a model "
                  "shared by both clusters stalls where the anchored slope is 1/sqrt 2); the "
                  "runner cluster starts h eta T + m up its ramp so that the momenta stay separated at every round "
                  "(Assumption 9; the workshop's Assumption 6), the anchored cluster, whose clients are measured, "
                  "starts at a fixed height, so F_0 does not grow with T and the bound decays; each theorem's own "
                  "learning rate at that F_0; negative controls: a frozen model, and the method without its "
                  "clustering (no clustering, a wrong fixed partition, a random assignment each round); the "
                  "instance's constants sigma, F_0, L, n_i, Delta, delta_0 and K swept at one horizon")


def separated_note(study: ScalingStudy) -> str:
    """:data:`SEPARATED_NOTE` with the study's step sizes, the weight of ``L F_0 / T`` in
    the bound and the other radii."""
    options = study.settings["options"]
    share = study.findings["descent_term_share"]
    steps = ", ".join(f"{row['lr']:.3g}" for row in options)
    rows = "".join(f"; {name} radius: mean error {row['mean_error']:.3g} (ratio {row['ratio_to_bound']:.3g}) at "
                   f"T = {row['T']}" for name, row in study.findings["other_radii"].items())
    return (f"{SEPARATED_NOTE}; F_0 = {study.settings['F0']:.3g}, eta = {steps} at T = "
            f"{', '.join(str(row['T']) for row in options)}; the L F_0 / T term is {share[0]:.0%} of the bound at "
            f"the smallest T and {share[-1]:.0%} at the largest; the frozen model's squared gradient is "
            f"{study.findings['frozen_error']:.3g} at every T{rows}")


def separated_check(method: str, budget: Budget, seed: int) -> CheckResult:
    """``method``'s study on the separated family as the result of its statement (the
    one :data:`theory_checks.scaling_separated.BOUNDS` names)."""
    study = separated_rate_study(method, budget, seed=seed)
    return rate_result(study.theorem, study, separated_note(study))


@register(
    "thm3.4-separated",
    "Thm 3.4, eq. (28), Assumption 9 met",
    "Momentum-Clustering on a family meeting Assumption 9 at every round: (1/T) sum_t E||grad f_i(x_{i,t-1})||^2 "
    "<~ sqrt(L F_0 (sigma^2/n_i + sigma^3/Delta) / T) + L F_0 / T (eq. 28 with F_0, L explicit)",
    "up_to_constant",
)
def check_thm34_separated(budget: Budget, seed: int = 0) -> CheckResult:
    """MC at Thm 3.4's radius on the separated family against ``T``."""
    return separated_check("mc", budget, seed)
