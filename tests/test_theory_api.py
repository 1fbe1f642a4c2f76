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


def test_a_true_bound_holds_with_its_smallest_margin():
    """AM-GM: sqrt(ab) <= (a + b) / 2, with equality at a = b (margins reach 0 from above)."""
    result = check_bound(lambda x: np.sqrt(x["a"] * x["b"]), lambda x: (x["a"] + x["b"]) / 2, pairs, instances=5000)
    assert result.status == "holds" and result.instances == 5000
    assert 0 <= result.worst_slack < 1e-3 and result.counterexample is None


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
    assert check_rate(values, decaying, -0.5, variable="T").status == "holds"
    flat = np.ones((4, 3)) * np.array([0.9, 1.0, 1.1])
    result = check_rate(values, flat, -0.5, variable="T")
    assert result.status == "fails" and result.verdicts["T"].verdict == "fails"
    unmet = Hypothesis("A9", "gap >= 1", 0.1, 1.0, False)
    assert check_rate(values, flat, -0.5, hypotheses=[unmet]).status == "hypotheses_unmet"
