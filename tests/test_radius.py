"""Tests for the radius policies of Threshold-Clustering (Werner et al., Alg. 3 step 3):
fixed, theory (tau ~ sqrt(delta sigma Delta), Thm 3.1), quantile
(q-quantile of the distances, linear interpolation) and "cd" (1-D 3-means on the
distances, tau = mean of the 2nd and 3rd centres).  The official code's variants
(``rule = "official"``, ``fit = "kmeans++"``) are checked in test_official_rules.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from defenses.clustering_algorithms import FederatedClustering, MomentumClustering
from defenses.radius import (
    CenterDistanceRadius,
    FixedRadius,
    QuantileRadius,
    TheoryRadius,
    make_radius,
    quantile_with_inf,
)

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
FAST = settings(max_examples=60, deadline=None)

distances_1d = st.lists(st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=15)


def test_fixed_radius_is_constant_per_centre_and_round():
    """Fixed policy: tau_{k,l} = tau for every problem, centre and round; a plain
    number given to make_radius means a fixed radius."""
    distances = torch.rand(2, 3, 5, dtype=F64)
    policy = make_radius(2.5)
    assert isinstance(policy, FixedRadius) and policy.tau == 2.5 and not policy.strict
    for round_index in (0, 7):
        tau = policy(distances, round_index)
        assert tau.shape == (2, 3) and tau.dtype == F64
        assert torch.all(tau == 2.5)
    assert make_radius({"policy": "fixed", "tau": 3}).tau == 3
    assert make_radius(0).tau == 0.0


def test_theory_radius_hand_computed():
    """Thm 3.1: tau = c * sqrt(delta * sigma * Delta).  Hand computation:
    delta = 1/4, sigma = 4, Delta = 9, c = 2 -> 2 * sqrt(9) = 6;
    delta = 1/2, sigma = 2, Delta = 1, c = 1 (default) -> 1."""
    policy = make_radius({"policy": "theory", "delta": 0.25, "sigma": 4.0, "separation": 9.0, "c": 2.0})
    assert isinstance(policy, TheoryRadius)
    assert policy.tau == 6.0
    tau = policy(torch.rand(3, 2, 4, dtype=F64), 0)
    assert tau.shape == (3, 2) and torch.all(tau == 6.0)
    assert TheoryRadius(delta=0.5, sigma=2.0, separation=1.0).tau == 1.0


@FAST
@given(values=distances_1d, q=st.floats(0.0, 1.0))
def test_quantile_matches_numpy_linear_on_finite_data(values, q):
    """Quantile policy: the q-quantile with linear interpolation between order
    statistics, i.e. numpy.quantile's default method, on finite distances."""
    distances = torch.tensor(values, dtype=F64).view(1, 1, -1)
    tau = QuantileRadius(q)(distances, 0)
    expected = np.quantile(np.array(values), q)
    assert tau.shape == (1, 1)
    assert math.isclose(tau.item(), expected, rel_tol=1e-12, abs_tol=1e-9)


@FAST
@given(values=distances_1d, q=st.floats(0.0, 1.0), factor=st.floats(0.01, 10.0))
def test_quantile_factor_multiplies(values, q, factor):
    """The official code's factor (0.99): tau = factor * quantile."""
    distances = torch.tensor(values, dtype=F64).view(1, 1, -1)
    plain = QuantileRadius(q)(distances, 0).item()
    scaled = QuantileRadius(q, factor=factor)(distances, 0).item()
    assert math.isclose(scaled, factor * plain, rel_tol=1e-15, abs_tol=0.0)


@FAST
@given(values=distances_1d, infinite=st.integers(1, 6), q=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_quantile_with_infinite_distances(values, infinite, q, seed):
    """Inadmissible points have distance inf; inf sorts last.  Where the quantile
    position q(N-1) needs only finite order statistics the result is finite and equals
    the quantile with every inf replaced by any larger finite value; where it needs an
    infinite one (with positive weight) the result is inf.  Never NaN."""
    finite = len(values)
    n = finite + infinite
    array = np.array(values + [math.inf] * infinite)
    order = np.random.default_rng(seed).permutation(n)  # position of the infs is irrelevant
    distances = torch.tensor(array[order], dtype=F64).view(1, 1, -1)
    tau = quantile_with_inf(distances, q).item()
    position = q * (n - 1)
    hi = math.ceil(position)
    assert not math.isnan(tau)
    if hi <= finite - 1:
        replaced = np.where(np.isinf(array), max(values) + 1.0, array)
        assert math.isclose(tau, np.quantile(replaced, q), rel_tol=1e-12, abs_tol=1e-9)
    else:  # the upper order statistic used is infinite (lo == hi, or hi with weight > 0)
        assert tau == math.inf
    assert QuantileRadius(q)(distances, 3).item() == tau  # the policy uses this quantile


def test_quantile_batched_per_centre():
    """The quantile is taken per (problem, centre) row over the last dimension.
    Hand computation: median of {3, 1, 2} = 2; of {10, 0, 4} = 4; q = 1 gives the max."""
    distances = torch.tensor([[[3.0, 1.0, 2.0], [10.0, 0.0, 4.0]]], dtype=F64)
    assert QuantileRadius(0.5)(distances, 0).tolist() == [[2.0, 4.0]]
    assert QuantileRadius(1.0)(distances, 0).tolist() == [[3.0, 10.0]]
    assert QuantileRadius(0.0)(distances, 0).tolist() == [[1.0, 0.0]]
    # q = 0.25 on 3 values: position 0.5, halfway between the two smallest
    assert QuantileRadius(0.25)(distances, 0).tolist() == [[1.5, 2.0]]


@pytest.mark.parametrize("fit", ["lloyd", "kmeans++"])
def test_cd_policy_three_obvious_groups(fit):
    """"cd" policy: 1-D k-means with 3 centres on the distances (either fit); tau is
    the mean of the 2nd and 3rd centres.  Three well separated groups with means
    0.1, 5.0 and 10.0 (hand computed) give tau = (5.0 + 10.0) / 2 = 7.5.  Infinite
    (inadmissible) distances are ignored."""
    groups = [[0.0, 0.1, 0.2], [4.9, 5.0, 5.1], [9.8, 10.0, 10.2]]
    flat = [x for group in groups for x in group]
    distances = torch.tensor(flat, dtype=F64)[torch.randperm(9, generator=torch.Generator().manual_seed(0))]
    tau = CenterDistanceRadius(fit=fit)(distances.view(1, 1, -1), 0)
    assert tau.shape == (1, 1)
    assert tau.item() == pytest.approx(7.5, abs=1e-12)
    with_inf = torch.cat([distances, torch.full((2,), math.inf, dtype=F64)]).view(1, 1, -1)
    assert CenterDistanceRadius(fit=fit)(with_inf, 0).item() == pytest.approx(7.5, abs=1e-12)


@pytest.mark.parametrize("fit", ["lloyd", "kmeans++"])
def test_cd_policy_unequal_groups_batched(fit):
    """"cd" policy on unequal groups and per row of a batch.  Row 1: groups {1, 2},
    {20, 21, 22, 23}, {100} -> means 1.5, 21.5, 100 -> tau = 60.75.  Row 2: groups
    {0, 0, 0, 0, 1}, {50, 52}, {80, 82, 84} -> means 0.2, 51, 82 -> tau = 66.5."""
    rows = torch.tensor(
        [
            [1.0, 2.0, 20.0, 21.0, 22.0, 23.0, 100.0, math.inf, math.inf, math.inf],
            [0.0, 0.0, 0.0, 0.0, 1.0, 50.0, 52.0, 80.0, 82.0, 84.0],
        ],
        dtype=F64,
    ).view(1, 2, -1)
    tau = CenterDistanceRadius(fit=fit)(rows, 0)
    assert tau.shape == (1, 2)
    torch.testing.assert_close(tau, torch.tensor([[60.75, 66.5]], dtype=F64), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"policy": "median"}, ["radius.policy", "median"]),
        ({"q": 0.2}, ["radius.policy", "None"]),
        ({"policy": "quantile", "q": 1.5}, ["radius.q", "1.5"]),
        ({"policy": "quantile", "q": -0.1}, ["radius.q", "-0.1"]),
        ({"policy": "quantile", "q": 0.2, "factor": 0.0}, ["radius.factor"]),
        ({"policy": "quantile", "qq": 0.2}, ["quantile", "qq"]),
        ({"policy": "quantile"}, ["quantile", "'q'"]),
        ({"policy": "fixed", "tau": -1.0}, ["radius.tau", "-1.0"]),
        ({"policy": "fixed", "tau": math.nan}, ["radius.tau", "nan"]),
        ({"policy": "theory", "delta": 0.0, "sigma": 1.0, "separation": 1.0}, ["radius.delta"]),
        ({"policy": "theory", "delta": 0.5, "sigma": -1.0, "separation": 1.0}, ["radius.sigma"]),
        ({"policy": "theory", "delta": 0.5, "sigma": 1.0, "separation": -2.0}, ["radius.separation"]),
        ({"policy": "theory", "delta": 0.5, "sigma": 1.0, "separation": 1.0, "c": 0.0}, ["radius.c "]),
        ({"policy": "cd", "iterations": 0}, ["radius.iterations"]),
        (-0.5, ["radius.tau", "-0.5"]),
        ("0.2", ["radius must be", "0.2"]),
        (True, ["radius must be", "True"]),
    ],
)
def test_make_radius_errors_name_the_field(spec, words):
    """make_radius validates at construction: a bad policy name or parameter raises
    ValueError whose message names the offending field (and, where useful, the value)."""
    with pytest.raises(ValueError) as error:
        make_radius(spec)
    for word in words:
        assert word in str(error.value), (word, str(error.value))


@pytest.mark.parametrize(
    "spec",
    [1.5, {"policy": "fixed", "tau": math.inf}, {"policy": "theory", "delta": 0.5, "sigma": 1.0, "separation": 2.0},
     {"policy": "quantile", "q": 0.2, "rule": "official"}, {"policy": "cd", "fit": "kmeans++"}],
)
def test_radius_policies_stay_frozen_dataclasses(spec):
    """Validated by pydantic (robust_pfl.engine.validation), still frozen dataclasses: equal
    and hashable by value, pickled in checkpoints, replaced field by field."""
    import dataclasses
    import pickle

    policy = make_radius(spec)
    assert make_radius(policy) is policy  # an object is used as it is, never parsed again
    assert policy == make_radius(spec) and hash(policy) == hash(make_radius(spec))
    assert pickle.loads(pickle.dumps(policy)) == policy and dataclasses.replace(policy) == policy
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.strict = True
    with pytest.raises(ValueError, match=r"radius\.strict must be true or false, got 1"):
        dataclasses.replace(policy, strict=1)


def test_algorithm_params_reject_bad_radius_at_config_time():
    """A bad radius inside an algorithm's parameters fails when the parameters are
    validated (config-load time), naming the radius field and the bad parameter."""
    with pytest.raises(ValidationError) as error:
        FederatedClustering.Params(radius={"policy": "quantile", "q": 2.0})
    assert "radius" in str(error.value) and "radius.q" in str(error.value)
    with pytest.raises(ValidationError) as error:
        MomentumClustering.Params(radius={"policy": "nope"})
    assert "radius" in str(error.value) and "nope" in str(error.value)
    good = MomentumClustering.Params(radius={"policy": "cd"})
    assert isinstance(good.radius_policy(), CenterDistanceRadius)


@FAST
@given(values=distances_1d, q=st.floats(0.0, 1.0))
def test_quantile_radius_is_monotone_in_q(values, q):
    """The q-quantile is non-decreasing in q (order statistics, linear interpolation),
    so a larger q never gives a smaller ball."""
    assume(q <= 0.9)
    distances = torch.tensor(values, dtype=F64).view(1, 1, -1)
    low = QuantileRadius(q)(distances, 0).item()
    high = QuantileRadius(q + 0.1)(distances, 0).item()
    assert high >= low * (1 - 1e-15) - 1e-300


# --------------------------------------------------------------------------------------
# undecided(lower, upper): which points the "gram" evaluation must compute exactly
# --------------------------------------------------------------------------------------


def _interval_problem(seed: int, b: int, k: int, n: int, infinite: int, exact_share: float):
    """True distances [B, K, N] (a few infinite: inadmissible points), and intervals
    around them: some exact, the others of random widths on both sides."""
    g = torch.Generator().manual_seed(seed)
    true = torch.rand(b, k, n, generator=g, dtype=F64) * 10
    true[..., :infinite] = math.inf
    below = torch.rand(b, k, n, generator=g, dtype=F64) * torch.rand(b, k, 1, generator=g, dtype=F64) * 3
    above = torch.rand(b, k, n, generator=g, dtype=F64) * torch.rand(b, k, 1, generator=g, dtype=F64) * 3
    exact = torch.rand(b, k, n, generator=g) < exact_share
    lower = torch.where(exact, true, (true - below).clamp_min(0))
    upper = torch.where(exact, true, true + above)
    return true, lower, upper


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(1, 3),
    k=st.integers(1, 3),
    n=st.integers(1, 40),
    infinite=st.integers(0, 5),
    exact_share=st.floats(0.0, 1.0),
    name=st.sampled_from(["fixed", "theory", "quantile", "quantile_strict_factor", "quantile_official", "cd", "cd_kmeans"]),
    q=st.floats(0.0, 1.0),
)
def test_undecided_points_are_all_that_tau_and_memberships_need(seed, b, k, n, infinite, exact_share, name, q):
    """Given intervals lower <= dist <= upper, a policy's ``undecided`` points are
    enough: with their exact distances and any other point standing at the lower end
    of its interval, the policy returns the same radius (bit for bit) and every point
    gets the same membership as with all distances exact.  This is what lets the
    "gram" Threshold-Clustering read only those points."""
    policy = {
        "fixed": FixedRadius(4.0),
        "theory": TheoryRadius(delta=0.5, sigma=2.0, separation=9.0),
        "quantile": QuantileRadius(q),
        "quantile_strict_factor": QuantileRadius(q, factor=0.6, strict=True),
        "quantile_official": QuantileRadius(q, rule="official"),
        "cd": CenterDistanceRadius(iterations=5),
        "cd_kmeans": CenterDistanceRadius(fit="kmeans++"),
    }[name]
    true, lower, upper = _interval_problem(seed, b, k, n, min(infinite, n - 1), exact_share)
    need = policy.undecided(lower, upper)
    assert need.shape == true.shape and need.dtype == torch.bool
    stand_in = torch.where(need, true, lower)
    tau_true, tau_stand_in = policy(true, 0), policy(stand_in, 0)
    assert torch.equal(tau_true, tau_stand_in)
    inside = (lambda d: d < tau_true.unsqueeze(-1)) if policy.strict else (lambda d: d <= tau_true.unsqueeze(-1))
    assert torch.equal(inside(true), inside(stand_in))


def test_undecided_quantile_hand_example():
    """q = 0.5 of 5 points reads rank 2.  Intervals [0, 1], [2, 3], [4, 6], [5, 7],
    [9, 9]: the rank-2 distance lies in [4, 7] (3rd smallest lower, 3rd smallest upper),
    so the points meeting [4, 7] (the 3rd and 4th) are undecided, and the radius lies in
    [quantile(lower), quantile(upper)] = [4, 6], which the same two points meet."""
    lower = torch.tensor([[[0.0, 2.0, 4.0, 5.0, 9.0]]], dtype=F64)
    upper = torch.tensor([[[1.0, 3.0, 6.0, 7.0, 9.0]]], dtype=F64)
    need = QuantileRadius(0.5).undecided(lower, upper)
    assert need.tolist() == [[[False, False, True, True, False]]]
    fixed = FixedRadius(2.5).undecided(lower, upper)
    assert fixed.tolist() == [[[False, True, False, False, False]]]
