"""The bounds of Werner et al. as functions of their constants (theory_checks.bounds):
hand-computed values, the hidden constant as a parameter, and the constant fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory_checks import bounds

positive = st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False)


def test_clustering_error_hand_computed():
    # sigma = 2, Delta = 8, n = 4, beta = 0.1: 4/4 + 8/8 + 0.1 * 16 = 3.6
    assert bounds.clustering_error(2.0, 8.0, 4, 0.1) == pytest.approx(3.6)
    assert bounds.clustering_error(2.0, 8.0, 4, 0.1, constant=2.5) == pytest.approx(9.0)


def test_lower_bound_hand_computed():
    # sigma = 1, Delta = 2: sigma^4 / Delta^2 = 1/4; with n = 5 add 1/5
    assert bounds.lower_bound(1.0, 2.0) == pytest.approx(0.25 * 0.25)
    assert bounds.lower_bound(1.0, 2.0, n=5, constant=1.0) == pytest.approx(0.25 + 0.2)


def test_rates_hand_computed():
    # Thm 3.3: sqrt(max(1, A^2) * (1/4 + 1/8 + 0) / T) with sigma = 1, Delta = 8, n = 4
    assert bounds.fc_rate(0.5, 1.0, 8.0, 4, 0.0, 100) == pytest.approx(math.sqrt(0.375 / 100))
    assert bounds.fc_rate(4.0, 1.0, 8.0, 4, 0.0, 100) == pytest.approx(math.sqrt(4 * 0.375 / 100))
    # Thm 3.4: sqrt(0.375 / T) + beta sigma Delta / (T^(1/4) 0.375^(1/4))
    expected = math.sqrt(0.375 / 16) + 0.1 * 8 / (2 * 0.375**0.25)
    assert bounds.mc_rate(1.0, 8.0, 4, 0.1, 16) == pytest.approx(expected)


def test_lemma1_constants_and_separation():
    constants = bounds.lemma1_constants(4.0, 2.0)
    assert constants == {"A": 4.0, "A2": 16.0, "D2": 10.0}
    norms = np.array([[1.0, 3.0], [2.0, 2.0]])
    np.testing.assert_allclose(bounds.lemma1_separation(norms, "max"), [4.5, 2.0])
    np.testing.assert_allclose(bounds.lemma1_separation(norms, "min"), [0.5, 2.0])
    np.testing.assert_allclose(bounds.lemma1_separation(norms, "pair"), [[0.5, 4.5], [2.0, 2.0]])
    with pytest.raises(ValueError, match="mu > 0"):
        bounds.lemma1_constants(1.0, 0.0)


def test_clustering_rounds_formula():
    # log(0.1) / log(1 - 0.25 / 2) = 17.24 -> 18 rounds
    assert bounds.clustering_rounds(1.0, 10.0, 0.25) == 18
    assert bounds.clustering_rounds(2.0, 1.0, 0.25) == 1  # sigma >= Delta: one round
    # a batch of 100 cuts sigma by 10 (Thm 3.3's eq. 22): log(0.01) / log(0.875)
    assert bounds.clustering_rounds(1.0, 10.0, 0.25, batch_size=100) == math.ceil(math.log(0.01) / math.log(0.875))
    with pytest.raises(ValueError, match="cluster_fraction"):
        bounds.clustering_rounds(1.0, 10.0, 0.0)


@given(positive, positive, st.integers(1, 1000), st.floats(0, 0.5), positive)
@settings(max_examples=200, deadline=None)
def test_constant_scales_every_bound_linearly(sigma, separation, n, beta, constant):
    base = bounds.clustering_error(sigma, separation, n, beta)
    assert bounds.clustering_error(sigma, separation, n, beta, constant) == pytest.approx(constant * base)
    assert bounds.clustering_radius(0.3, sigma, separation, constant) == pytest.approx(
        constant * math.sqrt(0.3 * sigma * separation))


@given(st.lists(st.tuples(positive, positive), min_size=1, max_size=30))
@settings(max_examples=200, deadline=None)
def test_fitted_constant_is_the_smallest_that_holds(pairs):
    measured, rhs = map(np.array, zip(*pairs))
    upper = bounds.fit_constant(measured, rhs, "upper")
    assert np.all(measured <= upper.value * rhs * (1 + 1e-12))
    assert measured[upper.decisive] == pytest.approx(upper.value * rhs[upper.decisive])  # tight
    lower = bounds.fit_constant(measured, rhs, "lower")
    assert np.all(measured >= lower.value * rhs * (1 - 1e-12))
    assert lower.value <= upper.value


def test_fit_constant_edge_cases():
    fitted = bounds.fit_constant([0.0, 1.0], [0.0, 2.0])
    assert fitted.value == 0.5 and fitted.instances == 1  # 0 <= C * 0 decides nothing
    assert bounds.fit_constant([1.0], [0.0]).value == math.inf  # no finite constant
    with pytest.raises(ValueError, match="one shape"):
        bounds.fit_constant([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="no constant is decided"):
        bounds.fit_constant([0.0], [0.0])


def test_clustering_rounds_at_one_cluster():
    # delta_i = 1: log(0.01) / log(1/2) = 6.64 -> 7 rounds (eq. 13 has no jump there)
    assert bounds.clustering_rounds(1.0, 100.0, 1.0) == 7
    assert bounds.clustering_rounds(1.0, 100.0, 0.999) == 7


def test_lemma1_constants_per_instance():
    constants = bounds.lemma1_constants(np.array([4.0, 3.0]), np.array([2.0, 1.0]))
    np.testing.assert_allclose(constants["A"], [4.0, 6.0])
    np.testing.assert_allclose(constants["D2"], [10.0, 20.0])
    with pytest.raises(ValueError, match="mu > 0"):
        bounds.lemma1_constants(np.array([1.0, 1.0]), np.array([1.0, 0.0]))
