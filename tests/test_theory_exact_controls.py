"""The negative controls of Werner et al.'s exact and corrected statements
(theory_checks.statements: clustering_steps, lemmas, false_claims).

Every registered exact claim that holds must be violated by its control, in the same
check; the property tests show that each kind of control instance really breaks the
hypothesis it claims to break, and by how much the claim must then fail; a control
that is not violated leaves the statement "vacuous"."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory_checks.controls import finalised, margin_control
from theory_checks.statements import STATEMENTS, clustering_steps, false_claims, instances, lemmas
from theory_checks.statements.search import TOLERANCE, exact_verdict

pytestmark = pytest.mark.usefixtures("single_thread")

CONTROLLED = ("one-step-move", "replacement", "contraction", "edge-attacker", "lemma1-A", "lemma1-pair", "lemma7",
              "lemma14", "descent", "var-y-le-second-moment", "thm3.2-corrected")
seeds = st.integers(0, 2**32 - 1)
FEW = settings(deadline=None, max_examples=25)


# ------------------------------------------------------------ every registered control

@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", CONTROLLED)
def test_the_statement_holds_and_its_control_violates_it(name, seed):
    result = STATEMENTS[name].check("quick", seed)
    control = result.negative_control
    assert result.status == "holds", (name, seed, result.evidence)
    assert control is not None and control.violated, (name, seed, control)
    assert control.ratio < -1e-9 and control.real == result.worst_slack
    # a few hundred instances: the control does not dominate the quick budget
    assert 100 <= control.details["instances"] <= 700


def test_a_control_that_meets_the_claim_leaves_the_statement_vacuous():
    """The descent inequality's "control" run with its hypothesis intact (eta <= 1/L)
    is not violated, and the same real margins then read as vacuous, not holds."""
    rng = np.random.default_rng(0)
    real = lemmas.quadratic_descent_margin(instances.convex_quadratics(rng, 200, 2))
    intact = lemmas.quadratic_descent_margin(instances.convex_quadratics(rng, 200, 2))
    control = margin_control("eta <= 1/L (hypothesis intact)", intact, lemmas.DESCENT_MARGIN, TOLERANCE)
    assert not control.violated
    result = finalised(exact_verdict("descent", real, control=control))
    assert result.status == "vacuous" and "meets the claim too" in result.evidence
    # the registered check's own result, with its control's verdict flipped, is vacuous too
    registered = STATEMENTS["descent"].check("quick", 0)
    flipped = dataclasses.replace(registered, negative_control=dataclasses.replace(registered.negative_control,
                                                                                   violated=False))
    assert registered.status == "holds" and finalised(flipped).status == "vacuous"


# ----------------------------------------------------------------- clustering steps

@FEW
@given(seeds, st.integers(1, 12), st.integers(1, 4))
def test_mean_step_control_pulls_points_out_of_the_ball(seed, clients, dim):
    """One-step-move's control: some point lies outside the tau-ball, the broken step
    is the mean of all points, and the bound misses by at least m / N."""
    batch = instances.one_sided_clouds(np.random.default_rng(seed), 4, clients, dim)
    distances = np.linalg.norm(batch["points"] - batch["centre"][:, None], axis=-1)
    outside = (distances > batch["radius"][:, None]).sum(-1)
    assert (outside >= 1).all()
    lhs, rhs = clustering_steps.unthresholded_move_sides(batch["points"], batch["centre"], batch["radius"])
    mean_move = np.linalg.norm(batch["points"].mean(1) - batch["centre"], axis=-1)
    np.testing.assert_allclose(lhs, mean_move, rtol=1e-12)
    assert (clustering_steps.step_margins(batch, lhs, rhs) <= -outside / clients + 1e-12).all()


@FEW
@given(seeds, st.integers(1, 12), st.integers(1, 4))
def test_mean_step_control_moves_replaced_points_beyond_two_tau(seed, clients, dim):
    """Replacement's control: at least one point replaced, each shifted by over 2.5 tau,
    so the mean step's outputs differ by over 2.5 beta tau."""
    batch = instances.pushed_replacements(np.random.default_rng(seed), 4, clients, dim)
    shift = np.linalg.norm(batch["replacements"] - batch["points"], axis=-1)
    beta = batch["replaced"].mean(-1)
    assert (beta > 0).all() and (shift > 2.5 * batch["radius"][:, None]).all()
    lhs, rhs = clustering_steps.unthresholded_replacement_sides(batch["points"], batch["replacements"],
                                                                batch["replaced"], batch["centre"], batch["radius"])
    assert (clustering_steps.step_margins(batch, lhs, rhs) < -0.5 * beta).all()
    # the real (thresholded) step meets the bound on the same instances
    lhs, rhs = clustering_steps.replacement_sides(batch["points"], batch["replacements"], batch["replaced"],
                                                  batch["centre"], batch["radius"])
    assert (clustering_steps.step_margins(batch, lhs, rhs) >= -TOLERANCE).all()


@FEW
@given(seeds, st.integers(1, 6), st.integers(0, 6), st.integers(1, 4))
def test_intruder_breaks_the_balls_membership_by_one_over_2n(seed, cluster, others, dim):
    """Contraction's control: the intruder (no cluster) sits inside the first ball, so
    the ball holds more than cluster i, and the first step misses the identity by
    exactly 1 / (2N)."""
    rng = np.random.default_rng(seed)
    batch = instances.with_intruder(rng, instances.ball_around_one_cluster(rng, 3, cluster, others, 0, dim))
    total = cluster + others + 1
    intruder = batch["honest"][:, -1]
    assert not batch["in_cluster"][:, -1].any()
    assert (np.linalg.norm(intruder - batch["centre"], axis=-1) < batch["radius"]).all()
    first = clustering_steps.contraction_residuals(batch["honest"], batch["in_cluster"], batch["centre"],
                                                   batch["radius"], rounds=1)
    assert not first["membership"].any()
    np.testing.assert_allclose(first["step"], 1.0 / (2 * total), rtol=1e-9)


@FEW
@given(seeds, st.integers(1, 8), st.integers(1, 9), st.integers(1, 4))
def test_excess_attackers_push_the_fixed_point_out_of_the_ball(seed, cluster, extra, dim):
    """Edge-attacker's control: beta > delta_i, the predicted fixed point lies outside
    the ball, the cluster leaves it within the rounds run, and the identity misses
    by over 1 / (2N)."""
    attackers = cluster + extra
    batch = instances.ball_with_excess_attackers(np.random.default_rng(seed), 3, cluster, attackers, dim)
    total = cluster + attackers
    assert attackers / total > cluster / total
    assert instances.rounds_to_leave(cluster, attackers) + 2 <= clustering_steps.ROUNDS
    steps, fixed, membership = clustering_steps.ball_residuals(batch, attackers, ("direct",))
    result = clustering_steps.contraction_residuals(batch["honest"], batch["in_cluster"], batch["centre"],
                                                    batch["radius"], rounds=clustering_steps.ROUNDS,
                                                    attackers=attackers, direction=batch["direction"])
    mean = batch["honest"].mean(1)
    assert (np.linalg.norm(result["fixed_point"] - mean, axis=-1) > batch["radius"]).all()
    assert not membership.any()
    assert (clustering_steps.identity_margins(steps, fixed) < -1.0 / (2 * total)).all()


def test_edge_attacker_control_refuses_beta_at_most_delta():
    with pytest.raises(ValueError, match="beta > delta"):
        instances.ball_with_excess_attackers(np.random.default_rng(0), 2, 3, 3, 2)


# -------------------------------------------------------------------------- Lemma 1

@FEW
@given(seeds, st.sampled_from([(3, 2, 1), (4, 2, 2), (6, 3, 3), (5, 2, 3)]))
def test_mislabelled_client_breaks_the_shared_optimum(seed, shape):
    """Lemma 1's controls: client 0's loss has another cluster's optimum, so its own
    cluster shares no optimum; the pair form misses by exactly 1/2 at x_k*, and
    eq. (16)'s ratio near the cluster's mean optimum is at least 4L/mu."""
    clients, clusters, dim = shape
    family = instances.mislabelled_clusters(np.random.default_rng(seed), 4, clients, clusters, dim)
    assert (family["minimisers"][:, 0] != family["clusters"][:, 0]).all()
    # grad f_0 at its cluster's claimed optimum is not zero
    at_claimed = lemmas.gradients(family["hessians"], family["optima"], family["minimisers"],
                                  family["optima"][:, 0])[:, 0]
    assert (np.linalg.norm(at_claimed, axis=-1) > 0).all()
    np.testing.assert_allclose(lemmas.pair_margin_at_point(family), -0.5, atol=1e-9)
    near = {**family, "point": lemmas.near_cluster_optimum(family)}
    assert (lemmas.assumption4_margin_at_point(near) <= -1.0 + 1e-9).all()


@FEW
@given(seeds, st.integers(2, 6), st.integers(1, 3), st.integers(1, 3))
def test_pointwise_lemma1_margins_bound_the_exact_ones_under_the_hypothesis(seed, clients, clusters, dim):
    """With one optimum per cluster the pointwise evaluators used by the controls are
    the same claims: eq. (16)'s ratio at any x is at most the exact A, and the pair
    gap at any x at least its minimum over x."""
    clusters = min(clusters, clients)
    rng = np.random.default_rng(seed)
    family = instances.quadratic_clusters(rng, 4, clients, clusters, dim)
    assert (lemmas.assumption4_margin_at_point(family) >= lemmas.assumption4_margin(family) - 1e-9).all()
    if clusters > 1:
        assert (lemmas.pair_margin_at_point(family) >= lemmas.pair_worst_margin(family) - 1e-9).all()


# ------------------------------------------------------------------- Lemmas 7 and 14

@FEW
@given(seeds, st.integers(2, 5), st.integers(2, 4), st.integers(1, 3))
def test_copied_batches_have_the_variance_of_one_draw(seed, atoms, size, dim):
    """Lemma 7's control: |B| copies of one draw have variance sigma^2, |B| times the
    iid formula: a margin of -(|B| - 1)."""
    law = instances.finite_distributions(np.random.default_rng(seed), 3, atoms, dim)
    variance, formula = lemmas.copied_batch_variance(law["values"], law["probabilities"], size)
    np.testing.assert_allclose(variance, size * formula, rtol=1e-10)
    np.testing.assert_allclose(lemmas._equality_margin(variance, formula), -(size - 1), rtol=1e-9)


@FEW
@given(st.floats(1e-3, 0.99), st.floats(0.1, 10.0), st.integers(1, 300))
def test_repeated_noise_momentum_variance(alpha, sigma2, steps):
    """Lemma 14's control: with one noise draw reused, m_t - E m_t = (1 - (1 - alpha)^t) xi,
    whose variance exceeds alpha sigma^2 once (1 - (1 - alpha)^t)^2 > alpha."""
    variance = lemmas.momentum_variances_repeated_noise(alpha, sigma2, steps)
    t = np.arange(1, steps + 1)
    np.testing.assert_allclose(variance, (1 - (1 - alpha) ** t) ** 2 * sigma2, rtol=1e-9)
    # a chain driven by one draw per chain: the same deviation, draw by draw
    draws = np.random.default_rng(0).normal(size=5)
    momentum = np.zeros(5)
    for _ in range(steps):
        momentum = alpha * draws + (1 - alpha) * momentum
    np.testing.assert_allclose(momentum, (1 - (1 - alpha) ** steps) * draws, rtol=1e-9, atol=1e-300)
    excess = (1 - (1 - alpha) ** t) ** 2 / alpha - 1  # Var m_t / (alpha sigma^2) - 1
    clear = np.abs(excess) > 1e-6  # away from the crossing, where rounding could decide
    violated = lemmas.momentum_bound_margin(alpha, sigma2, variance) < -TOLERANCE
    np.testing.assert_array_equal(violated[clear], excess[clear] > 0)


# --------------------------------------------------------------------------- descent

@FEW
@given(seeds, st.integers(1, 4))
def test_steep_steps_exceed_two_over_l_along_the_top_curvature(seed, dim):
    """Descent's control: eta L in (2, 4) and g a top eigenvector, where f(x - eta g) =
    f(x) - eta ||g||^2 (1 - eta L / 2) > f(x): the margin is 1 - eta L or nearer 0
    only through the 1e-3 |f(x)| scale floor, never above it."""
    batch = instances.steep_quadratic_steps(np.random.default_rng(seed), 8, dim)
    smoothness = np.linalg.eigvalsh(batch["hessian"])[:, -1]
    assert ((batch["eta"] * smoothness > 2) & (batch["eta"] * smoothness < 4)).all()
    grad = np.einsum("bij,bj->bi", batch["hessian"], batch["point"]) + batch["linear"]
    curvature = np.einsum("bi,bij,bj->b", grad, batch["hessian"], grad) / np.square(grad).sum(-1)
    np.testing.assert_allclose(curvature, smoothness, rtol=1e-9)
    after, promised = lemmas.quadratic_descent_sides(batch)
    assert (after > promised).all()
    assert (lemmas.quadratic_descent_margin(batch) < 0).all()


# -------------------------------------------------------------- the corrected claims

@FEW
@given(seeds, st.integers(1, 5), st.integers(1, 3))
def test_misclipping_sends_outside_mass_farther_than_any_point(seed, atoms, dim):
    """var-y-le-second-moment's control: the clipping target is farther from v than
    every atom, and some atom is outside the ball, so E||y - v||^2 > E||z - v||^2."""
    batch = instances.misclipped_distributions(np.random.default_rng(seed), 6, atoms, dim)
    distances = np.linalg.norm(batch["values"] - batch["centre"][:, None], axis=-1)
    target = np.linalg.norm(batch["target"] - batch["centre"], axis=-1)
    assert (distances[:, 0] > batch["radius"]).all() and (target[:, None] > distances).all()
    second_gap = false_claims.second_moment_margins(batch)[1]
    outside_mass = (batch["probabilities"] * (distances > batch["radius"][:, None])).sum(-1)
    assert (second_gap <= -2.25 * outside_mass + 1e-12).all()
    # clipping to v (the hypothesis) meets the chain on the same distributions
    clipped_to_v = {key: value for key, value in batch.items() if key != "target"}
    assert (false_claims.second_moment_margins(clipped_to_v) >= -TOLERANCE).all()


@FEW
@given(seeds)
def test_two_point_control_lies_below_the_break(seed):
    """thm3.2-corrected's control: Delta^2 < 2 sigma^2 and, more, Delta / sigma below
    the break point where the corrected bound starts to fail."""
    batch = false_claims.sample_two_point_outside_regime(np.random.default_rng(seed), 50)
    ratio = batch["separation"] / batch["sigma"]
    assert (batch["separation"] ** 2 < 2 * batch["sigma"] ** 2).all()
    assert (ratio < false_claims.BREAK_SEPARATION).all()
    assert (false_claims.two_point_margin(batch, 0.125) < -0.07).all()


def test_two_point_break_point_is_where_the_corrected_bound_turns():
    """Between Delta / sigma = 1.307 and sqrt 2 the bound still holds outside the regime:
    that is why the control stays below 1.2, not merely below sqrt 2."""
    sigma = np.ones(4)
    separation = false_claims.BREAK_SEPARATION * np.array([0.999, 1.0, 1.001, np.sqrt(2) / 1.3066])
    margins = false_claims.two_point_margin({"sigma": sigma, "separation": separation}, 0.125)
    assert margins[0] < 0 and abs(margins[1]) < 1e-12 and margins[2] > 0 and margins[3] > 0
