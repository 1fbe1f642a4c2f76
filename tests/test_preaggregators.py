"""Pre-aggregators (:mod:`defenses.aggregators`): NNM (Allouah et al. 2023),
bucketing (Karimireddy et al. 2022, Alg. 1), static clipping and ARC (Allouah et al.
2024), and their composition with any aggregator through ``pre``.

Each step is compared with a straightforward reference written here from the
paper's definition (loops over rows, NumPy in float64) on random inputs drawn by
hypothesis, hostile rows (NaN, +-Inf, 1e38) included: the rule under test is that
inadmissible rows are dropped before each step (they influence no output row, and
their own output position is inadmissible, a NaN row).
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from defenses.baselines import GlobalParams
from defenses.conformance import check_aggregator
from defenses.aggregators import PRE_AGGREGATORS, AdaptiveRobustClipping, BucketMeans, NearestNeighbourMixing, PreAggregated, StaticClipping, describe, make_pre_aggregator
from defenses.aggregators import Bucketing, CoordinateMedian, Krum, make_aggregator

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
FAST = settings(max_examples=100, deadline=None)
seeds = st.integers(0, 2**31 - 1)
KINDS = ("honest", "honest", "honest", "big", "nan", "inf", "-inf", "1e38")


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rows_of(seed: int, lead: tuple[int, ...], n: int, d: int, kinds: list[str], dtype: torch.dtype) -> torch.Tensor:
    """``[*lead, n, d]`` Gaussian rows; row ``i`` of every problem replaced as ``kinds[i]``
    says (``big``: an admissible row of norm ~1e15; the others inadmissible)."""
    g = seeded(seed)
    x = torch.randn(*lead, n, d, generator=g, dtype=F64)
    for i, kind in enumerate(kinds):
        if kind == "big":
            x[..., i, :] *= 1e15
        elif kind != "honest":
            x[..., i, :] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "1e38": 1e38}[kind]
            if kind == "1e38" and dtype == F64 and d:
                x[..., i, 0] = math.inf  # 1e38 is admissible in float64
    return x.to(dtype)


@st.composite
def problems(draw, most: int = 10):
    """(x, dtype) with 1..most rows, some of them hostile, and 0..2 leading dimensions."""
    n = draw(st.integers(1, most))
    d = draw(st.integers(0, 4))
    lead = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n))
    dtype = draw(st.sampled_from([torch.float32, F64]))
    return rows_of(draw(seeds), lead, n, d, kinds, dtype), dtype


def budgets():
    return st.one_of(st.builds(dict, f=st.integers(0, 4)), st.builds(dict, fraction=st.floats(0, 0.49)), st.just({}))


# -- references, one problem [n, d] at a time, from the papers' definitions ---------------
def admissible_rows(x: np.ndarray) -> np.ndarray:
    """Rows with finite coordinates and a finite squared norm in their own dtype."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array([np.isfinite(np.sum(row * row)) for row in x], dtype=bool)


def reference_f(options: dict, n: int) -> int:
    wanted = math.floor(options["fraction"] * n) if "fraction" in options else options.get("f", 1)
    return max(min(wanted, (n - 1) // 2), 0)


def each_problem(reference, x: torch.Tensor) -> torch.Tensor:
    """``reference`` (one ``[n, d]`` float64 array and its admissible mask -> ``[n, d]``
    with NaN rows) applied to every problem of ``x[..., n, d]``."""
    flat = x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:])
    outs = [reference(problem.astype(np.float64), admissible_rows(problem)) for problem in flat.numpy()]
    return torch.from_numpy(np.stack(outs)).reshape(x.shape).to(x.dtype)


def nnm_reference(options: dict):
    def reference(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
        out = np.full_like(x, np.nan)
        kept = np.flatnonzero(ok)
        k = len(kept) - reference_f(options, len(kept))
        for i in kept:
            distances = [float(np.sum((x[i] - x[j]) ** 2)) for j in kept]
            nearest = kept[np.argsort(distances, kind="stable")[:k]]
            out[i] = np.mean(x[nearest], axis=0)
        return out

    return reference


def clip(row: np.ndarray, bound: float) -> np.ndarray:
    norm = float(np.linalg.norm(row))
    return row * (bound / norm) if norm > bound else row


def clipping_reference(tau: float):
    def reference(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
        return np.array([clip(row, tau) if keep else np.full_like(row, np.nan) for row, keep in zip(x, ok)])

    return reference


def arc_reference(options: dict):
    """ARC (Allouah et al. 2024, Alg. 1): k = floor(2 (f/n)(n - f)), clip to the norm of
    the (k+1)-th largest-norm row."""

    def reference(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
        out = np.full_like(x, np.nan)
        kept = np.flatnonzero(ok)
        n = len(kept)
        if n == 0:
            return out
        f = reference_f(options, n)
        k = math.floor(Fraction(2 * f * (n - f), n))
        norms = sorted((float(np.linalg.norm(x[i])) for i in kept), reverse=True)
        for i in kept:
            out[i] = clip(x[i], norms[k])
        return out

    return reference


def bucketing_reference(s: int, keys: np.ndarray):
    """Alg. 1 lines 1-2: the admissible rows in increasing order of their random key
    (the permutation), means of consecutive groups of s; ceil(N / s) rows, NaN where
    no admissible row falls in a bucket."""

    def reference(x: np.ndarray, ok: np.ndarray, problem_keys: np.ndarray) -> np.ndarray:
        order = [i for i in sorted(range(len(x)), key=lambda i: problem_keys[i]) if ok[i]]
        buckets = math.ceil(len(x) / s)
        out = np.full((buckets, x.shape[1]), np.nan)
        for b in range(buckets):
            members = order[b * s:(b + 1) * s]
            if members:
                out[b] = np.mean(x[members], axis=0)
        return out

    return reference


def refused(step, x: torch.Tensor) -> bool:
    """True when ``step`` refuses ``x``'s row count up front (and its call raises too)."""
    try:
        step.check(x.shape[-2])
    except ValueError as error:
        assert "needs 2*f < n" in str(error)
        with pytest.raises(ValueError, match=step.name):
            step(x)
        return True
    return False


def assert_matches(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.shape == expected.shape and out.dtype == expected.dtype
    tolerance = dict(rtol=2e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out, expected, equal_nan=True, **tolerance)


# -- each step against its reference ---------------------------------------------------------
@FAST
@given(problem=problems(), options=budgets())
def test_nnm_is_the_mean_of_the_n_minus_f_nearest_admissible_rows(problem, options):
    x, dtype = problem
    step = NearestNeighbourMixing(**options)
    if refused(step, x):
        return
    out = step(x)
    assert_matches(out, each_problem(nnm_reference(options), x), dtype)


@FAST
@given(problem=problems(), tau=st.floats(1e-3, 10.0))
def test_static_clipping_scales_each_admissible_row_to_norm_at_most_tau(problem, tau):
    x, dtype = problem
    out = StaticClipping(tau=tau)(x)
    assert_matches(out, each_problem(clipping_reference(tau), x), dtype)
    norms = torch.linalg.vector_norm(out.double(), dim=-1)
    assert bool((norms[~norms.isnan()] <= tau * (1 + 1e-5)).all())


@FAST
@given(problem=problems(), options=budgets())
def test_arc_clips_the_k_largest_rows_to_the_next_largest_norm(problem, options):
    x, dtype = problem
    step = AdaptiveRobustClipping(**options)
    if refused(step, x):
        return
    out = step(x)
    assert_matches(out, each_problem(arc_reference(options), x), dtype)


@FAST
@given(problem=problems(), s=st.integers(1, 4), seed=seeds, use_generator=st.booleans())
def test_bucketing_means_buckets_of_s_permuted_admissible_rows(problem, s, seed, use_generator):
    x, dtype = problem
    n = x.shape[-2]
    out = BucketMeans(s=s)(x, seeded(seed) if use_generator else None)
    if use_generator:  # the permutation: the order of one float64 uniform key per row
        keys = torch.rand((*x.shape[:-2], n), generator=seeded(seed), dtype=F64)
    else:
        keys = torch.arange(n, dtype=F64).expand(*x.shape[:-2], n)
    problems_count = math.prod(x.shape[:-2])
    flat_x, flat_keys = x.reshape(problems_count, n, x.shape[-1]).numpy(), keys.reshape(problems_count, n).numpy()
    reference = bucketing_reference(s, keys)
    expected = [reference(p.astype(np.float64), admissible_rows(p), k) for p, k in zip(flat_x, flat_keys)]
    expected = torch.from_numpy(np.stack(expected)).reshape(*x.shape[:-2], math.ceil(n / s), x.shape[-1])
    assert_matches(out, expected.to(dtype), dtype)


def test_arc_example_of_byzfl_and_k_counts():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=F64)
    # f = 1, n = 3: k = floor(2 * 2 / 3) = 1, the largest row clipped to ||(4, 5, 6)||
    out = AdaptiveRobustClipping(f=1)(x)
    torch.testing.assert_close(out[:2], x[:2])
    torch.testing.assert_close(out[2], x[2] * (x[1].norm() / x[2].norm()))
    # n = 10, f = 3: k = floor(2 * 3 * 7 / 10) = 4 rows clipped, to the 5th largest norm
    y = torch.arange(1, 11, dtype=F64).unsqueeze(-1)
    torch.testing.assert_close(AdaptiveRobustClipping(f=3)(y), y.clamp_max(6.0))
    torch.testing.assert_close(AdaptiveRobustClipping(f=0)(y), y)


def test_clipping_at_the_boundary():
    tau = 2.0
    x = torch.tensor([[tau * 1.0001, 0.0], [0.0, tau * 0.9999], [0.0, 0.0], [3.0, 4.0]], dtype=F64)
    out = StaticClipping(tau=tau)(x)
    torch.testing.assert_close(out, torch.tensor([[tau, 0.0], [0.0, tau * 0.9999], [0.0, 0.0], [1.2, 1.6]], dtype=F64))
    y = torch.tensor([[1.0], [2.0], [3.0], [3.0003]], dtype=F64)  # f = 1, n = 4: k = 1, clipped to 3
    torch.testing.assert_close(AdaptiveRobustClipping(f=1)(y), torch.tensor([[1.0], [2.0], [3.0], [3.0]], dtype=F64))


def test_nnm_example_of_byzfl_and_duplicates():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=F64)
    expected = torch.tensor([[2.5, 3.5, 4.5], [2.5, 3.5, 4.5], [5.5, 6.5, 7.5]], dtype=F64)
    torch.testing.assert_close(NearestNeighbourMixing(f=1)(x), expected)
    torch.testing.assert_close(NearestNeighbourMixing(f=0)(x), x.mean(0).expand(3, 3))
    twins = torch.tensor([[0.0], [0.0], [0.0], [10.0], [11.0]], dtype=F64)  # f = 2: 3 neighbours
    torch.testing.assert_close(NearestNeighbourMixing(f=2)(twins)[:, 0], torch.tensor([0, 0, 0, 7, 7], dtype=F64))


@pytest.mark.parametrize("spec", ["nnm", "arc", {"name": "clipping", "tau": 0.5}, {"name": "bucketing", "s": 3}])
def test_inadmissible_rows_influence_no_row_and_stay_inadmissible(spec):
    step = make_pre_aggregator(spec)
    x = rows_of(3, (), 10, 4, ["honest"] * 10, torch.float32)
    x[1], x[4, 2], x[7] = math.nan, -math.inf, 1e38
    kept = torch.ones(10, dtype=torch.bool)
    kept[[1, 4, 7]] = False
    out, alone = step(x), step(x[kept])  # no generator: bucketing keeps the given order
    if isinstance(step, BucketMeans):
        torch.testing.assert_close(out[: alone.shape[0]], alone)
        assert bool(out[alone.shape[0]:].isnan().all())
    else:
        torch.testing.assert_close(out[kept], alone)
        assert bool(out[~kept].isnan().all())
    x[1], x[4], x[7] = math.inf, math.nan, -1e38  # other hostile values: the same output
    assert torch.equal(step(x).nan_to_num(7.0), out.nan_to_num(7.0))


# -- composition ------------------------------------------------------------------------------
@FAST
@given(problem=problems(most=12), seed=seeds,
       chain=st.lists(st.sampled_from(["nnm", "arc", "clipping", "bucketing"]), min_size=1, max_size=3),
       inner=st.sampled_from(["mean", "median", "trimmed_mean", "geometric_median"]))
def test_a_chain_is_its_steps_applied_by_hand(problem, seed, chain, inner):
    x, _ = problem
    spec = {"name": inner, "pre": chain}
    agg = make_aggregator(spec)
    assert isinstance(agg, PreAggregated) and [step.name for step in agg.pre] == chain
    try:
        agg.check(x.shape[-2])
    except ValueError as error:  # NNM or ARC with 2f >= n: refused up front, and at call time
        assert "needs 2*f < n" in str(error)
        with pytest.raises(ValueError, match=r"needs 2\*f < n"):
            agg(x, None, seeded(seed))
        return
    out = agg(x, None, seeded(seed))
    g = seeded(seed)  # one stream, drawn by the steps in order, then by the aggregator
    by_hand = x
    for name in chain:
        by_hand = make_pre_aggregator(name)(by_hand, g)
    expected = make_aggregator(inner)(by_hand, None, g)
    torch.testing.assert_close(out, expected, equal_nan=False)
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("spec", [
    {"name": "krum", "pre": ["nnm", {"name": "clipping", "tau": 1.0}]},
    {"name": "median", "pre": ["arc"]},
    {"name": "mean", "pre": [{"name": "bucketing", "s": 2}]},
    {"name": "trimmed_mean", "f": 2, "pre": [{"name": "nnm", "fraction": 0.3}, "arc"]},
], ids=["krum+nnm+clipping", "median+arc", "mean+bucketing", "trimmed_mean+nnm+arc"])
def test_chains_pass_the_conformance_checks(spec):
    check_aggregator(make_aggregator(spec))


@FAST
@given(seed=seeds, n=st.integers(5, 11), d=st.integers(1, 4), s=st.integers(1, 3),
       inner=st.sampled_from(["mean", "median", "krum"]))
def test_bucketing_pre_aggregator_equals_the_bucketing_aggregator(seed, n, d, s, inner):
    x = rows_of(seed, (2,), n, d, ["nan"] + ["honest"] * (n - 1), F64)
    old = make_aggregator({"name": "bucketing", "inner": inner, "s": s})
    new = make_aggregator({"name": inner, "pre": [{"name": "bucketing", "s": s}]})
    try:
        old.check(n)
    except ValueError:  # krum refuses so few buckets: both spellings alike
        with pytest.raises(ValueError, match=r"krum: needs n > 2\*f \+ 2"):
            new.check(n)
        return
    assert torch.equal(old(x, None, seeded(seed)), new(x, None, seeded(seed)))


def test_old_bucketing_spelling_still_works():
    agg = make_aggregator({"name": "bucketing", "inner": "median", "s": 2})
    assert agg == Bucketing(inner="median", s=2) and agg.inner == CoordinateMedian()
    check_aggregator(agg)
    nested = make_aggregator({"name": "bucketing", "inner": {"name": "krum", "pre": ["nnm"]}, "s": 1})
    assert isinstance(nested.inner, PreAggregated) and nested.inner.inner == Krum()


def test_an_empty_pre_list_is_the_aggregator_itself():
    assert make_aggregator({"name": "krum", "f": 2, "pre": []}) == Krum(f=2)


def test_chains_are_frozen_comparable_and_picklable():
    spec = {"name": "krum", "pre": ["nnm", {"name": "clipping", "tau": 1.0}]}
    agg = make_aggregator(spec)
    assert agg == make_aggregator(spec) and hash(agg) == hash(make_aggregator(spec))
    assert pickle.loads(pickle.dumps(agg)) == agg
    assert agg == PreAggregated(inner=make_aggregator("krum"), pre=["nnm", {"name": "clipping", "tau": 1.0}])
    with pytest.raises(ValueError, match="pre_aggregated.inner must be an Aggregator"):
        PreAggregated(inner="krum", pre=["nnm"])  # specs are built by make_aggregator, not here
    with pytest.raises(dataclasses.FrozenInstanceError):
        agg.inner = None
    assert GlobalParams(aggregator=spec).aggregator == agg


def test_registry_and_descriptions():
    assert set(PRE_AGGREGATORS) == {"nnm", "bucketing", "clipping", "arc"}
    for name, cls in PRE_AGGREGATORS.items():
        info = describe(cls)
        assert info["name"] == name and cls.summary.strip() and "\n" not in cls.summary and cls.reference.strip()
        assert set(info["descriptions"]) == {field.name for field in dataclasses.fields(cls)}
    assert describe(StaticClipping)["parameters"] == {"tau": 2.0}
    assert describe(NearestNeighbourMixing)["parameters"] == {"f": None, "fraction": None}


# -- bad specs ----------------------------------------------------------------------------------
BAD = [
    ({"name": "krum", "pre": ["nmm"]}, r"krum\.pre\[0\]\.name must be one of \['arc', .*got 'nmm' \(did you mean 'nnm'\?\)"),
    ({"name": "krum", "pre": ["nnm", {"name": "clipping", "tau": 0.0}]},
     r"krum\.pre\[1\]: clipping\.tau must be a finite number > 0, got 0\.0"),
    ({"name": "median", "pre": [{"name": "clipping", "tau": -1.0}]}, r"median\.pre\[0\]: clipping\.tau"),
    ({"name": "median", "pre": [{"name": "clipping", "tau": math.inf}]}, r"median\.pre\[0\]: clipping\.tau"),
    ({"name": "krum", "pre": "nnm"}, r"krum\.pre must be a list of pre-aggregators"),
    ({"name": "krum", "pre": {"name": "nnm"}}, r"krum\.pre must be a list"),
    ({"name": "krum", "pre": 3}, r"krum\.pre must be a list"),
    ({"name": "mean", "pre": [{"name": "clipping", "c": 1.0}]},
     r"mean\.pre\[0\]: clipping\.c is not an option; pre-aggregator 'clipping' accepts the fields: tau"),
    ({"name": "mean", "pre": [{"name": "nnm", "f": 1, "fraction": 0.1}]}, r"mean\.pre\[0\]: nnm\.f and nnm\.fraction"),
    ({"name": "mean", "pre": [{"name": "arc", "fraction": 0.5}]}, r"mean\.pre\[0\]: arc\.fraction must be a number in"),
    ({"name": "mean", "pre": [{"name": "bucketing", "s": 0}]}, r"mean\.pre\[0\]: bucketing\.s must be an integer >= 1"),
    ({"name": "mean", "pre": [{"s": 2}]}, r"mean\.pre\[0\]\.name must be one of"),
    ({"name": "mean", "pre": [None]}, r"mean\.pre\[0\] must be a name or a mapping"),
    ({"name": "meen", "pre": ["nnm"]}, r"aggregator\.name must be one of"),
]


@pytest.mark.parametrize("spec, message", BAD)
def test_bad_specs_raise_naming_the_field(spec, message):
    with pytest.raises(ValueError, match=message):
        make_aggregator(spec)
    with pytest.raises(ValueError, match="aggregator"):
        GlobalParams(aggregator=spec)


def test_check_refuses_an_n_a_step_or_the_aggregator_cannot_work_with():
    with pytest.raises(ValueError, match=r"krum\.pre\[0\] \(6 rows of n=6\): nnm: needs 2\*f < n, got f=3, n=6"):
        make_aggregator({"name": "krum", "pre": [{"name": "nnm", "f": 3}]}).check(6)
    with pytest.raises(ValueError, match=r"krum after its pre-aggregation \(4 rows of n=8\): krum: needs n > 2\*f"):
        make_aggregator({"name": "krum", "pre": [{"name": "bucketing", "s": 2}]})(torch.zeros(8, 2))
    make_aggregator({"name": "krum", "pre": [{"name": "bucketing", "s": 2}]}).check(9)
    with pytest.raises(ValueError, match=r"arc: needs at least one row"):
        AdaptiveRobustClipping()(torch.zeros(0, 2))


def test_global_runs_with_a_pre_aggregated_aggregator_under_large_rows():
    import defenses
    from defenses.conformance import HostileRows
    from robust_pfl import Federation
    from robust_pfl.engine.tasks import SyntheticLinearRegression

    task = SyntheticLinearRegression(clusters=2, clients_per_cluster=4, dim=5, samples_per_client=6,
                                     validation_samples=4, test_samples=4, scale=10.0).build(0, byzantine_total=2,
                                                                                            dtype=F64)
    fed = Federation(task.objective, task.train, task.cluster_ids, task.byzantine, 0, 4, HostileRows(1e6, 200.0))
    spec = {"name": "krum", "pre": ["nnm", {"name": "clipping", "tau": 1.0}]}
    algo = defenses.build("global", fed, {"lr": 1e-3, "aggregator": spec})
    for t in range(3):
        record = algo.step(t)
        assert bool(torch.isfinite(record.updates).all())
        assert float(torch.linalg.vector_norm(record.updates[0])) <= 1.0 + 1e-9  # Krum picks a clipped row
    with pytest.raises(ValueError, match=r"krum after its pre-aggregation"):
        defenses.build("global", fed, {"aggregator": {"name": "krum", "f": 2, "pre": [{"name": "bucketing", "s": 2}]}})
