"""Werner et al.'s exact statements, lemmas and false-as-printed claims
(theory_checks.statements: clustering_steps, lemmas, false_claims, search).

Property tests run hypothesis over the public evaluators; the false claims are
re-evaluated here, independently, in plain numpy float64; hand-computed cases pin the
formulas."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from defenses import threshold_clustering
from theory_checks.statements import clustering_steps, false_claims, instances, lemmas, search
from theory_checks.statements import registry

pytestmark = pytest.mark.usefixtures("single_thread")

METHODS = ("direct", "gram", "pairwise")
TOL = 1e-9
EXACT = ("one-step-move", "replacement", "contraction", "edge-attacker", "lemma1-A", "lemma7", "lemma14", "descent")
CORRECTED = ("lemma1-pair", "var-y-le-second-moment", "thm3.2-corrected")
FALSE = ("lemma1-max", "var-y-le-var-z", "thm3.2-constant")

coordinates = st.floats(-5.0, 5.0, allow_nan=False, allow_infinity=False)
radii = st.floats(0.05, 5.0, allow_nan=False, allow_infinity=False)
seeds = st.integers(0, 2**32 - 1)


@st.composite
def clouds(draw, batch: int = 2):
    """``points[B, N, d]``, ``centre[B, d]`` and a radius, small and arbitrary."""
    clients, dim = draw(st.integers(1, 8)), draw(st.integers(1, 3))
    points = draw(hnp.arrays(np.float64, (batch, clients, dim), elements=coordinates))
    centre = draw(hnp.arrays(np.float64, (batch, dim), elements=coordinates))
    return points, centre, draw(radii)


# ------------------------------------------------------------------ registry and budget

def test_every_statement_is_registered_with_its_kind():
    for name in EXACT:
        assert registry.STATEMENTS[name].kind == "exact"
    for name in CORRECTED:
        assert registry.STATEMENTS[name].kind == "corrected"
    for name in FALSE:
        assert registry.STATEMENTS[name].kind == "false_as_printed"


def test_quick_checks_give_the_expected_verdicts_within_budget():
    """Exact and corrected statements hold, false ones fail with a counterexample, and
    all of them together take well under the 60 s quick budget."""
    start = time.perf_counter()
    results = registry.run_checks("quick", list(EXACT + CORRECTED + FALSE))
    elapsed = time.perf_counter() - start
    for name in EXACT + CORRECTED:
        assert results[name].status == "holds", (name, results[name].evidence)
        assert results[name].instances > 0 and results[name].worst_slack >= -TOL
    for name in FALSE:
        assert results[name].status == "fails", (name, results[name].evidence)
        assert results[name].counterexample and results[name].evidence
        # the shrink only ever accepts strictly simpler instances
        shrunk = {k: np.asarray(results[name].counterexample[k]) for k in results[name].details["first_found"]}
        first = {k: np.asarray(v) for k, v in results[name].details["first_found"].items()}
        assert search.simplicity(shrunk) < search.simplicity(first)
    assert elapsed < 60.0


@pytest.mark.slow
def test_full_checks_give_the_expected_verdicts_within_budget():
    start = time.perf_counter()
    results = registry.run_checks("full", list(EXACT + CORRECTED + FALSE))
    assert time.perf_counter() - start < 300.0
    assert all(results[name].status == "holds" for name in EXACT + CORRECTED)
    assert all(results[name].status == "fails" for name in FALSE)


def test_checks_are_reproducible():
    first, second = false_claims.check_lemma1_max("quick"), false_claims.check_lemma1_max("quick")
    assert first.counterexample == second.counterexample and first.details == second.details


# --------------------------------------------------------------------- search / shrink

def test_number_cost_hand_values():
    # characters of the shortest writing, plus |v| / (1 + |v|) to order equal lengths
    costs = [search.number_cost(v) for v in (0.0, 1.0, 2.0, -1.0, 0.5, 12.0, 1.25)]
    assert costs == pytest.approx([1, 1.5, 1 + 2 / 3, 2.5, 3 + 1 / 3, 2 + 12 / 13, 4 + 1.25 / 2.25])
    assert search.number_cost(math.pi) > search.number_cost(3.14159) > search.number_cost(3.1) > search.number_cost(3)


def test_shrink_finds_a_simpler_violation_of_a_toy_claim():
    """Claim x^2 >= x fails exactly on (0, 1); from 0.3716 the shrink must stay inside
    (0, 1) and end at a strictly simpler number (0.4, one decimal)."""

    def margin(batch):
        x = batch["x"]
        return x**2 - x

    shrunk, steps = search.shrink({"x": np.array(0.3716)}, lambda one: search.margin_of(margin, one) < -TOL,
                                  lambda one: search.simpler_entries(one, ("x",)))
    assert 0.0 < float(shrunk["x"]) < 1.0 and steps >= 1
    assert float(shrunk["x"]) == 0.4


def test_search_then_shrink_is_deterministic_and_counts_violations():
    def sample(rng, size):
        return {"x": rng.uniform(-2.0, 2.0, size)}

    def margin(batch):
        return batch["x"] ** 2 - batch["x"]

    runs = [search.search_then_shrink(sample, margin, lambda one: search.simpler_entries(one, ("x",)),
                                      seed=7, batches=4, batch_size=500) for _ in range(2)]
    assert runs[0].violations == runs[1].violations and float(runs[0].shrunk["x"]) == float(runs[1].shrunk["x"])
    # x uniform on (-2, 2) violates on (0, 1): a quarter of the draws, within 4 standard errors
    assert abs(runs[0].rate - 0.25) < 4 * math.sqrt(0.25 * 0.75 / 2000)


# ------------------------------------------------------------------ clustering steps

@settings(deadline=None, max_examples=150)
@given(clouds())
def test_one_step_moves_at_most_inside_share_times_radius(cloud):
    points, centre, tau = cloud
    for method in METHODS:
        lhs, rhs = clustering_steps.one_step_move_sides(points, centre, tau, method)
        assert (lhs <= rhs + TOL * tau).all(), method


def test_one_step_move_is_attained_by_points_on_the_sphere_in_one_direction():
    # N = 4: two points at v0 + tau e1 (inside), two far away; the step is 2/4 tau exactly
    tau = 2.0
    points = np.array([[[1.0, 2.0], [1.0, 2.0], [30.0, 0.0], [-30.0, 0.0]]])
    centre = np.array([[-1.0, 2.0]])
    for method in METHODS:
        lhs, rhs = clustering_steps.one_step_move_sides(points, centre, tau, method)
        assert lhs[0] == pytest.approx(1.0, abs=1e-12) and rhs[0] == pytest.approx(1.0)


@settings(deadline=None, max_examples=150)
@given(clouds(), st.data())
def test_replacing_beta_n_points_moves_one_step_by_at_most_two_beta_tau(cloud, data):
    points, centre, tau = cloud
    replacements = data.draw(hnp.arrays(np.float64, points.shape, elements=coordinates))
    replaced = data.draw(hnp.arrays(np.bool_, points.shape[:2]))
    for method in METHODS:
        lhs, rhs = clustering_steps.replacement_sides(points, replacements, replaced, centre, tau, method)
        assert (lhs <= rhs + TOL * tau).all(), method


def test_replacement_bound_is_attained():
    # one of N = 2 points swapped from v0 + tau to v0 - tau: outputs differ by 2 tau / 2
    points = np.array([[[1.0], [50.0]]])
    replacements = np.array([[[-1.0], [50.0]]])
    lhs, rhs = clustering_steps.replacement_sides(points, replacements, np.array([[True, False]]),
                                                  np.zeros((1, 1)), 1.0)
    assert lhs[0] == pytest.approx(1.0) and rhs[0] == pytest.approx(1.0)


def test_contraction_one_dimensional_hand_example():
    """Cluster {0, 2} (mean 1), other point 10, N = 3, delta = 2/3; v0 = 1.5, tau = 2:
    the ball holds {0, 2}, v1 = 1.5 + (1/3)((0 - 1.5) + (2 - 1.5)) = 7/6, and
    v1 - 1 = 1/6 = (1 - 2/3)(1.5 - 1)."""
    honest = np.array([[[0.0], [2.0], [10.0]]])
    cluster = np.array([[True, True, False]])
    for method in METHODS:
        result = clustering_steps.contraction_residuals(honest, cluster, np.array([[1.5]]), 2.0, rounds=3,
                                                        method=method)
        assert result["membership"].all()
        assert result["centres"][1, 0, 0] == pytest.approx(7.0 / 6.0, abs=1e-14)
        # each further step shrinks the offset from the mean by 1/3
        assert result["centres"][3, 0, 0] - 1.0 == pytest.approx(0.5 / 27.0, abs=1e-14)
        assert result["step"][0] < 1e-14


@settings(deadline=None, max_examples=60)
@given(seeds, st.integers(1, 6), st.integers(0, 6), st.integers(1, 4), st.sampled_from(METHODS))
def test_contraction_identity_on_balls_holding_one_cluster(seed, cluster, others, dim, method):
    batch = instances.ball_around_one_cluster(np.random.default_rng(seed), 4, cluster, others, 0, dim)
    result = clustering_steps.contraction_residuals(batch["honest"], batch["in_cluster"], batch["centre"],
                                                    batch["radius"], rounds=4, method=method)
    assert result["membership"].all()
    # independent check of v_l - mean = (1 - delta)(v_{l-1} - mean)
    mean = batch["honest"][:, :cluster].mean(axis=1)
    delta = cluster / (cluster + others)
    offsets = result["centres"] - mean
    np.testing.assert_allclose(offsets[1:], (1.0 - delta) * offsets[:-1], atol=1e-12 * (1 + np.abs(mean).max()))


def test_edge_attacker_one_dimensional_hand_example():
    """Cluster {-0.5, 0.5} (mean 0), one attacker, one far point: N = 4, delta = 1/2,
    beta = 1/4, tau = 2, u = +1.  From v0 = 0 the attacker sits at v + 2, so
    v_l = (1/2) v_{l-1} + 1/2: v_1 = 0.5, v_2 = 0.75, fixed point (beta/delta) tau = 1."""
    honest = np.array([[[-0.5], [0.5], [10.0]]])
    cluster = np.array([[True, True, False]])
    for method in METHODS:
        result = clustering_steps.contraction_residuals(honest, cluster, np.zeros((1, 1)), 2.0, rounds=40,
                                                        method=method, attackers=1, direction=np.ones((1, 1)))
        assert result["membership"].all()
        assert result["centres"][1:3, 0, 0] == pytest.approx([0.5, 0.75], abs=1e-14)
        assert result["fixed_point"][0, 0] == pytest.approx(1.0)
        assert result["centres"][-1, 0, 0] == pytest.approx(1.0 - 0.5**40, abs=1e-14)


@settings(deadline=None, max_examples=60)
@given(seeds, st.integers(1, 6), st.integers(0, 6), st.integers(1, 4), st.data())
def test_edge_attacker_converges_to_its_fixed_point(seed, cluster, others, dim, data):
    attackers = data.draw(st.integers(1, cluster))  # beta <= delta
    method = data.draw(st.sampled_from(METHODS))
    batch = instances.ball_around_one_cluster(np.random.default_rng(seed), 3, cluster, others, attackers, dim)
    result = clustering_steps.contraction_residuals(batch["honest"], batch["in_cluster"], batch["centre"],
                                                    batch["radius"], rounds=25, method=method, attackers=attackers,
                                                    direction=batch["direction"])
    assert result["membership"].all()
    total = cluster + others + attackers
    mean = batch["honest"][:, :cluster].mean(axis=1)
    target = mean + (attackers / cluster) * batch["radius"][:, None] * batch["direction"]
    np.testing.assert_allclose(result["fixed_point"], target, atol=1e-12)
    # the distance to the fixed point shrinks by exactly 1 - delta per round
    start = np.linalg.norm(result["centres"][0] - target, axis=-1)
    end = np.linalg.norm(result["centres"][-1] - target, axis=-1)
    np.testing.assert_allclose(end, (1.0 - cluster / total) ** 25 * start, atol=1e-12 * (1 + np.abs(target).max()))
    # the fixed point is inside the ball: beta <= delta
    assert (np.linalg.norm(target - mean, axis=-1) <= batch["radius"] + 1e-12).all()


def test_edge_attacker_one_step_matches_threshold_clustering_directly():
    rng = np.random.default_rng(5)
    batch = instances.ball_around_one_cluster(rng, 1, 3, 2, 2, 2)
    centre, tau, u = batch["centre"][0], float(batch["radius"][0]), batch["direction"][0]
    attackers = np.repeat((centre + tau * u)[None], 2, axis=0)
    points = torch.tensor(np.concatenate([batch["honest"][0], attackers]))
    result = threshold_clustering(points, torch.tensor(centre)[None], tau * (1 + 1e-9), rounds=1)
    mean = batch["honest"][0, :3].mean(0)
    expected = mean + (1 - 3 / 7) * (centre - mean) + (2 / 7) * tau * u
    np.testing.assert_allclose(result.centres[0].numpy(), expected, atol=1e-13)


# ------------------------------------------------------------------------------ Lemma 1

@settings(deadline=None, max_examples=60)
@given(seeds, st.integers(2, 6), st.integers(2, 3), st.integers(1, 3))
def test_lemma1_pair_form_holds_at_every_x(seed, clients, clusters, dim):
    clusters = min(clusters, clients)
    rng = np.random.default_rng(seed)
    family = instances.quadratic_clusters(rng, 8, clients, clusters, dim)
    worst = lemmas.pair_worst_margin(family)
    assert (worst >= -TOL).all()
    # the exact minimum over x lower-bounds the gap at random points
    norms2 = np.square(lemmas.gradients_at_optima(family["hessians"], family["optima"], family["clusters"])).sum(-1)
    mask = lemmas.other_cluster(family["clusters"])
    for scale in (1e-2, 1.0, 10.0):
        moved = {**family, "point": family["point"] + scale * rng.standard_normal(family["point"].shape)}
        lhs, rhs = lemmas.pair_sides(moved)
        gap = np.where(mask, (lhs - rhs) / np.where(mask, norms2, 1.0), np.inf).min(axis=(1, 2))
        assert (gap >= worst - 1e-9).all()


def test_lemma1_pair_worst_x_is_attained():
    # 1-D, H_i = H_j = 1, optima 0 and 1: grad f_i - grad f_j = 1 everywhere, so the gap
    # 1 - 1/2 + D^2 (x)^2 with D^2 = 4 is smallest at x = x_i* = 0: 1/2 of ||g||^2 = 1
    family = {"hessians": np.ones((1, 2, 1, 1)), "optima": np.array([[[0.0], [1.0]]]),
              "clusters": np.array([[0, 1]]), "point": np.zeros((1, 1))}
    assert lemmas.pair_worst_margin(family)[0] == pytest.approx(0.5)


def test_assumption4_constant_hand_example():
    # one cluster, 1-D Hessians 1 and 3: Hbar = 2, A = max(|1 - 2|, |3 - 2|) / 2 = 1/2;
    # Lemma 1 claims A <= 2L/mu = 6
    family = {"hessians": np.array([[[[1.0]], [[3.0]]]]), "clusters": np.array([[0, 0]])}
    assert lemmas.assumption4_constant(family["hessians"], family["clusters"])[0] == pytest.approx(0.5)
    assert lemmas.assumption4_margin(family)[0] == pytest.approx((6 - 0.5) / 6)


@settings(deadline=None, max_examples=60)
@given(seeds, st.integers(2, 6), st.integers(1, 3), st.integers(1, 3))
def test_lemma1_a_holds_and_is_the_supremum_over_x(seed, clients, clusters, dim):
    clusters = min(clusters, clients)
    rng = np.random.default_rng(seed)
    family = instances.quadratic_clusters(rng, 6, clients, clusters, dim)
    assert (lemmas.assumption4_margin(family) >= -TOL).all()
    exact = lemmas.assumption4_constant(family["hessians"], family["clusters"])
    # ratio ||grad f_i - grad fbar_i|| / ||grad fbar_i|| at random x never exceeds it
    grads = lemmas.gradients(family["hessians"], family["optima"], family["clusters"],
                             family["point"] + rng.standard_normal(family["point"].shape))
    labels = family["clusters"][0]
    onehot = (labels[:, None] == np.arange(clusters)).astype(float)
    cluster_mean = (onehot / onehot.sum(0)) @ onehot.T  # [N, N] averaging within clusters
    fbar = np.einsum("nm,bmd->bnd", cluster_mean, grads)
    ratio = np.linalg.norm(grads - fbar, axis=-1) / np.linalg.norm(fbar, axis=-1)
    assert (ratio.max(-1) <= exact * (1 + 1e-9) + 1e-12).all()


# ------------------------------------------------------------------------------ Lemma 7

def test_lemma7_hand_examples():
    # points {0, 1} w.p. 1/2, |B| = 2 with replacement: means 0, 1/2, 1/2, 1 -> variance
    # 1/8 = sigma^2 / 2 with sigma^2 = 1/4
    variance, formula = lemmas.batch_mean_variance(np.array([[[0.0], [1.0]]]), np.array([[0.5, 0.5]]), 2)
    assert variance[0] == pytest.approx(0.125) and formula[0] == pytest.approx(0.125)
    # {0, 1, 2}, |B| = 2 without replacement: means 1/2, 1, 3/2 -> variance 1/6;
    # sigma^2 = 2/3, (2/3)/2 * (3 - 2)/(3 - 1) = 1/6
    variance, formula = lemmas.batch_mean_variance(np.array([[[0.0], [1.0], [2.0]]]), np.full((1, 3), 1 / 3), 2,
                                                   replacement=False)
    assert variance[0] == pytest.approx(1 / 6) and formula[0] == pytest.approx(1 / 6)


@settings(deadline=None, max_examples=80)
@given(seeds, st.integers(2, 5), st.integers(1, 3), st.integers(1, 3), st.booleans())
def test_lemma7_variance_is_sigma2_over_batch_size(seed, atoms, size, dim, replacement):
    size = min(size, atoms) if not replacement else size
    rng = np.random.default_rng(seed)
    sample = instances.finite_distributions(rng, 3, atoms, dim, uniform=not replacement)
    variance, formula = lemmas.batch_mean_variance(sample["values"], sample["probabilities"], size, replacement)
    np.testing.assert_allclose(variance, formula, rtol=1e-10, atol=1e-14)


# ----------------------------------------------------------------------------- Lemma 14

def test_lemma14_hand_values():
    # alpha = 1/2, sigma^2 = 1: V_1 = 1/4, V_2 = 1/4 * 1/4 + 1/4 = 5/16, limit 1/3
    values = lemmas.momentum_variances(0.5, 1.0, 200)
    assert values[:2] == pytest.approx([0.25, 0.3125]) and values[-1] == pytest.approx(1 / 3)


@settings(deadline=None, max_examples=100)
@given(st.floats(1e-3, 1.0), st.floats(1e-3, 1e3), st.integers(1, 300))
def test_lemma14_bounds_and_closed_form(alpha, sigma2, steps):
    recursion = lemmas.momentum_variances(alpha, sigma2, steps)
    closed = lemmas.momentum_variance_closed_form(alpha, sigma2, steps)
    np.testing.assert_allclose(recursion, closed, rtol=1e-10)
    assert (recursion <= alpha * sigma2 / (2 - alpha) * (1 + 1e-12)).all()
    assert (np.diff(recursion) >= -1e-12 * sigma2).all()  # increases to its limit


def test_lemma14_monte_carlo_agrees_within_standard_errors():
    for alpha, seed in ((0.1, 1), (0.7, 2)):
        empirical, error = lemmas.momentum_monte_carlo(alpha, 3.0, 50, 4000, 2, seed)
        exact = float(lemmas.momentum_variance_closed_form(alpha, 3.0, 50)[-1])
        assert abs(empirical - exact) <= 4 * error
        assert empirical <= alpha * 3.0  # the lemma's bound, with room (alpha/(2-alpha) < alpha)


# ------------------------------------------------------------------------------ descent

def test_descent_is_tight_on_x_squared():
    # f = x^2/2 (L = 1), x = 2, eta = 1: f(0) = 0 = f(2) - 1/2 * 2^2
    quadratic = {"hessian": np.ones((1, 1, 1)), "linear": np.zeros((1, 1)), "point": np.full((1, 1), 2.0),
                 "eta": np.ones(1)}
    lhs, rhs = lemmas.quadratic_descent_sides(quadratic)
    assert lhs[0] == 0.0 and rhs[0] == 0.0


def test_logistic_smoothness_hand_value_and_upper_bounds_the_hessian():
    # one sample a = 2: L = 2^2 / 4 = 1
    assert lemmas.logistic_smoothness(np.array([[[2.0]]]))[0] == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    problem = instances.logistic_problems(rng, 5, 7, 3)
    features, labels = problem["features"], problem["labels"]
    smoothness = lemmas.logistic_smoothness(features)
    tops = []
    for point in (np.zeros((5, 3)), rng.standard_normal((5, 3)), 3 * rng.standard_normal((5, 3))):
        s = 1 / (1 + np.exp(-labels * np.einsum("bnd,bd->bn", features, point)))
        hessian = np.einsum("bn,bnd,bne->bde", s * (1 - s), features, features) / features.shape[1]
        tops.append(np.linalg.eigvalsh(hessian)[:, -1])
        assert (tops[-1] <= smoothness * (1 + 1e-12)).all()
    # attained at w = 0, where s = 1/2: L is the exact constant, not just a bound
    np.testing.assert_allclose(tops[0], smoothness, rtol=1e-12)


@settings(deadline=None, max_examples=80)
@given(seeds, st.integers(1, 4), st.integers(2, 9))
def test_descent_inequality_for_eta_at_most_one_over_l(seed, dim, samples):
    rng = np.random.default_rng(seed)
    assert (lemmas.quadratic_descent_margin(instances.convex_quadratics(rng, 8, dim)) >= -TOL).all()
    assert (lemmas.logistic_descent_margin(instances.logistic_problems(rng, 8, samples, dim)) >= -TOL).all()


# ------------------------------------------------------------------- Lemma 1 with the max

def _printed_lemma1_gap(example: dict) -> float:
    """Independent re-evaluation of eq. (19) as printed on a counterexample: the
    smallest lhs - rhs over pairs in different clusters (plain numpy)."""
    hessians = np.array(example["hessians"], float)
    optima = np.array(example["optima"], float)[np.array(example["clusters"])]
    x = np.array(example["point"], float)
    eigenvalues = np.linalg.eigvalsh(hessians)
    kappa = eigenvalues.max() / eigenvalues.min()
    d2 = 2 * (1 + kappa**2)
    gaps = []
    for i in range(len(hessians)):
        grad_i = hessians[i] @ (x - optima[i])
        others = [j for j in range(len(hessians)) if not np.array_equal(optima[j], optima[i])]
        separation = 0.5 * max(np.linalg.norm(hessians[j] @ (optima[i] - optima[j])) for j in others) ** 2
        for j in others:
            lhs = np.sum((grad_i - hessians[j] @ (x - optima[j])) ** 2)
            gaps.append(lhs - (separation - d2 * grad_i @ grad_i))
    return min(gaps)


def test_lemma1_max_counterexample_violates_the_printed_claim():
    result = false_claims.check_lemma1_max("quick")
    example = result.counterexample
    assert result.status == "fails" and example["lhs"] < example["rhs"]
    assert _printed_lemma1_gap(example) < -0.1
    # shrunk to the smallest shape possible: three clients (two give max = the pair), 1-D
    assert len(example["clusters"]) == 3 and len(example["point"]) == 1
    # and the corrected per-pair form holds on it
    family = search.batched({k: np.array(example[k]) for k in ("hessians", "optima", "clusters", "point")})
    assert lemmas.pair_worst_margin(family)[0] >= -TOL


def test_lemma1_max_simplest_hand_counterexample():
    """Three 1-D clients with unit curvature, optima 0, 1, 2, x = x_0* = 0: the pair
    (0, 1) has ||grad f_0 - grad f_1||^2 = 1 but the printed rhs is 1/2 * 2^2 = 2."""
    family = {"hessians": np.ones((1, 3, 1, 1)), "optima": np.array([[[0.0], [1.0], [2.0]]]),
              "clusters": np.array([[0, 1, 2]]), "point": np.zeros((1, 1))}
    lhs, rhs = false_claims.max_form_sides(family)
    assert lhs[0, 0, 1] == pytest.approx(1.0) and rhs[0, 0] == pytest.approx(2.0)
    assert false_claims.max_form_margin(family)[0] == pytest.approx((1.0 - 2.0) / 2.0)


# ------------------------------------------------------------------- Var(y) <= Var(z)

def test_variance_claim_hand_example():
    # z = v + tau e or v + (tau + eps) e w.p. 1/2 with tau = 1, eps = 0.5, v = 0:
    # Var z = eps^2/4 = 1/16; y = 1 or 0 (the far point is clipped to v), Var y = 1/4
    example = {"values": np.array([[[1.0], [1.5]]]), "probabilities": np.array([[0.5, 0.5]]),
               "centre": np.zeros((1, 1)), "radius": np.array([1.0])}
    moments = false_claims.thresholded_moments(example)
    assert moments["var_z"][0] == pytest.approx(1 / 16) and moments["var_y"][0] == pytest.approx(1 / 4)
    assert false_claims.variance_claim_margin(example)[0] < 0
    assert (false_claims.second_moment_margins(example) >= 0).all()


def test_variance_counterexample_violates_the_claim_independently():
    result = false_claims.check_var_y_le_var_z("quick")
    example = result.counterexample
    z = np.array(example["values"], float)
    p = np.array(example["probabilities"], float)
    v = np.array(example["centre"], float)
    inside = np.sqrt(((z - v) ** 2).sum(-1)) <= example["radius"]
    y = np.where(inside[:, None], z, v)

    def variance(points):
        mean = p @ points
        return float(p @ ((points - mean) ** 2).sum(-1))

    assert variance(y) > variance(z) + 1e-6
    assert len(p) == 2 and z.shape[1] == 1  # two atoms in 1-D


@settings(deadline=None, max_examples=150)
@given(seeds, st.integers(1, 5), st.integers(1, 3))
def test_corrected_variance_chain_holds(seed, atoms, dim):
    sample = instances.thresholded_distributions(np.random.default_rng(seed), 6, atoms, dim)
    assert (false_claims.second_moment_margins(sample) >= -TOL).all()


# ------------------------------------------------------------------------ Thm 3.2

def test_thm32_ratio_at_delta_over_sigma_sqrt2():
    """sigma = 1, Delta = sqrt 2: S = sqrt(4 + 2) = sqrt 6, exact error (sqrt6 - sqrt2)^2/16
    = (8 - 2 sqrt 12)/16 = (2 - sqrt 3)/4 ~ 0.0670; the claim sigma^4/(4 Delta^2) = 1/8;
    ratio 2 (2 - sqrt 3) = 4 - 2 sqrt 3 ~ 0.536."""
    instance = {"sigma": np.array([1.0]), "separation": np.array([math.sqrt(2.0)])}
    error, claimed = false_claims.two_point_sides(instance)
    assert error[0] == pytest.approx((2 - math.sqrt(3)) / 4) and claimed[0] == pytest.approx(1 / 8)
    assert error[0] / claimed[0] == pytest.approx(4 - 2 * math.sqrt(3))
    assert round(error[0] / claimed[0], 2) == 0.54


def test_thm32_counterexample_violates_the_claim_independently():
    result = false_claims.check_thm32_constant("quick")
    sigma, separation = result.counterexample["sigma"], result.counterexample["separation"]
    assert separation**2 >= 2 * sigma**2
    # rebuild A.2's construction: p solves (4s^2 + D^2) p^2 - (4s^2 + D^2) p + s^2 = 0, p <= 1/2
    a = 4 * sigma**2 + separation**2
    p = min(np.roots([a, -a, sigma**2]).real)
    delta = separation / (1 - 2 * p)
    assert delta**2 * p * (1 - p) == pytest.approx(sigma**2)
    # both hypotheses give the samples one law; mu1 is delta p or 0: the best single
    # estimate minimises the worse squared error, found here on a fine grid
    grid = np.linspace(0.0, delta * p, 200001)
    minimax = np.maximum((grid - delta * p) ** 2, grid**2).min()
    assert minimax == pytest.approx((delta * p) ** 2 / 4, rel=1e-6)
    assert minimax < sigma**4 / (4 * separation**2) * (1 - 1e-3)


@settings(deadline=None, max_examples=200)
@given(st.floats(1e-3, 1e3), st.floats(math.sqrt(2.0), 1e3))
def test_thm32_corrected_constant_one_eighth(sigma, ratio):
    instance = {"sigma": np.array([sigma]), "separation": np.array([sigma * ratio])}
    assert false_claims.two_point_margin(instance, 0.125)[0] >= -TOL
    assert false_claims.two_point_margin(instance, 0.25)[0] < 0  # the printed 1/4 always fails
