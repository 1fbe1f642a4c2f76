"""Verdicts on claimed rates (theory_checks.verdicts) and the mean-based exponent fit
(theory_checks.fitting.fit_mean_power_law): synthetic studies with a known true rate
get the verdict their rate deserves, at every seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory_checks.fitting import fit_mean_power_law
from theory_checks.scaling_common import Sweep, assemble
from theory_checks.statements.rates import rate_result
from theory_checks.types import Hypothesis, PowerLaw, RateVerdict
from theory_checks.verdicts import EXPONENT_TOLERANCE, rate_status, rate_verdict

HORIZONS = np.array([32.0, 64.0, 128.0, 256.0, 512.0])  # the quick budget's T
REPEATS = 8
SEEDS = range(10)


def synthetic_errors(exponent: float, seed: int, spread: float = 0.5) -> np.ndarray:
    """``[T, repeats]`` errors ``T^exponent`` times mean-one gamma noise of coefficient
    of variation ``spread`` (the quick rate studies' spreads are 0.2-1)."""
    shape = 1 / spread**2
    noise = np.random.default_rng(seed).gamma(shape, 1 / shape, (HORIZONS.size, REPEATS))
    return HORIZONS[:, None] ** exponent * noise


def verdict_of(exponent: float, seed: int, claimed: float = -0.5) -> str:
    return rate_verdict(fit_mean_power_law(HORIZONS, synthetic_errors(exponent, seed), seed=seed), claimed).verdict


@pytest.mark.parametrize("seed", SEEDS)
def test_a_study_decaying_as_claimed_holds(seed):
    assert verdict_of(-0.5, seed) == "holds"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_study_without_decay_never_holds(seed):
    assert verdict_of(0.0, seed) in ("fails", "inconclusive")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_decay_faster_than_claimed_is_no_failure(seed):
    assert verdict_of(-1.0, seed) == "holds"


def test_noisy_study_without_decay_is_inconclusive_not_holds():
    """Few repeats of very noisy errors: the interval spans the claimed rate and none."""
    rng = np.random.default_rng(4)
    errors = rng.gamma(0.5, 2.0, (HORIZONS.size, 3))  # coefficient of variation 1.4, no decay
    verdict = rate_verdict(fit_mean_power_law(HORIZONS, errors, seed=4), -0.5)
    assert verdict.verdict == "inconclusive" and "no decay" in verdict.direction


def test_the_mean_not_the_geometric_mean_is_fitted():
    """At each T one repeat is 0.1 and the other 0.9 + ... : their mean falls like T^-1/2
    exactly while their geometric mean does not."""
    means = 3.0 * HORIZONS**-0.5
    low = np.full(HORIZONS.size, 0.1) * means
    errors = np.stack([low, 2 * means - low], axis=1)  # mean exactly 3 T^-1/2
    law = fit_mean_power_law(HORIZONS, errors)
    assert law.exponent == pytest.approx(-0.5, abs=1e-12) and law.prefactor == pytest.approx(3.0)
    geometric = np.exp(np.log(errors).mean(axis=1))
    assert np.polyfit(np.log(HORIZONS), np.log(geometric), 1)[0] == pytest.approx(-0.5, abs=1e-12)  # same shape here
    errors[:, 0] = np.linspace(0.1, 0.9, HORIZONS.size) * means  # a growing share in the small repeat
    errors[:, 1] = 2 * means - errors[:, 0]
    assert fit_mean_power_law(HORIZONS, errors).exponent == pytest.approx(-0.5, abs=1e-12)
    geometric = np.exp(np.log(errors).mean(axis=1))
    assert abs(np.polyfit(np.log(HORIZONS), np.log(geometric), 1)[0] + 0.5) > 0.05


@settings(deadline=None, max_examples=30)
@given(exponent=st.floats(-2, 2), prefactor=st.floats(1e-3, 1e3), repeats=st.integers(1, 5))
def test_noise_free_means_give_the_exponent_exactly(exponent, prefactor, repeats):
    errors = np.repeat((prefactor * HORIZONS**exponent)[:, None], repeats, axis=1)
    law = fit_mean_power_law(HORIZONS, errors, resamples=50)
    assert law.exponent == pytest.approx(exponent, abs=1e-9) and law.contains(exponent)
    assert law.high - law.low < 1e-8


def test_interval_is_wider_than_the_plain_percentile_bootstrap_for_few_repeats():
    """Student's widening: with 3 repeats the interval is sqrt(3/2) t_2 / z times the
    percentile interval's distances (about 2.7)."""
    errors = synthetic_errors(-0.5, 1)[:, :3]
    law = fit_mean_power_law(HORIZONS, errors, seed=1)
    from scipy import stats

    factor = math.sqrt(3 / 2) * stats.t.ppf(0.975, 2) / stats.norm.ppf(0.975)
    rng = np.random.default_rng(1)
    picks = rng.integers(0, 3, size=(2000, 3))
    slopes = np.polyfit(np.log(HORIZONS), np.log(errors[:, picks].mean(axis=2)), 1)[0]
    low, high = np.percentile(slopes, [2.5, 97.5])
    assert law.low == pytest.approx(law.exponent - factor * (law.exponent - low), abs=1e-9)
    assert law.high == pytest.approx(law.exponent + factor * (high - law.exponent), abs=1e-9)


def test_invalid_errors_are_refused_naming_them():
    with pytest.raises(ValueError, match="errors must be"):
        fit_mean_power_law(HORIZONS, np.ones(HORIZONS.size))
    with pytest.raises(ValueError, match="finite and non-negative"):
        fit_mean_power_law(HORIZONS, -np.ones((HORIZONS.size, 2)))


# -- the verdict rule --------------------------------------------------------------------------


@settings(deadline=None, max_examples=300)
@given(low=st.floats(-4, 4), width=st.floats(0, 3), claimed=st.floats(-3, 3), bounded=st.booleans())
def test_verdict_rule(low, width, claimed, bounded):
    """fails iff the ratio error / x^claimed grows faster than x^tolerance over the whole
    interval along an unbounded variable; inconclusive iff, otherwise, a decay beyond the
    tolerance is claimed, the interval reaches no decay and it is not decidedly faster
    than claimed."""
    law = PowerLaw(low + width / 2, low, low + width, 1.0)
    verdict = rate_verdict(law, claimed, bounded)
    grows = law.low - claimed > EXPONENT_TOLERANCE
    faster = law.high - claimed < -EXPONENT_TOLERANCE
    if grows and not bounded:
        assert verdict.verdict == "fails" and "than claimed" in verdict.direction
    elif not grows and not faster and claimed < -EXPONENT_TOLERANCE and law.high >= 0:
        assert verdict.verdict == "inconclusive"
    else:
        assert verdict.verdict == "holds"
    if faster:
        assert "the bound is loose" in verdict.direction


def test_a_claimed_decay_within_the_tolerance_is_no_decay():
    """A bound flat to within the tolerance (the separated family's, F_0 growing like T)
    is met by a flat measurement: holds, not inconclusive."""
    flat = PowerLaw(0.0, -0.01, 0.01, 1.0)
    assert rate_verdict(flat, -EXPONENT_TOLERANCE / 2).verdict == "holds"
    wide = PowerLaw(-0.2, -0.6, 0.1, 1.0)
    assert rate_verdict(wide, -EXPONENT_TOLERANCE / 2).verdict == "holds"
    assert rate_verdict(wide, -0.5).verdict == "inconclusive"


def test_directions_name_the_side():
    assert "decays faster" in rate_verdict(PowerLaw(-1.0, -1.1, -0.9, 1.0), -0.5).direction
    assert "decays slower" in rate_verdict(PowerLaw(-0.2, -0.3, -0.1, 1.0), -0.5).direction
    assert "grows faster" in rate_verdict(PowerLaw(2.0, 1.9, 2.1, 1.0), 1.0, bounded=True).direction
    assert "grows slower" in rate_verdict(PowerLaw(0.5, 0.4, 0.6, 1.0), 1.0).direction


def test_status_puts_unmet_hypotheses_first():
    holds, fails = RateVerdict("holds", ""), RateVerdict("fails", "")
    unmet = Hypothesis("Assumption 9", "gap >= 1", 0.01, 1.0, False)
    met = Hypothesis("Assumption 6", "x", 1.0, 1.0, True)
    assert rate_status({"T": fails}, [unmet]) == "hypotheses_unmet"
    assert rate_status({"T": fails, "n": holds}, [met]) == "fails"
    assert rate_status({"T": RateVerdict("inconclusive", ""), "n": holds}) == "inconclusive"
    assert rate_status({"T": holds}) == "holds_with_constant"


# -- a rate check on synthetic studies ---------------------------------------------------------


def synthetic_study(variable: str, exponent: float, hypotheses=()) -> object:
    values = tuple(float(x) for x in HORIZONS)
    sweep = Sweep(variable, values, synthetic_errors(exponent, 0), tuple(x**-0.5 for x in values), claimed=-0.5)
    return assemble("thm-test", [sweep], {}, seed=0, hypotheses=hypotheses)


def test_a_rate_check_fails_with_its_family_only_when_the_ratio_grows():
    failed = rate_result("thm-test", synthetic_study("T", 0.0))
    assert failed.status == "fails" and failed.constant is None
    assert failed.counterexample["variable"] == "T" and failed.counterexample["values"] == list(HORIZONS)
    ratios = failed.counterexample["ratios"]
    assert ratios[-1] > ratios[0]
    held = rate_result("thm-test", synthetic_study("T", -0.5))
    assert held.status == "holds_with_constant" and held.constant is not None and held.counterexample is None
    assert "constant C" in held.evidence
    bounded = rate_result("thm-test", synthetic_study("beta", 0.0))  # beta_i <~ delta_i: bounded
    assert bounded.status == "holds_with_constant"


def test_a_rate_check_with_unmet_hypotheses_gives_no_verdict():
    unmet = Hypothesis("Assumption 9", "delta min gap / rho >= 1", 0.01, 1.0, False, "round 1")
    result = rate_result("thm-test", synthetic_study("T", 0.0, [unmet]))
    assert result.status == "hypotheses_unmet"
    assert result.constant is None and result.counterexample is None
    assert "Assumption 9 unmet" in result.evidence and "round 1" in result.evidence
    assert result.unmet() == [unmet]


def test_a_status_that_changes_across_seeds_is_inconclusive_at_the_budget():
    """FedSPD's quick checks run at eight seeds: one status everywhere is kept (and said),
    any change gives "inconclusive" with every seed's status listed and no constant."""
    from theory_checks.statements.other_papers import seed_stable
    from theory_checks.types import CheckResult, FittedConstant

    constant = FittedConstant(0.5, "upper", 3, 0, (0.5,))
    holding = CheckResult("s", "holds_with_constant", constant=constant, evidence="fit")
    same = seed_stable([holding, holding], [0, 1])
    assert same.status == "holds_with_constant" and "same status at seeds 0-1" in same.evidence
    mixed = seed_stable([holding, CheckResult("s", "loose"), holding], [3, 4, 5])
    assert mixed.status == "inconclusive" and mixed.constant is None
    assert "4: loose" in mixed.evidence and "3: holds_with_constant" in mixed.evidence


def test_a_fedspd_repeat_whose_centres_never_found_the_sources_is_named_and_dropped():
    """A repeat is dropped from every horizon when its run at any horizon ended with a
    centre far from its source's optimum; the others stay, paired across horizons."""
    from theory_checks.scaling_fedspd import FedSPDMeasurements, FedSPDRun, FedSPDSizes, collapsed_repeats

    def run(found: bool) -> FedSPDRun:
        return FedSPDRun(1.0, 1.0, 1.0, 0, None, 2.0, found)  # type: ignore[arg-type]

    sizes = FedSPDSizes(horizons=(32, 64, 128), repeats=3)
    runs = ((run(True), run(True), run(True)), (run(True), run(False), run(True)), (run(True), run(False), run(True)))
    measured = FedSPDMeasurements(runs, 1.0, 1.0, 0, 0.5)
    assert collapsed_repeats(measured, sizes, seed=4) == [{"repeat": 1, "federation_seed": 4001,
                                                           "horizons": [64, 128]}]


def _flat_bound_sweep(errors, bounded=False):
    from theory_checks.scaling_common import ConstantSweep

    values = [1.0, 2.0, 4.0]
    arguments = [{"x": v} for v in values]
    return ConstantSweep.of("x", "x", values, np.asarray(errors, float), arguments, [True] * 3,
                            lambda c: np.ones_like(c["x"]), bounded=bounded, covarying=True)


def test_a_sweep_too_wide_to_see_a_missing_factor_is_inconclusive():
    """error / bound judged flat along x: repeats that agree to 1% read "holds"; repeats
    spread over a factor 30 at x = 4 give an interval reaching a full power above 0, so
    a bound missing a factor x would not be seen: "inconclusive", unless the hypotheses
    bound x (then any growth is covered by the constant)."""
    tight = [[1.0, 1.01, 0.99, 1.0], [1.0, 0.99, 1.01, 1.0], [1.0, 1.01, 1.0, 0.99]]
    wide = [[1.0, 1.0, 1.0, 1.0], [1.0, 0.3, 3.0, 1.0], [0.1, 0.2, 3.0, 0.3]]
    assert _flat_bound_sweep(tight).verdict(0).verdict == "holds"
    verdict = _flat_bound_sweep(wide).verdict(0)
    assert verdict.verdict == "inconclusive" and "would not be seen" in verdict.direction
    assert _flat_bound_sweep(wide, bounded=True).verdict(0).verdict == "holds"
