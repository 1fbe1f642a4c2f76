"""The checker tested by mutation: perturb a bound (halve its constant, drop a term, flip
an exponent's sign, tighten a constant past the truth) and the verdict must turn where
the perturbed bound is false or says nothing, and stay where it is still true.  A
checker whose verdict did not move with its bound would not be checking the bound.

The rate mutations re-judge one measured study (theory_checks.scaling_common.rejudged:
the same runs, another right-hand side and claimed exponent, the negative control
judged again); the exact ones evaluate the perturbed claim on the same instances as
the unperturbed one, with the statement's own negative control."""

from __future__ import annotations

import numpy as np
import pytest

from theory_checks.controls import finalised, margin_control
from theory_checks.scaling_common import rejudged
from theory_checks.statements import instances
from theory_checks.statements.clustering_steps import one_step_move_sides, one_round
from theory_checks.statements.false_claims import two_point_margin
from theory_checks.statements.rates import rate_result
from theory_checks.statements.search import TOLERANCE, exact_verdict

# -- a rate: Thm 3.4 on the one-sided separated family ---------------------------------------


@pytest.fixture
def mc_study(separated_mc_study):
    """MC on the separated family, four horizons, two repeats (conftest)."""
    return separated_mc_study


def judged(study) -> str:
    return finalised(rate_result("thm3.4-separated", study)).status


def horizons_and_bound(study) -> tuple[np.ndarray, np.ndarray]:
    table = [entry for entry in study.claimed_rhs if entry["variable"] == "T"]
    return np.array([entry["x"] for entry in table]), np.array([entry["rhs"] for entry in table])


def test_the_unperturbed_bound_holds_with_a_violated_control(mc_study):
    result = finalised(rate_result("thm3.4-separated", mc_study))
    assert result.status == "holds_with_constant"
    assert result.negative_control is not None and result.negative_control.violated


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_a_rescaled_constant_leaves_the_verdict_and_scales_the_constant(mc_study, factor):
    """The bound hides its constant: halving or doubling it must not change the verdict,
    only the fitted C (by 1 / factor)."""
    _, rhs = horizons_and_bound(mc_study)
    mutated = rejudged(mc_study, "T", rhs * factor, mc_study.claimed["T"])
    assert judged(mutated) == "holds_with_constant"
    assert mutated.constant.value == pytest.approx(mc_study.constant.value / factor, rel=1e-9)


def test_dropping_the_leading_term_fails(mc_study):
    """Without sqrt(L F_0 E / T) the bound is L F_0 / T, decaying like 1/T: MC's error
    (about T^-1/2) outgrows it."""
    horizons, _ = horizons_and_bound(mc_study)
    descent_only = mc_study.settings["L"] * mc_study.settings["F0"] / horizons
    assert judged(rejudged(mc_study, "T", descent_only, -1.0)) == "fails"


def test_a_faster_claimed_decay_fails(mc_study):
    horizons, rhs = horizons_and_bound(mc_study)
    assert judged(rejudged(mc_study, "T", rhs * (horizons / horizons[0]) ** -0.5, -1.0)) == "fails"


def test_a_flipped_exponent_is_vacuous(mc_study):
    """A bound growing like T^+1/2 is met by a frozen model too: the control no longer
    violates it, and the status must say the check is no evidence."""
    horizons, rhs = horizons_and_bound(mc_study)
    flipped = rhs[0] * (horizons / horizons[0]) ** 0.5
    mutated = rejudged(mc_study, "T", flipped, 0.5)
    assert not mutated.control.violated
    assert judged(mutated) == "vacuous"


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
