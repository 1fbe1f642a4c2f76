"""The public checking API (theory_checks.check, check_bound, check_rate): a registered
statement by name and seed, a user's own bound with the package's search and shrink,
and a user's own rate with its verdict."""

from __future__ import annotations

import numpy as np
import pytest

from theory_checks import check, check_bound, check_rate
from theory_checks.api import relative_margin
from theory_checks.statements.search import simplicity
from theory_checks.types import Hypothesis


def pairs(rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    return {"a": rng.uniform(0, 4, size), "b": rng.uniform(0, 4, size)}


def negative_pairs(rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    """AM-GM's control: a, b < 0 breaks its hypothesis a, b >= 0, and there sqrt(ab) > 0 >
    (a + b) / 2."""
    return {"a": rng.uniform(-4, -0.1, size), "b": rng.uniform(-4, -0.1, size)}


def geometric(x):
    return np.sqrt(x["a"] * x["b"])


def arithmetic(x):
    return (x["a"] + x["b"]) / 2


def test_a_true_bound_holds_with_its_smallest_margin_and_a_violated_control():
    """AM-GM: sqrt(ab) <= (a + b) / 2, with equality at a = b (margins reach 0 from above);
    its control (a, b < 0) violates it on every instance, by -2 at a = b."""
    result = check_bound(geometric, arithmetic, pairs, instances=5000, control=negative_pairs,
                         control_description="a, b < 0", control_instances=300)
    assert result.status == "holds" and result.instances == 5000
    assert 0 <= result.worst_slack < 1e-3 and result.counterexample is None
    control = result.negative_control
    assert control.violated and control.details == {"instances": 300, "violations": 300}
    assert -2.0 <= control.ratio < -1.9 and control.real == result.worst_slack
    assert control.description == "a, b < 0"


def test_a_holding_bound_without_a_violated_control_is_vacuous():
    """No control, or a control that meets the bound too (a, b >= 0 again), leaves a
    "holds" that is no evidence: vacuous."""
    alone = check_bound(geometric, arithmetic, pairs, instances=500)
    assert alone.status == "vacuous" and "no negative control" in alone.evidence
    toothless = check_bound(geometric, arithmetic, pairs, instances=500, control=pairs, control_instances=200)
    assert toothless.status == "vacuous" and not toothless.negative_control.violated


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt")
def test_a_control_giving_nan_counts_as_violated():
    """One of a, b negative: sqrt(ab) is NaN, a margin of -inf (a violation)."""
    def mixed(rng, size):
        return {"a": rng.uniform(-4, -0.1, size), "b": rng.uniform(0.1, 4, size)}

    result = check_bound(geometric, arithmetic, pairs, instances=500, control=mixed, control_instances=100)
    assert result.status == "holds" and result.negative_control.ratio == -np.inf


def test_a_false_bound_fails_with_a_shrunk_violating_instance():
    """a^2 <= 2a fails for a > 2: the counterexample violates it and is no more complex
    than the instance first found."""
    result = check_bound(lambda x: x["a"] ** 2, lambda x: 2 * x["a"], pairs, name="a^2 <= 2a", instances=2000)
    assert result.status == "fails" and result.statement == "a^2 <= 2a"
    shrunk = result.counterexample
    assert shrunk["a"] > 2 and shrunk["lhs"] == shrunk["a"] ** 2 and shrunk["rhs"] == 2 * shrunk["a"]
    found = {key: np.asarray(value) for key, value in result.details["found"].items()}
    simple = {key: np.asarray(shrunk[key]) for key in ("a", "b")}
    assert simplicity(simple) <= simplicity(found)
    assert shrunk["a"] == round(shrunk["a"])  # shrinking reaches a whole number (3 or 4)
    # about half of [0, 4] violates: the count says so
    assert "violated on" in result.evidence


def test_validity_constrains_the_shrink():
    """The sampler draws a in (3.5, 4); shrinking may not leave that domain, so the
    simpler 3 (a violation too) is refused and 4 is not below it."""
    def high(rng, size):
        return {"a": rng.uniform(3.5, 4.0, size), "b": rng.uniform(0, 4, size)}

    result = check_bound(lambda x: x["a"] ** 2, lambda x: 2 * x["a"], high, valid=lambda x: 3.5 < x["a"] < 4.0)
    assert result.status == "fails" and 3.5 < result.counterexample["a"] < 4.0
    free = check_bound(lambda x: x["a"] ** 2, lambda x: 2 * x["a"], high)
    assert free.counterexample["a"] in (3.0, 4.0)  # unconstrained, it rounds to a whole number


def test_the_search_is_seeded():
    first = check_bound(lambda x: x["a"], lambda x: x["b"], pairs, seed=4, instances=100)
    second = check_bound(lambda x: x["a"], lambda x: x["b"], pairs, seed=4, instances=100)
    assert first.details == second.details and first.counterexample == second.counterexample


def test_relative_margin_hand_cases():
    margins = relative_margin(np.array([1.0, 3.0, 0.0, np.nan, -2.0]), np.array([2.0, 1.0, 0.0, 1.0, -1.0]))
    assert margins[0] == pytest.approx(0.5) and margins[1] == pytest.approx(-2 / 3)
    assert margins[2] == 0 and margins[3] == -np.inf and margins[4] == pytest.approx(0.5)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="instances and batch_size"):
        check_bound(lambda x: x["a"], lambda x: x["b"], pairs, instances=0)


def test_check_runs_a_registered_statement_at_a_seed():
    assert check("lemma7").status == "holds"
    assert check("thm3.2-constant", seed=1).status == "fails"
    with pytest.raises(ValueError, match="registered"):
        check("lemma8")


def test_check_rate_gives_the_verdict_and_respects_hypotheses():
    values = np.array([10.0, 20.0, 40.0, 80.0])
    decaying = np.outer(values**-0.5, [0.9, 1.0, 1.1])
    flat = np.ones((4, 3)) * np.array([0.9, 1.0, 1.1])  # a frozen model: fails the claimed decay
    result = check_rate(values, decaying, -0.5, variable="T", control_errors=flat, control_description="frozen")
    assert result.status == "holds"
    control = result.negative_control
    assert control.violated and control.description == "frozen" and control.details["verdict"] == "fails"
    assert control.details["exponent"] == pytest.approx(0.0, abs=1e-6)
    # error / x^-0.5 at the largest T: sqrt(80) for the frozen model, 1 for the real one
    assert control.ratio == pytest.approx(np.sqrt(80.0)) and control.real == pytest.approx(1.0)
    result = check_rate(values, flat, -0.5, variable="T")
    assert result.status == "fails" and result.verdicts["T"].verdict == "fails"
    unmet = Hypothesis("A9", "gap >= 1", 0.1, 1.0, False)
    assert check_rate(values, flat, -0.5, hypotheses=[unmet]).status == "hypotheses_unmet"


def test_a_holding_rate_without_a_failing_control_is_vacuous():
    """No control, or a control that decays as claimed too, leaves the "holds" vacuous."""
    values = np.array([10.0, 20.0, 40.0, 80.0])
    decaying = np.outer(values**-0.5, [0.9, 1.0, 1.1])
    assert check_rate(values, decaying, -0.5).status == "vacuous"
    result = check_rate(values, decaying, -0.5, control_errors=2.0 * decaying)
    assert result.status == "vacuous" and not result.negative_control.violated
