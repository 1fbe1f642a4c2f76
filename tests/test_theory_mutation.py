"""The checker tested by mutation: perturb a bound (halve its constant, drop a term, slip a
square root, change a power, flip a sign, leave a constant out) or the algorithm (no
clustering, a wrong partition, a random assignment) and the verdict must turn where
the perturbed claim is false or says nothing, and stay where it is still true.  A
checker whose verdict did not move with its bound would not be checking the bound.

The rate mutations re-judge one measured study with another bound formula
(theory_checks.scaling_common.reformulated: the same runs, the formula's values and
claimed exponent, every control judged again) or another algorithm's measurements
(remeasured); the exact ones evaluate the perturbed claim on the same instances as
the unperturbed one, with the statement's own negative control."""

from __future__ import annotations

import numpy as np
import pytest

from dataclasses import fields

from theory_checks import bounds
from theory_checks.assigned_controls import ASSIGNMENTS
from theory_checks.controls import finalised, margin_control
from theory_checks.scaling_common import reformulated, remeasured
from theory_checks.scaling_separated import assigned_errors, mc_formula
from theory_checks.separated_instance import SeparatedSizes, separated_problem
from theory_checks.statements import instances
from theory_checks.statements.clustering_steps import one_step_move_sides, one_round
from theory_checks.statements.false_claims import two_point_margin
from theory_checks.statements.rates import rate_result
from theory_checks.statements.search import TOLERANCE, exact_verdict

# the module reads the separated family's session fixture: one pytest-xdist worker
# computes it for these and the family's own test (pyproject: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("separated_mc_study")

SIZE_FIELDS = {field.name for field in fields(SeparatedSizes)}

# -- a rate: Thm 3.4 on the one-sided separated family ---------------------------------------
#
# Every bound mutation changes the *formula* (theory_checks.scaling_common.reformulated):
# the bound's values along T and at every instance of the constant sweeps, and the
# exponent it claims, read from the formula as the check reads the real one.


@pytest.fixture
def mc_study(separated_mc_study):
    """MC on the separated family, four horizons, two repeats (conftest)."""
    return separated_mc_study


def judged(study) -> str:
    return finalised(rate_result("thm3.4-separated", study)).status


def leading(c):
    """eq. (28)'s leading term sqrt(L F_0 E / T), E = rho^2/n + rho^3/Delta."""
    return np.sqrt(c["L"] * c["F0"] * bounds.clustering_error(c["rho"], c["separation"], c["n"]) / c["T"])


def descent(c):
    """The L F_0 / T term."""
    return c["L"] * c["F0"] / c["T"]


def test_the_unperturbed_bound_holds_with_every_control_violated(mc_study):
    result = finalised(rate_result("thm3.4-separated", mc_study))
    assert result.status == "holds_with_constant"
    assert result.negative_control is not None and result.negative_control.violated
    assert {c.description for c in result.clustering_controls} == set(ASSIGNMENTS.values())
    assert all(c.violated for c in result.clustering_controls)


def test_the_formula_reproduces_the_study(mc_study):
    """Re-judging with the study's own formula changes nothing: the mutations below
    differ from it only by the mutation."""
    again = reformulated(mc_study, mc_formula)
    assert judged(again) == "holds_with_constant"
    assert again.constant.value == pytest.approx(mc_study.constant.value, rel=1e-12)
    assert again.claimed["T"] == pytest.approx(-0.5, abs=1e-3)


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_a_rescaled_constant_leaves_the_verdict_and_scales_the_constant(mc_study, factor):
    """The bound hides its constant: halving or doubling it must not change the verdict,
    only the fitted C (by 1 / factor)."""
    mutated = reformulated(mc_study, lambda c: factor * mc_formula(c))
    assert judged(mutated) == "holds_with_constant"
    assert mutated.constant.value == pytest.approx(mc_study.constant.value / factor, rel=1e-9)


def test_a_bound_ten_times_too_tight_survives_as_a_constant_ten_times_larger(mc_study):
    """The surviving mutation (docs/theory_checks.md): eq. (28) hides an absolute
    constant, so a factor common to every instance is the constant; the report shows C
    (here about 10), which is the only place such a slip can be seen."""
    mutated = reformulated(mc_study, lambda c: 0.1 * mc_formula(c))
    assert judged(mutated) == "holds_with_constant"
    assert mutated.constant.value == pytest.approx(10 * mc_study.constant.value, rel=1e-9)


@pytest.mark.parametrize("name, formula, expected", [
    # without sqrt(L F_0 E / T) the bound decays like 1/T: MC's error (about T^-1/2) outgrows it
    ("the leading term dropped", descent, "fails"),
    # sqrt(L F_0 E) / T: the square root closed before the division
    ("sqrt(L F_0 E) / T", lambda c: leading(c) / np.sqrt(c["T"]) + descent(c), "fails"),
    ("a bound decaying like T^-1.5", lambda c: mc_formula(c) * (c["T"] / 64.0) ** -1.0, "fails"),
    ("a flipped sign", lambda c: -mc_formula(c), "fails"),
    # F_0 left out: along the F_0 sweep the error grows like F_0^0.5 and the bound not at all
    ("F_0 left out", lambda c: mc_formula({**c, "F0": np.ones_like(c["F0"])}), "fails"),
    # L left out (at a fixed F_0, the L sweep moves L F_0): the same along L
    ("L left out", lambda c: mc_formula({**c, "L": np.ones_like(c["L"])}), "fails"),
    # a bound growing like T^+1/2 is met by the frozen model and every clustering control
    ("a bound growing like T^+1/2", lambda c: mc_formula(c) * (c["T"] / 64.0), "vacuous"),
    # a 1/K factor (as if the error shrank with the number of clusters): flat along K
    ("a 1/K factor", lambda c: mc_formula(c) / c["K"], "fails"),
    # a 1/Delta factor on the whole bound: the error falls far slower along Delta
    ("a 1/Delta factor", lambda c: mc_formula(c) / c["separation"], "fails"),
])
def test_a_slip_in_the_formula_turns_the_status(mc_study, name, formula, expected):
    assert judged(reformulated(mc_study, formula)) == expected, name


def test_a_formula_without_its_f0_fails_through_the_f0_sweep(mc_study):
    """The T sweep alone cannot see F_0 (it is fixed along it): the failure comes from
    the instance sweep, and says which constant."""
    result = finalised(rate_result("thm3.4-separated",
                                   reformulated(mc_study, lambda c: mc_formula({**c, "F0": np.ones_like(c["F0"])}))))
    assert result.verdicts["T"].verdict != "fails"
    assert "dependence on F0 is wrong" in result.counterexample["reason"]


@pytest.mark.parametrize("constant, key, mutate", [
    ("K", "K", lambda c: mc_formula(c) / c["K"]),
    ("Delta", "separation", lambda c: mc_formula(c) / c["separation"]),
])
def test_a_wrong_dependence_on_k_or_delta_fails_through_its_own_sweep(mc_study, constant, key, mutate):
    """K and Delta are fixed along T: only their instance sweeps can see a wrong
    dependence on them, and the failure names the constant."""
    result = finalised(rate_result("thm3.4-separated", reformulated(mc_study, mutate)))
    assert result.status == "fails" and result.verdicts["T"].verdict != "fails"
    assert f"dependence on {constant} is wrong" in result.counterexample["reason"]


@pytest.mark.parametrize("factor", ["delta", "1/delta"])
def test_a_power_of_delta_survives_as_delta_is_bounded(mc_study, factor):
    """The surviving mutation of delta_0 (docs/theory_checks.md): delta_0 <= 1, and the
    separation hypothesis keeps it above rho / Delta, so along the delta sweep a ratio
    that grows is covered by the constant and one that falls is a loose bound."""
    mutated = reformulated(mc_study, (lambda c: mc_formula(c) * c["delta"]) if factor == "delta"
                           else (lambda c: mc_formula(c) / c["delta"]))
    assert judged(mutated) == "holds_with_constant"


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_the_method_without_its_clustering_fails(mc_study, assignment):
    """The algorithm mutations: MC's momentum step with its clustering replaced (no
    clustering, a wrong partition, a random assignment) measured against the same
    bound must not hold."""
    sizes = SeparatedSizes(**{k: v for k, v in mc_study.settings.items() if k in SIZE_FIELDS})
    problem = separated_problem(sizes)
    errors = assigned_errors(problem, "mc", assignment, seed=0)
    assert judged(remeasured(mc_study, "T", errors)) in ("fails", "vacuous")


# -- exact claims --------------------------------------------------------------------------


def exact_status(margins: np.ndarray, control_margins: np.ndarray) -> str:
    control = margin_control("mutation test control", control_margins, "margin", TOLERANCE)
    return finalised(exact_verdict("mutated", margins, control=control)).status


def descent_margins(batch, constant: float) -> np.ndarray:
    """``(f(x) - c eta ||g||^2 - f(x - eta g)) / (eta/2 ||g||^2)`` on quadratics: the
    descent claim with the constant ``c`` in place of 1/2."""
    hessian, linear, point, eta = (batch[k] for k in ("hessian", "linear", "point", "eta"))

    def value(x: np.ndarray) -> np.ndarray:
        return 0.5 * np.einsum("bi,bij,bj->b", x, hessian, x) + np.einsum("bi,bi->b", linear, x)

    grad = np.einsum("bij,bj->bi", hessian, point) + linear
    norm2 = np.square(grad).sum(-1)
    after = value(point - eta[:, None] * grad)
    return (value(point) - constant * eta * norm2 - after) / np.maximum(0.5 * eta * norm2, 1e-300)


@pytest.fixture(scope="module")
def descent_batches():
    rng = np.random.default_rng(0)
    real = instances.convex_quadratics(rng, 2000, 3)
    control = instances.steep_quadratic_steps(instances.control_rng(0), 300, 3)
    return real, control


@pytest.mark.parametrize("constant, expected", [
    (0.5, "holds"),  # the claim (eta <= 1/L)
    (0.5 * 0.999, "holds"),  # a weaker claim stays true
    (1.0, "fails"),  # f(x - eta g) = f - eta ||g||^2 + eta^2/2 g^T H g > f - eta ||g||^2
    (0.75, "fails"),
])
def test_descent_constant(descent_batches, constant, expected):
    real, control = descent_batches
    assert exact_status(descent_margins(real, constant), descent_margins(control, constant)) == expected


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(1)
    real = instances.point_clouds(rng, 512, 12, 3)
    control = instances.one_sided_clouds(instances.control_rng(1), 200, 12, 3)
    return real, control


def step_margins(batch, factor: float) -> np.ndarray:
    """One-step-move with its bound (#inside / N) tau times ``factor``, for the real
    step (the radius of the instance)."""
    lhs, rhs = one_step_move_sides(batch["points"], batch["centre"], batch["radius"])
    return (factor * rhs - lhs) / batch["radius"]


def unthresholded_margins(batch, factor: float) -> np.ndarray:
    """The control: the same claim for a step that ignores the threshold (the mean)."""
    import torch

    points, centre = (torch.as_tensor(batch[k], dtype=torch.float64) for k in ("points", "centre"))
    moved, _ = one_round(points, centre, float("inf"), "direct")
    lhs = torch.linalg.vector_norm(moved - centre, dim=-1).numpy()
    _, rhs = one_step_move_sides(batch["points"], batch["centre"], batch["radius"])
    return (factor * rhs - lhs) / batch["radius"]


@pytest.mark.parametrize("factor, expected", [(1.0, "holds"), (1.001, "holds"), (0.5, "fails")])
def test_one_step_move_constant(clouds, factor, expected):
    real, control = clouds
    assert exact_status(step_margins(real, factor), unthresholded_margins(control, factor)) == expected


def test_one_step_move_bound_is_attained_so_a_small_tightening_fails(clouds):
    """The bound is tight (a point at the ball's edge moves the centre by exactly
    tau / N): tightening it by a tenth must already fail on random clouds."""
    real, control = clouds
    assert exact_status(step_margins(real, 0.9), unthresholded_margins(control, 0.9)) == "fails"


@pytest.mark.parametrize("constant, expected", [
    (0.125, "holds"),  # Thm 3.2 corrected
    (0.125 * 0.99, "holds"),
    (0.25, "fails"),  # the printed constant (thm3.2-constant)
])
def test_two_point_lower_bound_constant(constant, expected):
    rng = np.random.default_rng(2)
    sigma = 10.0 ** rng.uniform(-2.0, 2.0, 4000)
    real = {"sigma": sigma, "separation": sigma * np.sqrt(2.0) * 10.0 ** rng.uniform(0.0, 2.0, 4000)}
    small = 10.0 ** rng.uniform(-2.0, 2.0, 300)
    outside = {"sigma": small, "separation": small * rng.uniform(0.05, 1.2, 300)}  # Delta^2 < 2 sigma^2
    assert exact_status(two_point_margin(real, constant), two_point_margin(outside, constant)) == expected
