"""What makes a "holds" evidence (theory_checks.controls): a holding result needs a
violated negative control, else it is vacuous; a bound over 100x the error everywhere
is loose; a rate control is judged by the rate checks' own rule; every registered
statement goes through that decision."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory_checks.controls import (
    LOOSE_FACTOR,
    control_against,
    finalised,
    margin_control,
    rate_control,
    ratio_slack,
)
from theory_checks.statements import registry
from theory_checks.types import CheckResult, NegativeControl

VIOLATED = NegativeControl("broken", 5.0, True)
MET = NegativeControl("broken", 0.5, False)
T = np.array([32.0, 64.0, 128.0, 256.0, 512.0])


@pytest.mark.parametrize("status", ["holds", "holds_with_constant"])
def test_a_holding_result_without_a_violated_control_is_vacuous(status):
    assert finalised(CheckResult("x", status)).status == "vacuous"
    assert finalised(CheckResult("x", status, negative_control=MET)).status == "vacuous"
    assert finalised(CheckResult("x", status, negative_control=VIOLATED)).status == status


@pytest.mark.parametrize("status", ["fails", "inconclusive", "hypotheses_unmet"])
def test_other_statuses_pass_through(status):
    assert finalised(CheckResult("x", status)).status == status


@settings(deadline=None, max_examples=100)
@given(ratios=st.lists(st.floats(1e-6, 10.0), min_size=1, max_size=8))
def test_loose_iff_the_bound_is_over_100x_the_error_everywhere(ratios):
    slack = ratio_slack(ratios, ratios[-1])
    assert slack["loose"] == (max(ratios) < 1.0 / LOOSE_FACTOR)
    result = finalised(CheckResult("x", "holds_with_constant", negative_control=VIOLATED, slack=slack))
    assert result.status == ("loose" if slack["loose"] else "holds_with_constant")


def test_margin_control_is_violated_below_the_tolerance_only():
    assert margin_control("c", np.array([0.1, -1e-3]), "margin", 1e-9).violated
    assert not margin_control("c", np.array([0.1, -1e-12]), "margin", 1e-9).violated
    assert not margin_control("c", np.array([]), "margin", 1e-9).violated


def test_a_flat_control_violates_a_decaying_bound_and_a_decaying_one_does_not():
    rhs = T ** -0.5
    frozen = np.ones((T.size, 3))
    assert rate_control("frozen", T, frozen, rhs, -0.5).violated
    learning = np.outer(T ** -0.5, [0.9, 1.0, 1.1])
    assert not rate_control("as claimed", T, learning, rhs, -0.5).violated


def test_control_against_another_bound_is_the_control_judged_afresh():
    frozen = np.outer(np.ones(T.size), [0.9, 1.0, 1.1])
    control = rate_control("frozen", T, frozen, T ** -0.5, -0.5)
    flat = control_against(control, np.ones(T.size), 0.0)
    fresh = rate_control("frozen", T, frozen, np.ones(T.size), 0.0)
    assert not flat.violated and flat.violated == fresh.violated and flat.ratio == pytest.approx(fresh.ratio)


def test_every_registered_check_is_decided_by_its_control(monkeypatch):
    monkeypatch.setattr(registry, "STATEMENTS", {})
    registry.register("always-holds", "nowhere", "a claim", "exact")(lambda budget, seed=0: CheckResult("x", "holds"))
    assert registry.run_checks("quick", ["always-holds"])["always-holds"].status == "vacuous"
