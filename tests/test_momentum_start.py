"""The momentum's first round (``first_alpha``, defenses.clustering_algorithms.
MomentumStartParams): the workshop's proofs start the momenta at the gradient (A.1,
"Assumptions", item 2: m_0 = 0 and alpha = 1 at t = 1); unset, eq. (29) from 0 as
before."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

import defenses
from theory_checks.separated_instance import SeparatedSizes, separated_problem


def federation(seed: int = 0):
    problem = separated_problem(SeparatedSizes(noise=0.1))
    return problem.federation(16, seed, 0.1)


@pytest.mark.parametrize("method", ["mc", "pfl_tc"])
def test_first_alpha_one_makes_the_first_momentum_the_gradient(method):
    algorithm = defenses.build(method, federation(), {"lr": 0.1, "alpha": 0.1, "first_alpha": 1.0})
    record = algorithm.step(0)
    torch.testing.assert_close(record.momenta, record.gradients, rtol=0, atol=0)
    second = algorithm.step(1)  # alpha again from round 2: m_2 = 0.1 g_2 + 0.9 g_1
    torch.testing.assert_close(second.momenta, 0.1 * second.gradients + 0.9 * record.momenta)


def test_unset_first_alpha_is_eq_29_from_zero():
    algorithm = defenses.build("mc", federation(), {"lr": 0.1, "alpha": 0.1})
    record = algorithm.step(0)
    torch.testing.assert_close(record.momenta, 0.1 * record.gradients)


def test_pdl_tc_first_round_at_first_alpha_equals_a_run_with_that_alpha():
    """PDL-TC's round 1 with first_alpha = 1 is its round 1 with alpha = 1; round 2
    differs (alpha = 0.1 again)."""
    started = defenses.build("pdl_tc", federation(), {"lr": 0.1, "alpha": 0.1, "first_alpha": 1.0})
    plain = defenses.build("pdl_tc", federation(), {"lr": 0.1, "alpha": 1.0})
    torch.testing.assert_close(started.step(0).momenta, plain.step(0).momenta, rtol=0, atol=0)
    assert not torch.equal(started.step(1).momenta, plain.step(1).momenta)


def test_first_alpha_and_bias_correction_are_refused_together():
    with pytest.raises(ValidationError, match="bias_correction and first_alpha"):
        defenses.build("mc", federation(), {"lr": 0.1, "first_alpha": 1.0, "bias_correction": True})


@pytest.mark.parametrize("value", [0.0, 1.5])
def test_first_alpha_outside_zero_one_is_refused_naming_the_field(value):
    with pytest.raises(ValidationError, match="first_alpha"):
        defenses.build("mc", federation(), {"lr": 0.1, "first_alpha": value})
