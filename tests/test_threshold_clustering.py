"""Property tests for Threshold-Clustering (Werner et al., Alg. 3, eq. 24, and the
exact facts of the proof of Thm 3.1).

Every test states an exact fact of eq. 24

    v_{k,l} = (1/N) sum_j [ z_j if ||z_j - v_{k,l-1}|| <= tau_{k,l} else v_{k,l-1} ]

that must hold on every instance, or compares the implementation with an independent
NumPy transcription of that formula.  Points are drawn from a seeded torch generator
(hypothesis chooses the seed and the sizes), in float64, so that no distance lands on
a radius by accident.
"""

from __future__ import annotations

import math
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from defenses.radius import CenterDistanceRadius, FixedRadius, QuantileRadius
from defenses.threshold_clustering import nearest_centre, threshold_clustering

tc = sys.modules["defenses.threshold_clustering"]  # the module (the package re-exports the function)

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
FAST = settings(max_examples=40, deadline=None)

seeds = st.integers(0, 2**31 - 1)
# Batches of problems large enough for balls to hold several points.
BATCHED_PROBLEMS = dict(seed=seeds, b=st.integers(1, 3), n=st.integers(10, 60), d=st.integers(2, 30))


def random_problem(seed: int, n: int, d: int, k: int, spread: float = 3.0):
    """Points: a mixture of up to 3 Gaussian groups (so balls hold several points);
    centres: random points perturbed by noise.  Both float64."""
    g = torch.Generator().manual_seed(seed)
    groups = torch.randn(3, d, generator=g, dtype=F64) * spread
    labels = torch.randint(0, 3, (n,), generator=g)
    points = groups[labels] + torch.randn(n, d, generator=g, dtype=F64)
    pick = torch.randint(0, n, (k,), generator=g)
    centres = points[pick] + 0.5 * torch.randn(k, d, generator=g, dtype=F64)
    return points, centres


def stacked(problems):
    """``[B, N, d]`` points and ``[B, K, d]`` centres from a list of problems."""
    return torch.stack([p for p, _ in problems]), torch.stack([c for _, c in problems])


def policy_from(name: str, tau: float, q: float):
    if name == "fixed":
        return FixedRadius(tau)
    if name == "quantile":
        return QuantileRadius(q)
    return CenterDistanceRadius(iterations=8)


def avoid_rounding_ties(name: str, q: float, n: int) -> None:
    """Discard quantile levels whose interpolation weight is within 1e-6 of 0 or 1
    without being 0: there tau lies within rounding of an order statistic (e.g. q =
    1 - 2**-53 puts tau an ulp below the largest distance; q = 0.333... with n = 7 puts
    the exact position 2**-52 below the integer that the float product rounds to), and
    whether that point is inside depends on the last bit, not on eq. 24."""
    if name == "quantile":
        position = Fraction(q) * (n - 1)  # exactly, as the reference computes it
        frac = position - math.floor(position)
        assume(frac == 0 or 1e-6 < frac < 1 - 1e-6)


def linear_quantile(values: np.ndarray, q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (NumPy's
    default method), with the position q(n - 1) computed exactly (Fraction), so that an
    integer position selects the order statistic itself."""
    ordered = np.sort(values)
    position = Fraction(q) * (len(ordered) - 1)
    lo = math.floor(position)
    frac = position - lo
    if frac == 0:
        return float(ordered[lo])
    return float(ordered[lo] + float(frac) * (ordered[lo + 1] - ordered[lo]))


def reference_threshold_clustering(points, centres, radius_of, rounds):
    """Independent transcription of eq. 24 in NumPy: average of the thresholded points
    y_j = z_j if inside else v (the first form of eq. 24), one centre at a time."""
    z = points.numpy()
    v = centres.numpy().copy()
    n = z.shape[0]
    for _ in range(rounds):
        new = v.copy()
        for k in range(v.shape[0]):
            dist = np.sqrt(((z - v[k]) ** 2).sum(axis=1))
            tau = radius_of(dist)
            ys = [z[j] if dist[j] <= tau else v[k] for j in range(n)]
            new[k] = np.mean(ys, axis=0)
        v = new
    return v


# --------------------------------------------------------------------------------------
# Agreement with an independent transcription of eq. 24
# --------------------------------------------------------------------------------------


@FAST
@given(
    seed=seeds,
    n=st.integers(1, 10),
    d=st.integers(1, 4),
    k=st.integers(1, 3),
    rounds=st.integers(1, 6),
    tau=st.floats(0.1, 6.0),
    q=st.floats(0.0, 1.0),
    name=st.sampled_from(["fixed", "quantile"]),
)
def test_matches_reference_transcription_of_eq24(seed, n, d, k, rounds, tau, q, name):
    """Alg. 3 / eq. 24: the implementation equals a naive loop that averages the
    thresholded points y_j (z_j inside the ball, else the current centre), with the
    radius fixed or the linear q-quantile of the current distances (NumPy's default
    interpolation, written out)."""
    avoid_rounding_ties(name, q, n)
    points, centres = random_problem(seed, n, d, k)
    result = threshold_clustering(points, centres, policy_from(name, tau, q), rounds)
    radius_of = (lambda dist: tau) if name == "fixed" else (lambda dist: linear_quantile(dist, q))
    expected = reference_threshold_clustering(points, centres, radius_of, rounds)
    np.testing.assert_allclose(result.centres.numpy(), expected, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------------------
# Exact facts of Alg. 3 used in the proof of Thm 3.1
# --------------------------------------------------------------------------------------


@FAST
@given(
    seed=seeds,
    n=st.integers(1, 12),
    d=st.integers(1, 4),
    k=st.integers(1, 3),
    tau=st.floats(0.0, 8.0),
    q=st.floats(0.0, 1.0),
    name=st.sampled_from(["fixed", "quantile", "cd"]),
)
def test_one_step_moves_centre_at_most_inside_fraction_times_tau(seed, n, d, k, tau, q, name):
    """Alg. 3: one step moves each centre by at most (#inside/N) * tau, because
    v_1 - v_0 = (1/N) sum_{inside} (z_j - v_0) and every inside term has norm <= tau.
    Checked for every radius policy, with tau the radius the step actually used."""
    points, centres = random_problem(seed, n, d, k)
    result = threshold_clustering(points, centres, policy_from(name, tau, q), rounds=1)
    moved = torch.linalg.vector_norm(result.centres - centres, dim=-1)
    count = result.inside.sum(-1).to(F64)
    bound = count / n * result.radius
    assert torch.all(moved <= bound * (1 + 1e-12) + 1e-12), (moved, bound)
    # the step is exactly the eq. 24 update from the reported membership
    step = (result.inside.to(F64) @ points - count.unsqueeze(-1) * centres) / n
    torch.testing.assert_close(result.centres, centres + step, rtol=1e-12, atol=1e-12)


@FAST
@given(
    seed=seeds,
    n=st.integers(1, 12),
    d=st.integers(1, 4),
    k=st.integers(1, 3),
    tau=st.floats(0.05, 6.0),
    data=st.data(),
)
def test_replacing_beta_n_points_moves_one_step_by_at_most_2_beta_tau(seed, n, d, k, tau, data):
    """Robustness of Alg. 3 (Sec. 3.1.1): replacing any m = beta*N points by arbitrary
    finite points changes one step's output (fixed radius, same initial centres) by at
    most 2*beta*tau: each replaced point's contribution (z_j - v_0) 1[inside] has norm
    <= tau before and after.  Replacements include points placed just inside the ball's
    edge (the worst case), far points and huge finite points."""
    points, centres = random_problem(seed, n, d, k)
    m = data.draw(st.integers(0, n), label="m")
    chosen = data.draw(st.permutations(range(n)), label="order")[:m]
    mode = data.draw(st.sampled_from(["edge", "random", "huge"]), label="mode")
    g = torch.Generator().manual_seed(seed + 1)
    replaced = points.clone()
    for j in chosen:
        if mode == "edge":
            u = torch.randn(d, generator=g, dtype=F64)
            u = u / torch.linalg.vector_norm(u)
            replaced[j] = centres[j % k] + tau * (1 - 1e-9) * u
        elif mode == "random":
            replaced[j] = 10 * torch.randn(d, generator=g, dtype=F64)
        else:
            replaced[j] = torch.full((d,), 1e150, dtype=F64)
    before = threshold_clustering(points, centres, tau, rounds=1).centres
    after = threshold_clustering(replaced, centres, tau, rounds=1).centres
    change = torch.linalg.vector_norm(after - before, dim=-1)
    beta = m / n
    assert torch.all(change <= 2 * beta * tau * (1 + 1e-12) + 1e-12), (change, 2 * beta * tau)


def test_replacement_bound_2_beta_tau_is_attained():
    """Alg. 3: the 2*beta*tau bound is tight.  1-D, v_0 = 0, tau = 1: two of N = 4
    points at -1 (inside, on the edge) are replaced by +1 (inside, opposite edge).
    Hand computation (the two points at 5 are outside and contribute v_0 = 0):
    before v_1 = (1/4)(-1 - 1) = -0.5; after v_1 = (1/4)(1 + 1) = 0.5; the change is
    1 = 2 * (2/4) * 1 = 2 * beta * tau."""
    points = torch.tensor([[-1.0], [-1.0], [5.0], [5.0]], dtype=F64)
    replaced = torch.tensor([[1.0], [1.0], [5.0], [5.0]], dtype=F64)
    centre = torch.zeros(1, 1, dtype=F64)
    before = threshold_clustering(points, centre, 1.0, rounds=1).centres
    after = threshold_clustering(replaced, centre, 1.0, rounds=1).centres
    assert before.item() == -0.5
    assert after.item() == 0.5
    assert (after - before).abs().item() == 2 * (2 / 4) * 1.0


def separated_clusters(seed: int, sizes: list[int], d: int, r: float = 1.0, gap: float = 100.0):
    """Clusters whose points lie within distance r of their cluster's anchor; anchors
    are pairwise at least `gap` apart (placed on a line along a random direction)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=g, dtype=F64)
    u = u / torch.linalg.vector_norm(u)
    anchors = torch.stack([i * gap * u for i in range(len(sizes))])
    blocks, labels = [], []
    for i, size in enumerate(sizes):
        noise = torch.randn(size, d, generator=g, dtype=F64)
        norms = torch.linalg.vector_norm(noise, dim=-1, keepdim=True).clamp_min(1e-12)
        radii = r * torch.rand(size, 1, generator=g, dtype=F64)
        blocks.append(anchors[i] + noise / norms * radii)
        labels += [i] * size
    order = torch.randperm(sum(sizes), generator=g)
    points = torch.cat(blocks)[order]
    labels = torch.tensor(labels)[order]
    return points, labels, anchors, g


@FAST
@given(
    seed=seeds,
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    d=st.integers(1, 4),
    rounds=st.integers(1, 6),
    method=st.sampled_from(["direct", "gram", "pairwise"]),
)
def test_ball_holding_exactly_one_cluster_contracts_by_one_minus_delta(seed, sizes, d, rounds, method):
    """Proof of Thm 3.1: if centre k's ball holds exactly cluster k's
    points in every round, then v_l - mean_k = (1 - delta_k)(v_{l-1} - mean_k) with
    delta_k = n_k/N.  Construction: cluster points within r = 1 of an anchor, anchors
    100 apart, initial centre within s = 2 of its anchor, tau = 5.5 >= 2r + (s + r)
    (every point of the cluster stays inside since ||v_l - mean|| only shrinks) and far
    below the distance to any other cluster.  Compared: outputs with rounds = l and
    rounds = l - 1, one centre per cluster (the centres are updated independently)."""
    points, labels, anchors, g = separated_clusters(seed, sizes, d)
    offsets = torch.randn(len(sizes), d, generator=g, dtype=F64)
    offsets = offsets / torch.linalg.vector_norm(offsets, dim=-1, keepdim=True) * 2.0 * torch.rand(
        len(sizes), 1, generator=g, dtype=F64
    )
    centres = anchors + offsets
    n = points.shape[0]
    means = torch.stack([points[labels == i].mean(0) for i in range(len(sizes))])
    delta = torch.tensor(sizes, dtype=F64) / n
    tol = 1e-11 if method == "direct" else 1e-9
    previous = threshold_clustering(points, centres, 5.5, 0, method=method).centres
    torch.testing.assert_close(previous, centres, rtol=0, atol=tol)
    for l in range(1, rounds + 1):
        result = threshold_clustering(points, centres, 5.5, l, method=method)
        membership = labels.unsqueeze(0) == torch.arange(len(sizes)).unsqueeze(1)
        assert torch.equal(result.inside, membership)
        expected = means + (1 - delta).unsqueeze(-1) * (previous - means)
        torch.testing.assert_close(result.centres, expected, rtol=0, atol=tol)
        closed_form = means + ((1 - delta) ** l).unsqueeze(-1) * (centres - means)
        torch.testing.assert_close(result.centres, closed_form, rtol=0, atol=tol)
        previous = result.centres


@settings(max_examples=25, deadline=None)
@given(
    seed=seeds,
    honest=st.integers(2, 6),
    others=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    d=st.integers(1, 3),
    data=st.data(),
)
def test_attacker_at_ball_edge_converges_to_mean_plus_beta_over_delta_tau_u(seed, honest, others, d, data):
    """Alg. 3: beta*N Byzantine points re-placed every round at v + tau*u (on the
    ball's edge, so inside with <=) pull the centre to the fixed point
    v* = mean_i + (beta/delta) tau u, geometrically: v_l - v* = (1 - delta)(v_{l-1} - v*).
    (From eq. 24: v_l = v_{l-1} + (1/N)[n_i (mean_i - v_{l-1}) + beta N tau u].)
    Honest cluster i: points within r = 1 of an anchor, initial centre within r of it,
    tau >= max(3r, 2r/(1 - beta/delta)) so they stay inside; other clusters 100 away.
    The attacker uses radius tau*(1 - 1e-9) so that rounding of v + tau u - v cannot
    push it out; the fixed point uses that same length."""
    byzantine = data.draw(st.integers(1, honest - 1), label="byzantine")
    points, labels, anchors, g = separated_clusters(seed, [honest, *others], d)
    n = points.shape[0] + byzantine
    delta, beta = honest / n, byzantine / n
    ratio = beta / delta
    tau = 1.25 * max(3.0, 2.0 / (1 - ratio))
    u = torch.randn(d, generator=g, dtype=F64)
    u = u / torch.linalg.vector_norm(u)
    reach = tau * (1 - 1e-9)
    mean = points[labels == 0].mean(0)
    fixed_point = mean + ratio * reach * u
    centre = (anchors[0] + 0.5 * torch.randn(d, generator=g, dtype=F64).clamp(-1, 1) / math.sqrt(d)).unsqueeze(0)
    start_gap = torch.linalg.vector_norm(centre[0] - fixed_point)
    rounds = math.ceil(math.log(1e-13) / math.log(1 - delta))
    for _ in range(rounds):
        attack = (centre[0] + reach * u).expand(byzantine, d)
        result = threshold_clustering(torch.cat([points, attack]), centre, tau, rounds=1)
        expected_inside = torch.cat([labels == 0, torch.ones(byzantine, dtype=torch.bool)])
        assert torch.equal(result.inside[0], expected_inside)
        expected = fixed_point + (1 - delta) * (centre[0] - fixed_point)
        torch.testing.assert_close(result.centres[0], expected, rtol=0, atol=1e-11)
        centre = result.centres
    gap = torch.linalg.vector_norm(centre[0] - fixed_point)
    assert gap <= 1e-13 * start_gap + 1e-10


# --------------------------------------------------------------------------------------
# Batching and the two evaluation methods
# --------------------------------------------------------------------------------------


@FAST
@given(
    seed=seeds,
    b=st.integers(1, 4),
    n=st.integers(1, 8),
    d=st.integers(1, 4),
    k=st.integers(1, 3),
    rounds=st.integers(0, 5),
    tau=st.floats(0.1, 6.0),
    q=st.floats(0.0, 1.0),
    name=st.sampled_from(["fixed", "quantile", "cd"]),
    method=st.sampled_from(["direct", "gram", "pairwise"]),
)
def test_batched_equals_unbatched(seed, b, n, d, k, rounds, tau, q, name, method):
    """Alg. 3 applied to B independent problems at once ([B, N, d], as FC does with one
    problem per client) gives each problem's own result."""
    avoid_rounding_ties(name, q, n)
    problems = [random_problem(seed + i, n, d, k) for i in range(b)]
    points, centres = stacked(problems)
    policy = policy_from(name, tau, q)
    batched = threshold_clustering(points, centres, policy, rounds, method=method)
    assert batched.centres.shape == (b, k, d) and batched.inside.shape == (b, k, n)
    assert batched.radius.shape == (b, k)
    for i, (p, c) in enumerate(problems):
        single = threshold_clustering(p, c, policy, rounds, method=method)
        torch.testing.assert_close(batched.centres[i], single.centres, rtol=1e-12, atol=1e-12)
        assert torch.equal(batched.inside[i], single.inside)
        torch.testing.assert_close(batched.radius[i], single.radius, rtol=1e-12, atol=1e-12)


@FAST
@given(
    seed=seeds,
    n=st.integers(1, 12),
    d=st.integers(1, 6),
    k=st.integers(1, 3),
    rounds=st.integers(0, 8),
    tau=st.floats(0.1, 6.0),
    q=st.floats(0.0, 1.0),
    name=st.sampled_from(["fixed", "quantile", "cd"]),
    method=st.sampled_from(["gram", "pairwise"]),
)
def test_inner_product_methods_equal_direct(seed, n, d, k, rounds, tau, q, name, method):
    """The inner-product evaluations (distances from ``||z||^2 - 2 <z, v> + ||v||^2``,
    with ``<z, v>`` kept lazily or from the points' Gram matrix) are the same eq. 24 as
    the direct one: equal centres (to rounding), memberships and radii."""
    avoid_rounding_ties(name, q, n)
    points, centres = random_problem(seed, n, d, k)
    policy = policy_from(name, tau, q)
    direct = threshold_clustering(points, centres, policy, rounds, method="direct")
    gram = threshold_clustering(points, centres, policy, rounds, method=method)
    torch.testing.assert_close(gram.centres, direct.centres, rtol=1e-8, atol=1e-8)
    assert torch.equal(gram.inside, direct.inside)
    # A distance from inner products, sqrt(||z||^2 - 2 <z, v> + ||v||^2), is off by up to
    # about sqrt(eps) ||z|| when it is near zero (cancellation): ~1e-7 here, not 1e-8.
    torch.testing.assert_close(gram.radius, direct.radius, rtol=1e-8, atol=1e-6)


@FAST
@given(
    **BATCHED_PROBLEMS,
    k=st.integers(1, 3),
    rounds=st.integers(1, 10),
    tau=st.floats(0.5, 8.0),
    q=st.floats(0.05, 0.6),
    name=st.sampled_from(["fixed", "quantile"]),
    share=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_gram_reading_only_undecided_points_equals_direct(seed, b, n, d, k, rounds, tau, q, name, share):
    """The "gram" evaluation reads, each round, only the points whose exact distance
    the radius policy needs (the others are decided by an interval around their
    distance), and takes one product with every point when more than ``share`` of them
    are needed.  Whatever the share (0: always the full product; 1: never), the
    memberships, radii and centres are those of the direct evaluation of eq. 24."""
    avoid_rounding_ties(name, q, n)
    points, centres = stacked([random_problem(seed + i, n, d, k, spread=6.0) for i in range(b)])
    policy = policy_from(name, tau, q)
    direct = threshold_clustering(points, centres, policy, rounds, method="direct", final_distances=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tc, "_FULL_PRODUCT_SHARE", share)
        gram = threshold_clustering(points, centres, policy, rounds, method="gram", final_distances=True)
    assert torch.equal(gram.inside, direct.inside)
    torch.testing.assert_close(gram.centres, direct.centres, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(gram.radius, direct.radius, rtol=1e-8, atol=1e-6)
    torch.testing.assert_close(gram.distances, direct.distances, rtol=1e-8, atol=1e-6)


@FAST
@given(
    **BATCHED_PROBLEMS,
    k=st.integers(2, 4),
    rounds=st.integers(1, 8),
    q=st.floats(0.05, 0.6),
    dead=st.booleans(),
    method=st.sampled_from(["gram", "direct", "pairwise"]),
    spread=st.sampled_from([0.2, 1.0, 6.0]),
)
def test_nearest_centre_is_the_argmin_of_the_exact_final_distances(seed, b, n, d, k, rounds, q, dead, method, spread):
    """Alg. 4's assignment: ``nearest`` is the index of each point's closest final
    centre, exactly as the argmin of the direct final distances, although the gram
    evaluation reads only the points whose intervals leave it open.  An inadmissible
    (NaN) initial centre is never anyone's nearest; inadmissible points get 0."""
    avoid_rounding_ties("quantile", q, n)
    points, centres = stacked([random_problem(seed + i, n, d, k, spread=spread) for i in range(b)])
    if dead:
        centres[:, 0] = math.nan
    points[:, -1] = math.inf  # one inadmissible point per problem
    policy = QuantileRadius(q)
    result = threshold_clustering(points, centres, policy, rounds, method=method, nearest=True)
    exact = threshold_clustering(points, centres, policy, rounds, method="direct", final_distances=True)
    assert result.distances is None
    expected = exact.distances.argmin(dim=-2)
    assert torch.equal(result.nearest, expected)
    assert bool((result.nearest[:, -1] == 0).all())
    if dead:
        assert bool((result.nearest[:, :-1] != 0).all())
    single = threshold_clustering(points[0], centres[0], policy, rounds, method=method, nearest=True)
    assert torch.equal(single.nearest, result.nearest[0])


@FAST
@given(
    **BATCHED_PROBLEMS,
    k=st.integers(1, 3),
    rounds=st.integers(0, 6),
    q=st.floats(0.05, 0.6),
    method=st.sampled_from(["direct", "gram", "pairwise"]),
    data=st.data(),
)
def test_centres_given_as_point_indices_start_at_those_points(seed, b, n, d, k, rounds, q, method, data):
    """Centres may be given as the indices of the points they start at (FC starts at
    the receiver's own gradient): the run is the one from those points' coordinates.
    Memberships and radii agree exactly and centres to rounding ("pairwise" takes the
    starts' products from the Gram matrix instead of one more product); unbatched
    ``[K]`` indices behave like one problem of the batch."""
    avoid_rounding_ties("quantile", q, n)
    points, _ = stacked([random_problem(seed + i, n, d, k) for i in range(b)])
    index = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, n - 1), min_size=k, max_size=k), min_size=b, max_size=b)))
    coordinates = torch.stack([points[i, index[i]] for i in range(b)])
    policy = QuantileRadius(q)
    by_index = threshold_clustering(points, index, policy, rounds, method=method, final_distances=True)
    by_value = threshold_clustering(points, coordinates, policy, rounds, method=method, final_distances=True)
    assert torch.equal(by_index.inside, by_value.inside)
    torch.testing.assert_close(by_index.centres, by_value.centres, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(by_index.radius, by_value.radius, rtol=1e-8, atol=1e-6)
    single = threshold_clustering(points[0], index[0], policy, rounds, method=method)
    assert torch.equal(single.inside, by_index.inside[0])
    torch.testing.assert_close(single.centres, by_index.centres[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", ["direct", "gram", "pairwise"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, 1e38])
def test_centre_starting_at_an_inadmissible_point_is_returned_unchanged(method, bad):
    """A centre started at a non-finite (or overflowing) point is dead, as a non-finite
    centre given by value: it captures nothing and comes back as that point, while a
    live centre of the same call clusters as it would alone."""
    g = torch.Generator().manual_seed(3)
    points = torch.randn(12, 2000, generator=g)
    points[4, 7] = bad
    result = threshold_clustering(points, torch.tensor([4, 0]), QuantileRadius(0.5), 3, method=method)
    alone = threshold_clustering(points, torch.tensor([0]), QuantileRadius(0.5), 3, method=method)
    assert not bool(result.inside[0].any())
    torch.testing.assert_close(result.centres[0], points[4], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(result.inside[1], alone.inside[0])
    torch.testing.assert_close(result.centres[1], alone.centres[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("points", "centres", "message"),
    [
        (torch.zeros(5, 3), torch.tensor([5]), r"centre indices must lie in \[0, 5\)"),
        (torch.zeros(5, 3), torch.tensor([-1]), "centre indices must lie"),
        (torch.zeros(2, 5, 3), torch.tensor([0, 1]), r"must be \[K\] for points \[N, d\] or \[B, K\]"),
        (torch.zeros(2, 5, 3), torch.zeros(3, 1, dtype=torch.long), r"\[B, K\] for points \[B, N, d\]"),
    ],
)
def test_invalid_centre_indices_raise_value_error(points, centres, message):
    with pytest.raises(ValueError, match=message):
        threshold_clustering(points, centres, 1.0, 1, method="pairwise")


@pytest.mark.parametrize("method", ["gram", "pairwise"])
def test_inner_products_read_coordinates_where_rounding_would_decide(method):
    """A centre among a tight cluster of 1e6-sized float32 rows (the large-gradient
    attack's shape): distances of ~1e4 are far below the rounding of inner products of
    such rows, so the inner-product evaluations cannot decide those memberships from
    their products; they read those rows' coordinates (or, pairwise, evaluate the
    problem again by gram) and end with the direct evaluation's memberships, without a
    warning."""
    g = torch.Generator().manual_seed(0)
    d = 2000
    points = torch.cat([torch.randn(10, d, generator=g), 1e6 + 100 * torch.randn(20, d, generator=g)])
    centre = points[10:11] + 10 * torch.randn(1, d, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rounds in range(1, 6):
            direct = threshold_clustering(points, centre, QuantileRadius(0.3), rounds, method="direct")
            other = threshold_clustering(points, centre, QuantileRadius(0.3), rounds, method=method)
            assert torch.equal(other.inside, direct.inside), rounds


def test_gram_settles_far_rows_without_reading_them(monkeypatch):
    """A centre among 1e6-sized rows (the large-gradient attack) whose quantile radius
    falls among small honest rows: the honest rows' distances differ by far less than
    float32 rounding of 1e6-sized inner products, so no product could order them
    better than the interval from their own norms (``||z_j|| R``) does.  They are
    settled from scalars and never read; the attack rows, whose intervals are wider
    than rounding, are."""
    g = torch.Generator().manual_seed(0)
    d = 4000
    honest = torch.randn(10, d, generator=g)
    points = torch.cat([honest, 1e6 + 100 * torch.randn(20, d, generator=g)])
    read_rows = []
    original = tc.row_products

    def spy(z, rows, vectors):
        read_rows.append(rows.clone())
        return original(z, rows, vectors)

    monkeypatch.setattr(tc, "row_products", spy)
    monkeypatch.setattr(tc, "_FULL_PRODUCT_SHARE", 1.0)  # reads, never a full product
    threshold_clustering(points, points[10:11].clone(), QuantileRadius(0.8), 6, method="gram")
    assert read_rows, "the attack rows' memberships need reads"
    assert not any(bool(rows[..., :10].any()) for rows in read_rows)


@FAST
@given(seed=seeds, b=st.integers(1, 2), n=st.integers(1, 30), d=st.integers(1, 40), k=st.integers(1, 3), data=st.data())
def test_centre_dots_intervals_contain_the_distances(seed, b, n, d, k, data):
    """The lazily kept inner products of the "gram" evaluation: after any sequence of
    eq. 24 steps (any memberships; full products or reads of the undecided rows at any
    rounds), the centre equals the
    explicit recursion ``v <- a v + w / N`` and every point's distance to it lies in the
    interval computed from scalars alone: Cauchy-Schwarz on the residual's products,
    around the centre (``sqrt(E + R^2) -+ R``) and around the origin (``||z_j|| R``).
    Where the interval is no wider than the rounding slack, the estimate it returns
    is within that slack of the exact squared distance."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(b, n, d, generator=g, dtype=F64) * data.draw(st.sampled_from([0.1, 1.0, 30.0]))
    v = torch.randn(b, k, d, generator=g, dtype=F64)
    dots = tc._CentreDots(z, tc.squared_norms(z), torch.ones(b, n, dtype=torch.bool), v, torch.bmm(v, z.transpose(1, 2)))
    inside = torch.zeros(b, k, n, dtype=torch.bool)
    policy = QuantileRadius(data.draw(st.floats(0.0, 1.0)))
    for _ in range(data.draw(st.integers(1, 8))):
        action = data.draw(st.sampled_from(["none", "full", "read"]))
        if action == "full":
            dots.full_product()
        elif action == "read":  # reads the undecided rows only, however many
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(tc, "_FULL_PRODUCT_SHARE", 1.0)
                distances = dots.distances(policy.undecided)
            # exact to rounding or a lower bound: squared distances from inner products
            # (computed or settled) are within the rounding slack, so near zero a
            # distance may exceed the true one by about sqrt(eps) ||z||
            bound = torch.cdist(v, z).square() + 2 * dots.slack() + 1e-12
            assert bool((distances.square() <= bound).all())
        entered = torch.rand(b, k, n, generator=g) < data.draw(st.floats(0.0, 1.0))
        change = entered.to(F64) - inside.to(F64)
        ball = torch.bmm(entered.to(F64), z)
        v = v * (1 - entered.to(F64).sum(-1, keepdim=True) / n) + ball / n
        dots.step(change if bool(change.any()) else None, entered)
        inside = entered
        torch.testing.assert_close(dots.centres, v, rtol=1e-10, atol=1e-10)
        lower, upper, estimate, settled = dots._bounds()
        exact = torch.cdist(v, z)
        assert bool((lower <= exact * (1 + 1e-9) + 1e-9).all()) and bool((exact <= upper * (1 + 1e-9) + 1e-9).all())
        # a settled estimate is within the rounding slack of the exact squared distance
        error = (estimate.square() - exact.square()).abs()
        assert bool((error[settled] <= 2 * dots.slack()[settled] + 1e-9).all())


@FAST
@given(seed=seeds, b=st.integers(1, 3), n=st.integers(1, 30), d=st.integers(1, 40), k=st.integers(1, 4), data=st.data())
def test_row_products_and_weighted_rows_equal_full_products(seed, b, n, d, k, data):
    """The two partial readers of the points: inner products of chosen rows with K
    vectors equal those rows of the full product, and a sparse weighted sum of rows
    (read in place or by the blocked product) equals ``weights @ z``, for any sparsity."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(b, n, d, generator=g, dtype=F64)
    vectors = torch.randn(b, k, d, generator=g, dtype=F64)
    rows = torch.rand(b, n, generator=g) < data.draw(st.floats(0.0, 1.0))
    products = tc.row_products(z, rows, vectors)
    full = torch.bmm(vectors, z.transpose(1, 2))
    mask = rows.unsqueeze(1).expand_as(full)
    torch.testing.assert_close(products[mask], full[mask], rtol=1e-12, atol=1e-12)
    weights = torch.randn(b, k, n, generator=g, dtype=F64)
    weights = weights * (torch.rand(b, k, n, generator=g) < data.draw(st.floats(0.0, 1.0)))
    torch.testing.assert_close(tc.weighted_rows(weights, z), torch.bmm(weights, z), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------
# Edge cases: rounds = 0, inadmissible rows, no mutation, strict inclusion
# --------------------------------------------------------------------------------------


@FAST
@given(
    seed=seeds,
    n=st.integers(1, 8),
    d=st.integers(1, 4),
    k=st.integers(1, 3),
    method=st.sampled_from(["direct", "gram", "pairwise"]),
)
def test_zero_rounds_returns_initial_centres(seed, n, d, k, method):
    """Alg. 3 with M = 0 rounds outputs v_{k,0}: the initial centres, unchanged."""
    points, centres = random_problem(seed, n, d, k)
    result = threshold_clustering(points, centres, 1.0, rounds=0, method=method)
    torch.testing.assert_close(result.centres, centres, rtol=0, atol=0 if method == "direct" else 1e-12)
    assert not result.inside.any()


@FAST
@given(**BATCHED_PROBLEMS, k=st.integers(1, 3), rounds=st.integers(0, 4), method=st.sampled_from(["direct", "gram", "pairwise"]))
def test_results_share_no_memory_with_inputs_or_later_calls(seed, b, n, d, k, rounds, method):
    """The returned centres are new tensors: writing to them leaves the caller's
    centres alone, and a later call (which reuses the engine's scratch memory) leaves
    an earlier result unchanged."""
    first, second = (stacked([random_problem(seed + i * b + j, n, d, k) for j in range(b)]) for i in (0, 1))
    kept_centres = first[1].clone()
    result = threshold_clustering(*first, 2.0, rounds=rounds, method=method, final_distances=True)
    snapshot = {name: value.clone() for name, value in vars(result).items() if value is not None}
    threshold_clustering(*second, 2.0, rounds=rounds, method=method, final_distances=True)
    for name, value in snapshot.items():
        assert torch.equal(getattr(result, name), value), name
    result.centres.add_(1.0)
    assert torch.equal(first[1], kept_centres)


BAD_ROWS = {
    torch.float64: [math.nan, math.inf, -math.inf, 1e300],
    torch.float32: [math.nan, math.inf, -math.inf, 1e38],
}


@FAST
@given(
    seed=seeds,
    n=st.integers(1, 8),
    d=st.integers(1, 4),
    k=st.integers(1, 3),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    name=st.sampled_from(["fixed", "quantile", "cd"]),
    method=st.sampled_from(["direct", "gram", "pairwise"]),
    data=st.data(),
)
def test_non_finite_rows_are_never_inside_and_centres_stay_finite(seed, n, d, k, dtype, name, method, data):
    """Robustness rule (module docstring; a Byzantine row may be anything): a row with
    a NaN/Inf coordinate, or whose squared norm overflows (1e38 in float32, 1e300 in
    float64), is never inside any ball, the centres stay finite, and the inputs are not
    mutated.  With a fixed radius, such rows act exactly like far-away points."""
    points, centres = random_problem(seed, n, d, k)
    points, centres = points.to(dtype), centres.to(dtype)
    bad = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True), label="bad rows")
    values = data.draw(st.lists(st.sampled_from(BAD_ROWS[dtype]), min_size=len(bad), max_size=len(bad)))
    whole_row = data.draw(st.booleans(), label="whole row")
    corrupted = points.clone()
    for row, value in zip(bad, values):
        if whole_row or value == BAD_ROWS[dtype][-1]:
            corrupted[row] = value
        else:
            corrupted[row, 0] = value
    points_copy, centres_copy = corrupted.clone(), centres.clone()
    policy = policy_from(name, 2.0, 0.5)
    result = threshold_clustering(corrupted, centres, policy, rounds=5, method=method)
    assert not result.inside[:, bad].any()
    assert torch.isfinite(result.centres).all()
    torch.testing.assert_close(corrupted, points_copy, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(centres, centres_copy)
    if name == "fixed":
        far = corrupted.clone()
        far[bad] = 1e6
        reference = threshold_clustering(far, centres, policy, rounds=5, method=method)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(result.centres, reference.centres, rtol=tol, atol=tol)
        assert torch.equal(result.inside, reference.inside)


def test_strict_and_non_strict_inclusion_at_distance_exactly_tau():
    """eq. 24 uses ||z - v|| <= tau: a point at distance exactly tau is inside; with
    strict inclusion (the official code's '<') it is not.  Hand computation (1-D, N = 2,
    v_0 = 0, tau = 1, z = {1, 3}): non-strict v_1 = (1 + 0)/2 = 0.5; strict v_1 = 0."""
    points = torch.tensor([[1.0], [3.0]], dtype=F64)
    centre = torch.zeros(1, 1, dtype=F64)
    loose = threshold_clustering(points, centre, FixedRadius(1.0), rounds=1)
    strict = threshold_clustering(points, centre, FixedRadius(1.0, strict=True), rounds=1)
    assert loose.inside.tolist() == [[True, False]] and loose.centres.item() == 0.5
    assert strict.inside.tolist() == [[False, False]] and strict.centres.item() == 0.0
    # quantile radius: the 0-quantile of {1, 3} is 1, the distance of the first point
    q_loose = threshold_clustering(points, centre, QuantileRadius(0.0), rounds=1)
    q_strict = threshold_clustering(points, centre, QuantileRadius(0.0, strict=True), rounds=1)
    assert q_loose.centres.item() == 0.5 and q_strict.centres.item() == 0.0
    for method in ("direct", "gram", "pairwise"):
        assert threshold_clustering(points, centre, 1.0, 1, method=method).inside.tolist() == [[True, False]]


def test_thresholding_can_increase_variance_counterexample():
    """Alg. 3: the proof of Thm 3.1 claims Var(y) <= Var(z) for the thresholded
    points y = z if ||z - v|| <= tau else v.  False: z = v + tau e or v + (tau + eps) e
    with probability 1/2 each gives Var z = eps^2/4 but Var y = tau^2/4.  Here v = 0,
    tau = 1, eps = 1/4: Var z = 1/64, Var y = 1/4 (exact in binary floating point)."""
    tau, eps = 1.0, 0.25
    z = torch.tensor([[tau], [tau + eps]], dtype=F64)
    v = torch.zeros(1, 1, dtype=F64)
    result = threshold_clustering(z, v, tau, rounds=1)
    assert result.inside.tolist() == [[True, False]]
    y = torch.where(result.inside[0].unsqueeze(-1), z, v)
    var_z = z.var(dim=0, unbiased=False).item()
    var_y = y.var(dim=0, unbiased=False).item()
    assert var_z == eps**2 / 4 == 1 / 64
    assert var_y == tau**2 / 4 == 1 / 4
    assert var_y > var_z  # the proof's claim Var(y) <= Var(z) fails
    # and the output of one step is the mean of the thresholded points (eq. 24)
    assert result.centres.item() == y.mean().item() == 0.5


def test_invalid_arguments_raise_value_error():
    """Argument validation: negative rounds, unknown method and mismatched shapes are
    rejected with ValueError."""
    points = torch.zeros(3, 2, dtype=F64)
    centres = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError, match="rounds"):
        threshold_clustering(points, centres, 1.0, rounds=-1)
    with pytest.raises(ValueError, match="method"):
        threshold_clustering(points, centres, 1.0, method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dimension"):
        threshold_clustering(points, torch.zeros(1, 3, dtype=F64), 1.0)
    with pytest.raises(ValueError):
        threshold_clustering(points, torch.zeros(2, 1, 2, dtype=F64), 1.0)


@FAST
@given(
    seed=seeds,
    n=st.integers(1, 8),
    d=st.integers(1, 4),
    k=st.integers(2, 4),
    name=st.sampled_from(["fixed", "quantile", "cd"]),
    method=st.sampled_from(["direct", "gram", "pairwise"]),
    data=st.data(),
)
def test_non_finite_initial_centre_is_returned_unchanged_and_captures_nothing(seed, n, d, k, name, method, data):
    """Documented contract (threshold_clustering docstring): a non-finite initial centre
    (a diverged client) is returned unchanged and captures no point, and the other
    centres are computed exactly as if it were absent (centres are independent, eq. 24)."""
    points, centres = random_problem(seed, n, d, k)
    dead = data.draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=k - 1, unique=True), label="dead")
    value = data.draw(st.sampled_from([math.nan, math.inf, -math.inf, 1e300]), label="value")
    broken = centres.clone()
    broken[dead] = value
    policy = policy_from(name, 2.0, 0.5)
    result = threshold_clustering(points, broken, policy, rounds=2, method=method)
    torch.testing.assert_close(result.centres[dead], broken[dead], rtol=0, atol=0, equal_nan=True)
    assert not result.inside[dead].any()
    alive = [i for i in range(k) if i not in dead]
    reference = threshold_clustering(points, centres[alive], policy, rounds=2, method=method)
    torch.testing.assert_close(result.centres[alive], reference.centres, rtol=1e-12, atol=1e-12)
    assert torch.equal(result.inside[alive], reference.inside)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 12), st.integers(1, 6), st.integers(0, 10_000))
def test_nearest_centre_gram_and_direct_agree_away_from_ties(k, n, d, seed):
    """Both evaluations pick the nearest centre; rounding can only matter at near-ties,
    which are excluded here (a margin of 1e-6 relative to the scale)."""
    g = torch.Generator().manual_seed(seed)
    points = torch.randn(n, d, generator=g, dtype=torch.float64) * 3
    centres = torch.randn(k, d, generator=g, dtype=torch.float64) * 3
    exact = torch.cdist(points, centres).sort(dim=-1).values
    if k > 1:
        assume(bool(((exact[:, 1] - exact[:, 0]) > 1e-6 * (1 + exact[:, 1])).all()))
    direct = nearest_centre(points, centres, method="direct")
    gram = nearest_centre(points, centres, method="gram")
    assert torch.equal(direct, gram)
    assert torch.equal(direct, torch.cdist(points, centres).argmin(-1))


@pytest.mark.parametrize("method", ["direct", "gram"])
def test_nearest_centre_sends_inadmissible_points_to_centre_zero(method):
    points = torch.tensor([[5.0, 5.0], [math.nan, 0.0], [math.inf, 1.0], [1e38, 1e38], [-5.0, -5.0]])
    centres = torch.tensor([[-5.0, -5.0], [5.0, 5.0]])
    assert nearest_centre(points, centres, method=method).tolist() == [1, 0, 0, 0, 0]


def far_row_problem(seed: int, near: int, lead: int, trail: int, d: int, k: int):
    """float32 points shaped like FC's messages under the large-gradient attack:
    ``near`` gradient-sized rows (coordinates ~0.01, norms ~0.01 sqrt(d)) between
    ``lead`` and ``trail`` attack rows ``1e6 + 200 randn``, whose norms exceed every
    honest norm by far more than ``2 / eps``; centres at the first ``k`` near rows."""
    g = torch.Generator().manual_seed(seed)
    honest = 0.01 * (torch.randn(3, d, generator=g)[torch.randint(0, 3, (near,), generator=g)] + 0.3 * torch.randn(near, d, generator=g))
    attack = 1e6 + 200 * torch.randn(lead + trail, d, generator=g)
    points = torch.cat([attack[:lead], honest, attack[lead:]])
    return points, torch.arange(lead, lead + k)


@FAST
@given(
    seed=seeds,
    near=st.integers(8, 30),
    lead=st.integers(0, 4),
    trail=st.integers(0, 6),
    d=st.sampled_from([50, 3000, 20000]),
    k=st.integers(1, 3),
    q=st.floats(0.1, 0.6),
    name=st.sampled_from(["quantile", "fixed", "cd"]),
)
@example(seed=9, near=9, lead=0, trail=3, d=20000, k=1, q=0.5, name="fixed")  # a point on its centre
def test_pairwise_leaves_out_far_rows_products_and_clusters_as_with_all(seed, near, lead, trail, d, k, q, name):
    """Rows far out of every centre's reach (``||z|| >= 2 S / eps``) at either end get
    only their squared norms: their products are below the rounding of those norms.
    The run then equals the run from all products: memberships and radii exactly
    (float32 rounding of a distance of 1e6 sqrt(d) swamps any product with a
    gradient-sized centre), centres to rounding; and it agrees with the direct
    evaluation on every membership.  (Far rows are looked for when they are fewer
    than the others: a near row's norm is guessed from the median row.)"""
    assume(lead + trail < near)
    pc = sys.modules["defenses.pairwise_clustering"]
    points, index = far_row_problem(seed, near, lead, trail, d, k)
    n = points.shape[0]
    avoid_rounding_ties("quantile", q, n)
    policy = policy_from(name, 0.5 * 0.01 * math.sqrt(d), q)
    z, starts = points.unsqueeze(0), index.unsqueeze(0)
    v0 = points[index].unsqueeze(0)
    products = pc.pairwise_products(z, v0, starts)
    if lead + trail:
        assert products.far is not None and products.far.tolist() == [True] * lead + [False] * near + [True] * trail
        off_diagonal = products.gram[0] - torch.diag(products.gram[0].diagonal())
        assert not bool(off_diagonal[products.far].any()) and not bool(off_diagonal[:, products.far].any())
        far_rows = points[products.far].double()
        torch.testing.assert_close(products.gram[0].diagonal()[products.far].double(), (far_rows * far_rows).sum(-1), rtol=1e-4, atol=0)
    admissible = torch.ones(1, n, dtype=torch.bool)
    left_out = pc.run_pairwise(z, v0, admissible, products, starts, policy, 6, True)
    every = pc.run_pairwise(z, v0, admissible, pc.PairwiseProducts(*pc._all_products(z, v0, starts), products.start_norms), starts, policy, 6, True)
    assert torch.equal(left_out[1], every[1])
    torch.testing.assert_close(left_out[2], every[2], rtol=1e-5, atol=0)
    torch.testing.assert_close(left_out[0], every[0], rtol=1e-4, atol=1e-6)
    # a distance from Gram products carries the cancellation sqrt(eps ||z||^2) of the
    # rows' squared norms: the two runs' products are summed in other blocks
    near_rows = points if products.far is None else points[~products.far]
    cancellation = math.sqrt(4 * torch.finfo(points.dtype).eps * float(near_rows.double().square().sum(-1).max()))
    torch.testing.assert_close(left_out[3], every[3], rtol=1e-5, atol=max(1e-6, 4 * cancellation))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        direct = threshold_clustering(points, index, policy, 6, method="direct")
    assert torch.equal(left_out[1][0], direct.inside)


def test_pairwise_reruns_from_all_products_when_a_far_row_enters_a_ball():
    """A radius of the far rows' own size takes them into the ball; their left-out
    products are then needed, and the run is repeated from all products: the result is
    the direct evaluation's (every point inside, the centre the mean after one round)."""
    points, index = far_row_problem(0, 20, 0, 5, 3000, 1)
    pc = sys.modules["defenses.pairwise_clustering"]
    assert pc.pairwise_products(points.unsqueeze(0), points[index].unsqueeze(0), index.unsqueeze(0)).far is not None
    policy = FixedRadius(1e12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = threshold_clustering(points, index, policy, 1, method="pairwise")
        direct = threshold_clustering(points, index, policy, 1, method="direct")
    assert bool(result.inside.all()) and torch.equal(result.inside, direct.inside)
    torch.testing.assert_close(result.centres[0], points.double().mean(0).float(), rtol=1e-4, atol=0)
    torch.testing.assert_close(result.centres, direct.centres, rtol=1e-4, atol=0)


@pytest.mark.parametrize("scale", [1e3, 1e5])
def test_pairwise_keeps_the_products_of_rows_within_reach(scale):
    """Rows only ``scale`` times the honest norms (below ``2 / eps``, about 1.7e7) have
    products that float32 resolves: they stay in the Gram matrix."""
    g = torch.Generator().manual_seed(1)
    points = torch.cat([torch.randn(20, 3000, generator=g), scale * torch.randn(4, 3000, generator=g)])
    pc = sys.modules["defenses.pairwise_clustering"]
    products = pc.pairwise_products(points.unsqueeze(0), points[:1].unsqueeze(0), torch.zeros(1, 1, dtype=torch.long))
    assert products.far is None
    torch.testing.assert_close(products.gram[0], points @ points.T, rtol=1e-5, atol=1e-3 * scale)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_pairwise_leaves_out_non_finite_trailing_rows(bad):
    """Non-finite rows are inadmissible (never inside, infinitely far): at the end of
    the points they are left out of the Gram matrix too, and the run is the one
    without them."""
    g = torch.Generator().manual_seed(2)
    honest = torch.randn(16, 3000, generator=g)
    points = torch.cat([honest, torch.full((3, 3000), bad)])
    pc = sys.modules["defenses.pairwise_clustering"]
    products = pc.pairwise_products(points.unsqueeze(0), honest[:1].unsqueeze(0), torch.zeros(1, 1, dtype=torch.long))
    assert products.far is not None and products.far[16:].all() and not products.far[:16].any()
    policy = QuantileRadius(0.4)
    result = threshold_clustering(points, torch.tensor([0]), policy, 4, method="pairwise")
    direct = threshold_clustering(points, torch.tensor([0]), policy, 4, method="direct")
    assert not bool(result.inside[:, 16:].any()) and torch.equal(result.inside, direct.inside)
    torch.testing.assert_close(result.centres, direct.centres, rtol=1e-5, atol=1e-6)


@FAST
@given(
    seed=seeds,
    b=st.integers(1, 3),
    lead=st.integers(0, 4),
    n=st.integers(1, 70),
    d=st.sampled_from([3, 200, 1500]),
    bad=st.sampled_from([None, math.nan, math.inf]),
    layout=st.sampled_from(["contiguous", "transposed", "sliced"]),
)
def test_gram_and_leading_rows_match_float64_products(seed, b, lead, n, d, bad, layout):
    """The Gram product of the last ``n`` rows (``n mod 16`` columns taken apart on
    the CPU) and the leading rows' products with them are the float64 products to
    float32 rounding, for contiguous and strided rows alike; the Gram matrix is
    symmetric, and a non-finite row spoils only its own row and column."""
    pc = sys.modules["defenses.pairwise_clustering"]
    g = torch.Generator().manual_seed(seed)
    if layout == "transposed":
        rows = torch.randn(b, d, lead + n, generator=g).transpose(1, 2)
    elif layout == "sliced":
        rows = torch.randn(b, lead + n, d + 3, generator=g)[..., 2 : d + 2]
    else:
        rows = torch.randn(b, lead + n, d, generator=g)
    spoiled = None
    if bad is not None:
        spoiled = int(torch.randint(0, lead + n, (1,), generator=g))
        rows[:, spoiled, 0] = bad
    gram, lead_products = pc._gram_and_leading_rows(rows, n)
    both = torch.bmm(rows.double(), rows[:, lead:].double().transpose(1, 2))
    assert gram.shape == (b, n, n) and lead_products.shape == (b, lead, n)
    good = torch.ones(lead + n, dtype=torch.bool)
    if spoiled is not None:
        good[spoiled] = False
        assert not bool(torch.cat([lead_products, gram], 1)[:, spoiled].isfinite().any())
        if spoiled >= lead:
            assert not bool(gram[..., spoiled - lead].isfinite().any())
    kept = both[:, good][..., good[lead:]]
    computed = torch.cat([lead_products, gram], 1)[:, good][..., good[lead:]]
    assert bool(computed.isfinite().all())
    largest = float(rows[:, good].double().square().sum(-1).amax()) if bool(good.any()) else 0.0
    tolerance = 4 * torch.finfo(torch.float32).eps * math.sqrt(d) * largest
    torch.testing.assert_close(computed.double(), kept, rtol=0, atol=tolerance)
    finite = gram[:, good[lead:]][..., good[lead:]]
    torch.testing.assert_close(finite, finite.transpose(1, 2), rtol=0, atol=tolerance)


def centres_stacked_ahead(points: torch.Tensor, centres: torch.Tensor):
    """``(points, centres)`` copied into one ``[K + N, d]`` buffer, the centres first:
    the layout Momentum-Clustering keeps for its warm-started centres."""
    whole = torch.cat([centres, points])
    return whole[centres.shape[0] :], whole[: centres.shape[0]]


@FAST
@given(
    seed=seeds,
    near=st.integers(8, 40),
    trail=st.integers(0, 6),
    d=st.sampled_from([50, 3000]),
    k=st.integers(1, 4),
    q=st.floats(0.1, 0.6),
    name=st.sampled_from(["quantile", "fixed", "cd"]),
)
def test_pairwise_with_centres_stored_ahead_clusters_as_with_separate_centres(seed, near, trail, d, k, q, name):
    """Centres whose rows lie in the points' buffer just ahead of them get their
    products with the points from the Gram product itself.  The run equals the one
    with the same centres held apart (memberships and radii exactly, centres to
    rounding), with or without trailing attack rows left out of the product."""
    pc = sys.modules["defenses.pairwise_clustering"]
    points, index = far_row_problem(seed, near, 0, trail, d, k)
    n = points.shape[0]
    avoid_rounding_ties("quantile", q, n)
    g = torch.Generator().manual_seed(seed)
    centres = points[index] + 0.002 * torch.randn(k, d, generator=g)
    policy = policy_from(name, 0.5 * 0.01 * math.sqrt(d), q)
    ahead_points, ahead_centres = centres_stacked_ahead(points, centres)
    assert pc._stacked_ahead(ahead_centres.unsqueeze(0), ahead_points.unsqueeze(0)) is not None
    assert pc._stacked_ahead(centres.unsqueeze(0), points.unsqueeze(0)) is None
    apart = threshold_clustering(points, centres, policy, 6, method="pairwise", final_distances=True, nearest=True)
    ahead = threshold_clustering(ahead_points, ahead_centres, policy, 6, method="pairwise", final_distances=True, nearest=True)
    assert torch.equal(ahead.inside, apart.inside)
    torch.testing.assert_close(ahead.radius, apart.radius, rtol=1e-5, atol=0)
    torch.testing.assert_close(ahead.centres, apart.centres, rtol=1e-4, atol=1e-6)
    # the nearest centre: the same one, up to ties (centres whose balls hold the same
    # points coincide, and rounding then picks among them)
    chosen = apart.distances.gather(0, ahead.nearest.unsqueeze(0))[0]
    torch.testing.assert_close(chosen, apart.distances.amin(0), rtol=1e-5, atol=1e-6)
    assert torch.equal(ahead_centres, centres)  # the stored centres are read, not moved


def test_stacked_ahead_needs_the_rows_right_before_the_points():
    """Only centres ending exactly where the points begin, in one buffer, are joined,
    and the joined view is exactly the centres followed by the points."""
    pc = sys.modules["defenses.pairwise_clustering"]
    whole = torch.randn(2, 12, 30)
    joined = pc._stacked_ahead(whole[:, :3], whole[:, 3:])
    assert joined is not None and torch.equal(joined, whole)
    one = torch.randn(9, 30)
    assert torch.equal(pc._stacked_ahead(one[None, :1], one[None, 1:]), one[None])  # K = 1
    assert pc._stacked_ahead(whole[:, :2], whole[:, 3:]) is None  # a row between them
    assert pc._stacked_ahead(whole[:, 3:5], whole[:, 3:]) is None  # overlapping
    assert pc._stacked_ahead(whole[:, :3, :20], whole[:, 3:, :20]) is None  # rows not contiguous
    assert pc._stacked_ahead(whole[:, :3].double(), whole[:, 3:].double()) is None  # copies
    assert pc._stacked_ahead(whole[:1, :3], whole[1:, 3:]) is None  # another problem's rows
    assert pc._stacked_ahead(whole[:, :3], whole[:, 3:]._neg_view()) is None  # a lazy negation
    flat = torch.randn(8, 6)
    assert pc._stacked_ahead(flat[None, :2, :4], flat[None, 2:]) is None  # other dimension


def test_stacked_ahead_keeps_the_centres_on_the_autograd_graph():
    """Centres that need gradients are not read through a view of the storage, which
    would cut them off the graph: their products come from a product of their own."""
    pc = sys.modules["defenses.pairwise_clustering"]
    whole = torch.randn(1, 10, 40, dtype=F64, requires_grad=True)
    centres, points = whole[:, :2], whole[:, 2:]
    assert pc._stacked_ahead(centres, points) is None
    products = pc.pairwise_products(points, centres)
    products.starts.sum().backward()
    expected = points.detach()[0].sum(0).expand(2, -1)  # d/dv0_k of sum_j <v0_k, z_j>
    torch.testing.assert_close(whole.grad[0, :2], expected)
