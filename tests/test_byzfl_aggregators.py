"""The ByzFL aggregators of :mod:`defenses.aggregators` (MDA, MoNNA, Meamed,
CAF, SMEA) against straightforward NumPy implementations of their papers'
definitions, written here with plain loops over subsets, rows and coordinates, on
random and tie-heavy instances with NaN / Inf / overflowing rows mixed in; the
conformance checks; ``check(n)``'s refusals; hand-computed cases."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import defenses.aggregators.subset_search as subset_search
from defenses.aggregators import CovarianceBoundAgnosticFilter, Meamed, MinimumDiameterAveraging, MoNNA, SmallestMaximumEigenvalueAveraging
from defenses.conformance import check_aggregator
from defenses.aggregators import AGGREGATORS, describe, make_aggregator

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
NAMES = ["mda", "monna", "meamed", "caf", "smea"]
FAST = settings(max_examples=40, deadline=None)
HOSTILE = [math.nan, math.inf, -math.inf, 1e308]  # 1e308: finite, but its squared norm overflows


# -- independent references (the papers' definitions, plain loops) -----------------------------
def ref_mda(x: np.ndarray, f: int) -> np.ndarray:
    """argmin over subsets of size n - f of the largest pairwise distance; first wins."""
    n = len(x)
    best, chosen = math.inf, None
    for subset in itertools.combinations(range(n), n - f):
        diameter = 0.0
        for i in subset:
            for j in subset:
                diameter = max(diameter, float(np.sum((x[i] - x[j]) ** 2)))
        if diameter < best:
            best, chosen = diameter, subset
    return x[list(chosen)].mean(0)


def covariance_top(x: np.ndarray, weights: np.ndarray | None = None) -> tuple[float, np.ndarray, np.ndarray]:
    """(lambda_max, v, mu) of the (weighted) empirical d x d covariance."""
    w = np.full(len(x), 1.0 / len(x)) if weights is None else weights / weights.sum()
    mu = (w[:, None] * x).sum(0)
    sigma = np.zeros((x.shape[1], x.shape[1]))
    for i in range(len(x)):
        sigma += w[i] * np.outer(x[i] - mu, x[i] - mu)
    values, vectors = np.linalg.eigh(sigma)
    return float(values[-1]), vectors[:, -1], mu


def ref_smea(x: np.ndarray, f: int) -> np.ndarray:
    n = len(x)
    best, chosen = math.inf, None
    for subset in itertools.combinations(range(n), n - f):
        top = covariance_top(x[list(subset)])[0]
        if top < best:
            best, chosen = top, subset
    return x[list(chosen)].mean(0)


def ref_monna(x: np.ndarray, f: int, centre: int) -> np.ndarray:
    """The n - f rows nearest to x[centre] (itself included), ties to the lower index."""
    distances = [float(np.sum((row - x[centre]) ** 2)) for row in x]
    order = sorted(range(len(x)), key=lambda j: (distances[j], j))
    return x[order[: len(x) - f]].mean(0)


def ref_meamed(x: np.ndarray, f: int) -> np.ndarray:
    """Per coordinate, the n - f values nearest the median, ties to the lower value."""
    n, d = x.shape
    out = np.zeros(d)
    for k in range(d):
        column = x[:, k]
        median = np.median(column)
        values = sorted(column, key=lambda v: (abs(v - median), v))
        out[k] = np.mean(values[: n - f])
    return out


def ref_caf(x: np.ndarray, f: int) -> np.ndarray:
    """CAF as ByzFL states it, exact eigenpair, tau's maximum over weighted rows."""
    n = len(x)
    c = np.ones(n)
    best, best_mu = math.inf, x.mean(0)
    while c.sum() > n - 2 * f:
        top, v, mu = covariance_top(x, c)
        top = max(top, 0.0)
        if top < best:
            best, best_mu = top, mu
        tau = np.array([float((row - mu) @ v) ** 2 for row in x])
        tau_max = max(tau[i] for i in range(n) if c[i] > 0)
        if top <= 0 or tau_max <= 0:
            break
        c = c * np.clip(1 - tau / tau_max, 0, 1)
    return best_mu


def reference(name: str, x: np.ndarray, f: int, centre: int = 0) -> np.ndarray:
    """The rule on the admissible rows ``x`` with their effective ``f``."""
    f = min(f, (len(x) - 1) // 2)
    if name == "monna":
        return ref_monna(x, f, centre)
    return {"mda": ref_mda, "smea": ref_smea, "meamed": ref_meamed, "caf": ref_caf}[name](x, f)


def with_hostile_rows(honest: np.ndarray, hostile: list[float], seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """``honest`` rows with one row per ``hostile`` value mixed in at random positions:
    the messages and the positions of the honest rows."""
    n = len(honest) + len(hostile)
    rng = np.random.default_rng(seed)
    positions = np.sort(rng.permutation(n)[: len(honest)])
    x = np.zeros((n, honest.shape[1]))
    spoiled = np.setdiff1d(np.arange(n), positions)
    x[positions] = honest
    for row, value in zip(spoiled, hostile):
        x[row] = rng.normal(size=honest.shape[1])
        x[row, rng.integers(honest.shape[1])] = value  # one bad coordinate, or all
        if rng.random() < 0.5:
            x[row] = value
    return torch.from_numpy(x), positions


def honest_rows(seed: int, n: int, d: int, integers: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if integers:  # many exact ties
        return rng.integers(-3, 4, size=(n, d)).astype(np.float64)
    return rng.normal(size=(n, d)) + rng.normal(size=d) * 3


def make(name: str, f: int, idx: int = 0):
    return make_aggregator({"name": name, "f": f, **({"idx": idx} if name == "monna" else {})})


# -- agreement with the references ---------------------------------------------------------------
@FAST
@given(
    name=st.sampled_from(NAMES),
    m=st.integers(1, 7),
    d=st.integers(1, 4),
    hostile=st.lists(st.sampled_from(HOSTILE), max_size=3),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_each_rule_is_its_definition_on_the_admissible_rows(name, m, d, hostile, seed, data):
    """Continuous rows (no ties) with inadmissible rows anywhere: the aggregate is the
    reference rule applied to the admissible rows alone, with f shrunk to what they
    support."""
    x, positions = with_hostile_rows(honest_rows(seed, m, d, integers=False), hostile, seed)
    n = len(x)
    f = data.draw(st.integers(0, (n - 1) // 2))
    idx = data.draw(st.integers(0, n - 1))
    centre = int(np.searchsorted(positions, idx)) if idx in positions else 0
    out = make(name, f, idx)(x)
    expected = reference(name, x.numpy()[positions], f, centre)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-8, atol=1e-9)


@FAST
@given(
    name=st.sampled_from(["mda", "monna", "meamed"]),
    m=st.integers(1, 8),
    d=st.integers(1, 3),
    hostile=st.lists(st.sampled_from(HOSTILE), max_size=2),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_tie_breaking_follows_the_documented_rule(name, m, d, hostile, seed, data):
    """Small integer rows (many exact ties): MDA keeps the first subset in
    combinations order, MoNNA the lower index, Meamed the lower value, exactly."""
    x, positions = with_hostile_rows(honest_rows(seed, m, d, integers=True), hostile, seed)
    n = len(x)
    f = data.draw(st.integers(0, (n - 1) // 2))
    idx = data.draw(st.integers(0, n - 1))
    centre = int(np.searchsorted(positions, idx)) if idx in positions else 0
    expected = reference(name, x.numpy()[positions], f, centre)
    np.testing.assert_allclose(make(name, f, idx)(x).numpy(), expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**31 - 1), data=st.data())
def test_batched_problems_with_different_admissible_counts(name, seed, data):
    """[A, B, N, d] problems, each with its own hostile rows (none admissible
    included): each equals the reference on its admissible rows (zeros when none)."""
    n, d, f = 7, 3, 2
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.normal(size=(2, 3, n, d)) * rng.uniform(0.1, 10, size=(2, 3, 1, 1)))
    for a, b in itertools.product(range(2), range(3)):
        spoiled = data.draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True))
        for row in spoiled:
            x[a, b, row, data.draw(st.integers(0, d - 1))] = data.draw(st.sampled_from(HOSTILE))
    out = make(name, f)(x)
    assert out.shape == (2, 3, d) and bool(torch.isfinite(out).all())
    for a, b in itertools.product(range(2), range(3)):
        kept = torch.isfinite(x[a, b].square().sum(-1)).numpy()
        if not kept.any():
            assert torch.equal(out[a, b], torch.zeros(d, dtype=F64))
            continue
        centre = 0  # idx = 0: row 0 if admissible, else the first admissible row
        expected = reference(name, x[a, b].numpy()[kept], f, centre)
        np.testing.assert_allclose(out[a, b].numpy(), expected, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype, power", [(F64, 500), (F64, -500), (torch.float32, 58), (torch.float32, -60)])
def test_scaling_by_a_power_of_two_scales_the_aggregate_exactly(name, dtype, power):
    """Distances and covariances are taken on rows scaled to norm < 1, so rows near
    the overflow limit (|x| ~ 1e151 in float64, 1e18 in float32) give the same
    selection as ordinary ones, and the aggregate scales exactly."""
    x = torch.from_numpy(np.random.default_rng(3).normal(size=(3, 8, 4))).to(dtype)
    x[1, 2] = math.nan
    scale = 2.0**power
    big = x * scale
    assert bool(torch.isfinite(big.double().square().sum(-1)[torch.isfinite(x).all(-1)]).all())
    agg = make(name, 2)
    expected = agg(x) * scale
    assert bool(torch.isfinite(expected).all()) and torch.equal(agg(big), expected)


def test_subset_search_keeps_the_first_tie_across_chunks(monkeypatch):
    """One subset per chunk: the strict comparison keeps an earlier chunk's tie, as
    one chunk with all subsets does."""
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]], dtype=F64)  # every 4-window has diameter 3
    batched = torch.stack([x, x.flip(0), x + 1])
    whole = [MinimumDiameterAveraging(f=2)(batched), SmallestMaximumEigenvalueAveraging(f=2)(batched)]
    monkeypatch.setattr(subset_search, "_CHUNK_ELEMENTS", 1)
    chunked = [MinimumDiameterAveraging(f=2)(batched), SmallestMaximumEigenvalueAveraging(f=2)(batched)]
    for one, other in zip(whole, chunked):
        assert torch.equal(one, other)
    assert whole[0][0].item() == 1.5 and whole[0][1].item() == 3.5  # {0..3}, then {5..2} flipped
    assert whole[1][0].item() == 1.5  # same variance on every window: the first


# -- hand-computed cases -------------------------------------------------------------------------
def column(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64).unsqueeze(-1)


def test_mda_and_smea_drop_the_far_point_on_a_line():
    x = column(0, 1, 2, 10)  # {0, 1, 2}: diameter 2, variance 2/3; any set with 10 is wider
    assert MinimumDiameterAveraging(f=1)(x).item() == 1.0
    assert SmallestMaximumEigenvalueAveraging(f=1)(x).item() == 1.0
    # f = 0: the plain mean
    assert MinimumDiameterAveraging(f=0)(x).item() == 3.25


def test_mda_and_smea_differ_where_the_diameter_and_the_variance_disagree():
    """On the line 0, 0, 0, 4, 4.5 with f = 1 (4 of 5 kept) both keep {0, 0, 0, 4}:
    diameter 4 (the others 4.5), variance 3 (the others 3.80 and 4.55).  On
    0, 0, 4, 4, 5 they disagree: {0, 0, 4, 4} alone has diameter 4 (the others 5) but
    variance 4, while {0, 4, 4, 5} has variance 59/16 = 3.6875 (and {0, 0, 4, 5}
    83/16): MDA gives 2, SMEA 13/4."""
    x = column(0, 0, 0, 4, 4.5)
    assert MinimumDiameterAveraging(f=1)(x).item() == 1.0
    assert SmallestMaximumEigenvalueAveraging(f=1)(x).item() == 1.0
    y = column(0, 0, 4, 4, 5)
    assert MinimumDiameterAveraging(f=1)(y).item() == 2.0
    assert SmallestMaximumEigenvalueAveraging(f=1)(y).item() == 3.25
    # in the plane, SMEA's top eigenvalue is the largest directional variance
    z = torch.tensor([[0, 0], [3, 0], [0, 2.9], [3, 2.9], [6.1, 0]], dtype=F64)
    torch.testing.assert_close(SmallestMaximumEigenvalueAveraging(f=1)(z), torch.tensor([1.5, 1.45], dtype=F64))
    torch.testing.assert_close(MinimumDiameterAveraging(f=1)(z), torch.tensor([1.5, 1.45], dtype=F64))


def test_monna_averages_the_neighbourhood_of_the_trusted_row():
    x = column(0, 1, 3, 10)
    assert MoNNA(f=1)(x).item() == pytest.approx(4 / 3)  # {0, 1, 3}
    assert MoNNA(f=1, idx=2)(x).item() == pytest.approx(4 / 3)  # distances 3, 2, 0, 7
    assert MoNNA(f=1, idx=3)(x).item() == pytest.approx(14 / 3)  # {10, 3, 1}
    # a tie (1 and -1 both at distance 1 from 0) goes to the lower index
    assert MoNNA(f=1)(column(0, 1, -1)).item() == 0.5
    # the trusted row inadmissible: the first admissible row is the centre
    assert MoNNA(f=1, idx=1)(column(10, math.nan, 0, 1, 3)).item() == pytest.approx(14 / 3)


def test_meamed_means_the_values_nearest_the_median():
    # median 1; distances 1, 0, 1, 9, 6: keep 1, 0, 2 (n - f = 3)
    assert Meamed(f=2)(column(0, 1, 2, 10, -5)).item() == 1.0
    # median 0, -1 and 1 tie: the lower value
    assert Meamed(f=1)(column(-1, 0, 1)).item() == -0.5
    assert Meamed(f=1)(column(1, 0, -1)).item() == -0.5  # whatever the rows' order
    # even count: the statistical median (1.5 of 0, 1, 2, 10), nearest 1 and 2
    assert Meamed(f=1)(column(0, 1, 2, 10)).item() == pytest.approx(1.0)  # keep 3: 1, 2, then 0 (1.5) before 10
    # per coordinate independently
    x = torch.tensor([[0, 100], [1, 101], [2, -50], [10, 102]], dtype=F64)
    torch.testing.assert_close(Meamed(f=1)(x), torch.tensor([1.0, 101.0], dtype=F64))


def test_caf_by_hand():
    """x = 0, 1, 5, f = 1.  Round 1: mu = 2, lambda = 14/3, tau = 4, 1, 9 -> c = 5/9,
    8/9, 0 (sum 13/9 > 1).  Round 2: mu = 8/13, lambda = 40/169 < 14/3, tau = 64/169,
    25/169 -> c = 0, 39/72 (sum <= 1: stop).  Output 8/13."""
    assert CovarianceBoundAgnosticFilter(f=1)(column(0, 1, 5)).item() == pytest.approx(8 / 13, rel=1e-12)
    # a zero covariance stops at once: identical rows, their value
    assert CovarianceBoundAgnosticFilter(f=1)(column(2, 2, 2)).item() == 2.0
    # f = 0: the mean (ByzFL returns None there)
    assert CovarianceBoundAgnosticFilter(f=0)(column(0, 1, 5)).item() == 2.0


# -- conformance, options, check(n) ------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_conformance(name):
    check_aggregator(name)
    check_aggregator({"name": name, "fraction": 0.3})


@pytest.mark.parametrize("name", NAMES)
def test_registered_with_summary_reference_and_validated_options(name):
    cls = AGGREGATORS[name]
    assert cls.name == name and cls.summary.strip() and "\n" not in cls.summary and cls.reference.strip()
    info = describe(cls)
    assert set(info["parameters"]) == {field.name for field in dataclasses.fields(cls)}
    assert set(info["descriptions"]) == set(info["parameters"])
    for field in dataclasses.fields(cls):
        with pytest.raises(ValueError, match=rf"{name}\.{field.name}"):
            cls(**{field.name: "bogus"})
        with pytest.raises(ValueError, match=rf"{name}\.{field.name}.*got True"):
            cls(**{field.name: True})
    with pytest.raises(ValueError, match=rf"{name}\.f and {name}\.fraction"):
        cls(f=1, fraction=0.1)
    with pytest.raises(ValueError, match=name):
        cls().check(0)
    cls().check(9)


@pytest.mark.parametrize("name", NAMES)
def test_check_refuses_two_f_at_least_n(name):
    with pytest.raises(ValueError, match=rf"{name}: needs 2\*f < n, got f=2, n=4"):
        make(name, 2).check(4)
    with pytest.raises(ValueError, match=rf"{name}: needs 2\*f < n, got f=2, n=4"):
        make(name, 2)(torch.zeros(4, 2))
    make(name, 2).check(5)


@pytest.mark.parametrize("cls", [MinimumDiameterAveraging, SmallestMaximumEigenvalueAveraging])
def test_subset_rules_refuse_more_subsets_than_the_cap(cls):
    name = cls.name
    message = rf"{name}: enumerates C\(n, f\) = C\(40, 10\) = 847660528 subsets, more than max_subsets=1000000"
    with pytest.raises(ValueError, match=message):
        cls(f=10).check(40)
    with pytest.raises(ValueError, match=message):  # at call time, before any work
        cls(f=10)(torch.zeros(40, 3))
    cls(f=3).check(40)  # C(40, 3) = 9880
    with pytest.raises(ValueError, match=r"C\(40, 3\) = 9880 subsets, more than max_subsets=9879"):
        cls(f=3, max_subsets=9879).check(40)
    with pytest.raises(ValueError, match=r"C\(30, 14\)"):  # a fraction's f counts too
        cls(fraction=0.49).check(30)


def test_monna_refuses_an_idx_beyond_n():
    with pytest.raises(ValueError, match=r"monna: needs idx < n, got idx=5, n=5"):
        MoNNA(idx=5).check(5)
    MoNNA(idx=4).check(5)


@pytest.mark.parametrize("name", NAMES)
def test_empty_dimension_and_single_row(name):
    assert make(name, 0)(torch.zeros(3, 4, 0)).shape == (3, 0)
    row = torch.tensor([[1.5, -2.0]], dtype=F64)
    assert torch.equal(make(name, 0)(row), row[0])
    # one admissible row of three (f shrinks to 0): that row
    x = torch.tensor([[math.nan, 0.0], [1.5, -2.0], [math.inf, 1.0]], dtype=F64)
    assert torch.equal(make(name, 1)(x), row[0])


def test_large_byzantine_rows_are_resisted():
    """Two colluding far rows of 9 (f = 2): every rule stays near the honest mean
    (MoNNA centred on an honest row); MoNNA centred on a Byzantine row follows it, as
    documented (its centre is trusted)."""
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(9, 5)))
    honest_mean = x[2:].mean(0)
    x[:2] = 1e6 + torch.from_numpy(rng.normal(size=(2, 5)))
    for name in NAMES:
        out = make(name, 2, idx=4)(x)
        assert torch.linalg.vector_norm(out - honest_mean) < 2.0, name
    assert torch.linalg.vector_norm(MoNNA(f=2, idx=0)(x) - honest_mean) > 1e5


@pytest.mark.parametrize("name", NAMES)
def test_float32_rows_agree_with_the_float64_reference(name):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 7, 3)) * 10.0 ** rng.integers(-3, 4, size=(4, 1, 1))
    out = make(name, 2)(torch.from_numpy(x).float())
    assert out.dtype == torch.float32
    for p in range(4):
        expected = reference(name, x[p].astype(np.float32).astype(np.float64), 2)
        np.testing.assert_allclose(out[p].numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(x[p]).max())
