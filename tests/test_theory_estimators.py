"""Tests of theory_checks.estimators: closed forms on quadratics built as linear
regression (numpy float64, independent of the torch code), batched results against
per-client loops, the paper's exact facts as hypothesis properties (Lemma 7, Lemma 14,
the Assumption 5 frontier), exclusion of non-finite Byzantine rows, error messages."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from robust_pfl.engine.data import ClientData
from robust_pfl.engine.objectives import DenseNetwork, linear_regression
from theory_checks.estimators import (
    SeparationFrontier,
    batch_noise,
    cloud_noise,
    cloud_separation,
    federation_fractions,
    full_gradients,
    gradient_noise,
    intra_cluster_ratio,
    momentum_constants,
    momentum_noise,
    own_model_ratios,
    own_model_separations,
    separation,
    separation_frontier,
    smoothness,
    strong_convexity,
)

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def regression_data(inputs: np.ndarray, targets: np.ndarray) -> ClientData:
    return ClientData(torch.from_numpy(inputs), torch.from_numpy(targets))


def clustered_quadratics(seed: int, clusters: int, per_cluster: int, dim: int, samples: int):
    """Client i of cluster k: A_i with N(0,1) entries, y_i = A_i c_k, so
    f_i(x) = 1/2 (x - c_k)^T H_i (x - c_k) with H_i = A_i^T A_i / n."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(clusters), per_cluster)
    optima = rng.normal(size=(clusters, dim)) * 3
    inputs = rng.normal(size=(labels.size, samples, dim))
    targets = np.einsum("isd,id->is", inputs, optima[labels])
    hessians = np.einsum("isd,ise->ide", inputs, inputs) / samples
    return labels, optima, inputs, targets, hessians


# -- A^2 and Delta^2: closed forms -------------------------------------------------------


def test_intra_cluster_ratio_matches_the_closed_form_supremum_on_quadratics():
    """With a shared optimum c_k, the ratio of eq. (31) at x = c_k + u is
    ||(H_i - Hbar) u||^2 / ||Hbar u||^2, whose sup over u is the largest singular value
    of (H_i - Hbar) Hbar^{-1}, squared, attained at u = Hbar^{-1} w (w its right singular
    vector).  Evaluated at every client's maximiser, the estimate is that sup."""
    labels, optima, inputs, targets, hessians = clustered_quadratics(1, 2, 3, 3, 6)
    sups, maximisers = [], []
    for i, k in enumerate(labels):
        mean = hessians[labels == k].mean(0)
        inverse = np.linalg.inv(mean)
        _, singular, right = np.linalg.svd((hessians[i] - mean) @ inverse)
        sups.append(singular[0] ** 2)
        maximisers.append(optima[k] + inverse @ right[0])
    data = regression_data(inputs, targets)
    gradients = full_gradients(linear_regression(3), torch.tensor(np.array(maximisers)), data)
    estimate = intra_cluster_ratio(gradients, torch.from_numpy(labels))
    assert estimate.value == pytest.approx(max(sups), rel=1e-6)
    assert estimate.where["client"] == int(np.argmax(sups))
    assert estimate.where["model"] == int(np.argmax(sups))  # each sup is attained at its own point
    assert estimate.details["per_client"] == pytest.approx(sups, rel=1e-6)
    assert estimate.extreme == "max" and estimate.samples == 6 * 6


def test_separation_with_equal_hessians_is_the_gap_of_the_optima():
    """With H_i = H for every client (A_i = sqrt(n) U_i H^{1/2}, U_i orthonormal columns),
    g_i(x) - g_j(x) = H (c_l - c_k) at every x: Delta^2 = min_{k != l} ||H (c_k - c_l)||^2,
    and A^2 = 0 (every client of a cluster has the same gradient)."""
    rng = np.random.default_rng(2)
    dim, samples, clusters, per_cluster = 3, 5, 3, 2
    root = rng.normal(size=(dim, dim))
    hessian = root @ root.T + np.eye(dim)
    values, vectors = np.linalg.eigh(hessian)
    half = vectors @ np.diag(np.sqrt(values)) @ vectors.T
    labels = np.repeat(np.arange(clusters), per_cluster)
    optima = rng.normal(size=(clusters, dim)) * 2
    frames = [np.linalg.qr(rng.normal(size=(samples, dim)))[0] for _ in labels]
    inputs = np.stack([math.sqrt(samples) * frame @ half for frame in frames])
    targets = np.einsum("isd,id->is", inputs, optima[labels])
    gaps = [np.sum((hessian @ (optima[k] - optima[l])) ** 2)
            for k in range(clusters) for l in range(clusters) if k != l]
    models = torch.from_numpy(rng.normal(size=(4, dim)) * 5)
    gradients = full_gradients(linear_regression(dim), models, regression_data(inputs, targets))
    clusters_t = torch.from_numpy(labels)
    assert separation(gradients, clusters_t).value == pytest.approx(min(gaps), rel=1e-6)
    assert intra_cluster_ratio(gradients, clusters_t).value < 1e-20


def test_separation_and_frontier_match_a_loop_over_points_and_pairs():
    """Heterogeneous quadratics: g_i(x) = H_i (x - c_k) in numpy; Delta^2 = min over
    points and cross pairs of ||g_i - g_j||^2, and the frontier holds one line
    (||g_i - g_j||^2, ||g_i||^2) per ordered cross pair and point, in (m, i, j) order."""
    labels, optima, inputs, targets, hessians = clustered_quadratics(3, 3, 2, 4, 7)
    rng = np.random.default_rng(4)
    models = rng.normal(size=(3, 4)) * 4
    offsets, slopes, best = [], [], (math.inf, None)
    for m, x in enumerate(models):
        grads = [hessians[i] @ (x - optima[k]) for i, k in enumerate(labels)]
        for i, j in itertools.product(range(labels.size), repeat=2):
            if labels[i] != labels[j]:
                gap = float(np.sum((grads[i] - grads[j]) ** 2))
                offsets.append(gap)
                slopes.append(float(np.sum(grads[i] ** 2)))
                if gap < best[0]:
                    best = (gap, (m, i, j))
    gradients = full_gradients(linear_regression(4), torch.from_numpy(models), regression_data(inputs, targets))
    clusters = torch.from_numpy(labels)
    estimate = separation(gradients, clusters)
    assert estimate.value == pytest.approx(best[0], rel=1e-9)
    assert (estimate.where["model"], estimate.where["client"], estimate.where["other"]) == best[1]
    frontier = separation_frontier(gradients, clusters)
    assert frontier.offsets.dtype == F64 and frontier.slopes.dtype == F64
    np.testing.assert_allclose(frontier.offsets.numpy(), offsets, rtol=1e-9)
    np.testing.assert_allclose(frontier.slopes.numpy(), slopes, rtol=1e-9)


def test_own_model_constants_match_a_loop_over_clients():
    """Fig. 2's per-client curves: at client i's own model x_i, the ratio of eq. (31)
    with the cluster mean over included clients, and min_{j not~ i} ||g_i - g_j||^2 of
    eq. (32) over included j; nan for the excluded client (whose gradients are NaN)."""
    labels, optima, inputs, targets, hessians = clustered_quadratics(14, 2, 3, 3, 5)
    models = np.random.default_rng(15).normal(size=(labels.size, 3)) * 4
    include = np.ones(labels.size, dtype=bool)
    include[4] = False
    ratios, gaps = np.full(labels.size, np.nan), np.full(labels.size, np.nan)
    for i in np.flatnonzero(include):
        grads = np.array([hessians[j] @ (models[i] - optima[labels[j]]) for j in range(labels.size)])
        mean = grads[include & (labels == labels[i])].mean(0)
        ratios[i] = np.sum((grads[i] - mean) ** 2) / np.sum(mean**2)
        gaps[i] = min(np.sum((grads[i] - grads[j]) ** 2) for j in np.flatnonzero(include & (labels != labels[i])))
    gradients = full_gradients(linear_regression(3), torch.from_numpy(models), regression_data(inputs, targets))
    gradients[:, 4] = math.nan
    clusters, mask = torch.from_numpy(labels), torch.from_numpy(include)
    np.testing.assert_allclose(own_model_ratios(gradients, clusters, mask).numpy(), ratios, rtol=1e-9)
    np.testing.assert_allclose(own_model_separations(gradients, clusters, mask).numpy(), gaps, rtol=1e-9)
    with pytest.raises(ValueError, match=r"gradients must be \[N, N, d\]"):
        own_model_ratios(gradients[:3], clusters)


def test_full_gradients_in_chunks_equal_the_explicit_least_squares_gradient():
    """grad f_j(x_m) = A_j^T (A_j x_m - y_j) / n, whatever the chunk of models."""
    labels, _, inputs, targets, _ = clustered_quadratics(5, 2, 2, 3, 4)
    models = np.random.default_rng(6).normal(size=(5, 3))
    expected = np.einsum("jsd,mjs->mjd", inputs, np.einsum("jsd,md->mjs", inputs, models) - targets[None]) / 4
    data = regression_data(inputs, targets)
    for chunk in (None, 1, 2, 5):
        got = full_gradients(linear_regression(3), torch.from_numpy(models), data, chunk_models=chunk)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)


# -- curvature --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["power", "dense"])
def test_smoothness_and_strong_convexity_are_the_extreme_hessian_eigenvalues(method):
    """Least squares: H_i = A_i^T A_i / n; L = max_i lambda_max(H_i), mu = min_i
    lambda_min(H_i) (numpy eigvalsh)."""
    labels, _, inputs, targets, hessians = clustered_quadratics(7, 2, 3, 4, 12)
    spectra = np.linalg.eigvalsh(hessians)
    params = torch.from_numpy(np.random.default_rng(8).normal(size=(labels.size, 4)))
    data = regression_data(inputs, targets)
    objective = linear_regression(4)
    big = smoothness(objective, params, data, method=method)
    small = strong_convexity(objective, params, data, method=method)
    assert big.value == pytest.approx(spectra[:, -1].max(), rel=1e-6)
    assert big.where["client"] == int(spectra[:, -1].argmax())
    assert big.details["per_client"] == pytest.approx(list(spectra[:, -1]), rel=1e-6)
    assert small.value == pytest.approx(spectra[:, 0].min(), rel=1e-6)
    assert small.where["client"] == int(spectra[:, 0].argmin())
    assert small.details["per_client"] == pytest.approx(list(spectra[:, 0]), rel=1e-6)
    assert small.details["convex"] and big.details["converged"] and small.details["converged"]


def small_network_problem(seed: int = 0):
    objective = DenseNetwork(3, 2, hidden=(4,), loss="cross_entropy")
    generator = torch.Generator().manual_seed(seed)
    params = objective.init(3, generator, F64) * 3
    inputs = torch.randn(3, 6, 3, generator=generator, dtype=F64)
    targets = torch.randint(0, 2, (3, 6), generator=generator)
    return objective, params, ClientData(inputs, targets)


def test_curvature_of_a_network_matches_a_per_client_autograd_hessian():
    """An indefinite Hessian (ReLU network): L = max |eigenvalue| and mu = the smallest
    eigenvalue, checked against torch.autograd.functional.hessian client by client;
    the power method agrees with the dense one."""
    objective, params, data = small_network_problem()
    spectra = []
    for i in range(params.shape[0]):
        matrix = torch.autograd.functional.hessian(
            lambda p: objective.loss(p, data.inputs[i], data.targets[i]), params[i])
        spectra.append(torch.linalg.eigvalsh(matrix).numpy())
    spectra = np.array(spectra)
    largest = np.abs(spectra).max(1)
    for method, rel in (("dense", 1e-10), ("power", 1e-6)):
        big = smoothness(objective, params, data, method=method, iterations=5000)
        small = strong_convexity(objective, params, data, method=method, iterations=5000)
        assert big.details["per_client"] == pytest.approx(list(largest), rel=rel)
        assert small.details["per_client"] == pytest.approx(list(spectra[:, 0]), rel=rel, abs=1e-9 * largest.max())
    assert spectra[:, 0].min() < 0 and not strong_convexity(objective, params, data, method="dense").details["convex"]


# -- noise ------------------------------------------------------------------------------


def test_gradient_noise_of_least_squares_is_the_explicit_per_sample_formula():
    """Per-sample gradient a_s r_s, r_s = a_s^T x - y_s; sigma_i^2 =
    (1/n) sum ||a_s r_s||^2 - ||(1/n) sum a_s r_s||^2 (label noise makes it positive
    at the optimum too); invariant to the chunk of samples."""
    rng = np.random.default_rng(9)
    inputs = rng.normal(size=(4, 7, 3))
    targets = rng.normal(size=(4, 7))
    params = rng.normal(size=(4, 3))
    residuals = np.einsum("isd,id->is", inputs, params) - targets
    per_sample = inputs * residuals[..., None]
    expected = (per_sample**2).sum(-1).mean(1) - (per_sample.mean(1) ** 2).sum(-1)
    data = regression_data(inputs, targets)
    for chunk in (None, 1, 3, 7):
        estimate = gradient_noise(linear_regression(3), torch.from_numpy(params), data, chunk=chunk)
        assert estimate.value == pytest.approx(expected.max(), rel=1e-9)
        assert estimate.details["per_client"] == pytest.approx(list(expected), rel=1e-9)
        assert estimate.where == {"client": int(expected.argmax())}


def test_gradient_noise_of_a_network_matches_a_per_client_loop():
    objective, params, data = small_network_problem(1)
    expected = []
    for i in range(params.shape[0]):
        grads = []
        for s in range(data.inputs.shape[1]):
            point = params[i].clone().requires_grad_(True)
            loss = objective.loss(point, data.inputs[i, s : s + 1], data.targets[i, s : s + 1])
            grads.append(torch.autograd.grad(loss, point)[0])
        grads = torch.stack(grads)
        expected.append(float((grads - grads.mean(0)).square().sum(1).mean()))
    estimate = gradient_noise(objective, params, data, chunk=4)
    assert estimate.details["per_client"] == pytest.approx(expected, rel=1e-10)


@settings(deadline=None, max_examples=25)
@given(seed=st.integers(0, 10**6), samples=st.integers(2, 5), batch_size=st.integers(1, 3))
def test_lemma7_batch_noise_equals_an_exhaustive_enumeration_of_batches(seed, samples, batch_size):
    """Lemma 7 (eq. 124) as an equality: E||grad f_B(x) - grad f(x)||^2 over every
    batch B (ordered tuples with replacement; subsets without), with the batch gradient
    from the objective itself and sigma^2 from gradient_noise."""
    rng = np.random.default_rng(seed)
    dim = 2
    inputs = rng.normal(size=(1, samples, dim))
    targets = rng.normal(size=(1, samples))
    params = torch.from_numpy(rng.normal(size=(1, dim)))
    objective = linear_regression(dim)
    data = regression_data(inputs, targets)
    sigma2 = gradient_noise(objective, params, data).value
    full = objective.paired_gradients(params, data)[0]
    with_replacement = list(itertools.product(range(samples), repeat=batch_size))
    without = list(itertools.combinations(range(samples), batch_size)) if batch_size <= samples else []
    for batches, size in ((with_replacement, None), (without, samples)):
        if not batches:
            continue
        index = torch.tensor(batches)
        batch = ClientData(data.inputs[0][index], data.targets[0][index])
        grads = objective.paired_gradients(params.expand(len(batches), dim), batch)
        variance = float((grads - full).square().sum(1).mean())
        assert batch_noise(sigma2, batch_size, size) == pytest.approx(variance, rel=1e-10, abs=1e-12)


@settings(deadline=None, max_examples=50)
@given(alpha=st.floats(0.01, 1.0), sigma2=st.floats(0.0, 100.0), rounds=st.integers(0, 60))
def test_momentum_noise_follows_the_recursion_and_lemma14(alpha, sigma2, rounds):
    """Var m_t = alpha^2 sigma^2 + (1 - alpha)^2 Var m_{t-1}, Var m_0 = 0; every value
    and the stationary one are <= alpha sigma^2 (Lemma 14, eq. 228)."""
    variance = 0.0
    for _ in range(rounds):
        variance = alpha**2 * sigma2 + (1 - alpha) ** 2 * variance
    assert momentum_noise(alpha, sigma2, rounds) == pytest.approx(variance, rel=1e-10, abs=1e-300)
    stationary = momentum_noise(alpha, sigma2)
    assert momentum_noise(alpha, sigma2, rounds) <= stationary * (1 + 1e-12)
    assert stationary <= alpha * sigma2 * (1 + 1e-12)
    assert stationary == pytest.approx(alpha * sigma2 / (2 - alpha), rel=1e-12)


# -- hypothesis properties of A^2 and the frontier ---------------------------------------


def random_gradients(seed: int, models: int, clients: int, dim: int, clusters: int, zero_rows: bool = False):
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.arange(clusters), rng.integers(0, clusters, clients - clusters)])
    gradients = rng.normal(size=(models, clients, dim)) + 3 * rng.normal(size=(1, clusters, dim))[:, labels]
    if zero_rows:
        gradients[:, rng.integers(0, clients)] = 0.0
    return torch.from_numpy(gradients), torch.from_numpy(labels)


sizes = dict(seed=st.integers(0, 10**6), models=st.integers(1, 3), clients=st.integers(2, 6),
             dim=st.integers(1, 3), zero_rows=st.booleans())


@settings(deadline=None, max_examples=40)
@given(**sizes, scale=st.floats(1e-3, 1e3))
def test_intra_cluster_ratio_is_nonnegative_and_scale_invariant(seed, models, clients, dim, zero_rows, scale):
    gradients, labels = random_gradients(seed, models, clients, dim, 2, zero_rows)
    plain = intra_cluster_ratio(gradients, labels)
    scaled = intra_cluster_ratio(gradients * scale, labels)
    assert plain.value >= 0
    assert scaled.value == pytest.approx(plain.value, rel=1e-9)
    assert all(value >= 0 for value in plain.details["per_client"])


@settings(deadline=None, max_examples=40)
@given(**sizes, clusters=st.integers(2, 3))
def test_separation_equals_the_frontier_at_d_zero(seed, models, clients, dim, zero_rows, clusters):
    clusters = min(clusters, clients)
    gradients, labels = random_gradients(seed, models, clients, dim, clusters, zero_rows)
    frontier = separation_frontier(gradients, labels)
    value = separation(gradients, labels).value
    assert float(frontier.max_separation(0.0)) == value
    assert frontier.envelope()[0] == (0.0, value)


def check_frontier(frontier: SeparationFrontier) -> None:
    """The frontier is nondecreasing and concave; its envelope points lie on it, are
    feasible, and slightly above them is not; between breakpoints it is linear, and past
    the last one it rises with the smallest slope."""
    points = frontier.envelope()
    positions = [d for d, _ in points]
    assert positions[0] == 0.0 and all(a < b for a, b in zip(positions, positions[1:]))
    heights = [v for _, v in points]
    for k in range(1, len(points) - 1):  # a breakpoint is a corner: strictly above its neighbours' chord
        weight = (positions[k] - positions[k - 1]) / (positions[k + 1] - positions[k - 1])
        chord = (1 - weight) * heights[k - 1] + weight * heights[k + 1]
        assert heights[k] > chord + 1e-12 * max(1.0, abs(chord))
    for d_squared, delta_squared in points:
        assert frontier.feasible(delta_squared, d_squared)
        assert not frontier.feasible(delta_squared + 1e-9 * max(1.0, abs(delta_squared)), d_squared)
    last = positions[-1]
    grid = torch.linspace(0, 2 * last + 1, 101, dtype=F64)
    values = frontier.max_separation(grid)
    assert bool((values[1:] >= values[:-1]).all())
    middle = frontier.max_separation((grid[1:] + grid[:-1]) / 2)
    chord = (values[1:] + values[:-1]) / 2
    assert bool((middle >= chord - 1e-9 * values.abs().max().clamp_min(1)).all())
    envelope = np.interp(grid.numpy(), positions + [last + 1], [v for _, v in points] + [
        points[-1][1] + float(frontier.slopes.min())])
    beyond = grid.numpy() > last
    envelope[beyond] = points[-1][1] + float(frontier.slopes.min()) * (grid.numpy()[beyond] - last)
    np.testing.assert_allclose(values.numpy(), envelope, rtol=1e-8, atol=1e-8)


@settings(deadline=None, max_examples=40)
@given(**sizes)
def test_frontier_of_gradients_is_a_concave_nondecreasing_envelope(seed, models, clients, dim, zero_rows):
    gradients, labels = random_gradients(seed, models, clients, dim, 2, zero_rows)
    check_frontier(separation_frontier(gradients, labels))


@settings(deadline=None, max_examples=60)
@given(lines=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4)), min_size=1, max_size=12))
def test_frontier_envelope_on_integer_lines_with_ties(lines):
    """Small integer offsets and slopes: many lines tie and cross at one point."""
    offsets, slopes = (torch.tensor(column, dtype=F64) for column in zip(*lines))
    check_frontier(SeparationFrontier(offsets, slopes))


def test_frontier_envelope_hand_computed():
    """Lines 1 + 4s, 2 + s, 5 + 0s: min is 1 + 4s up to s = 1/3 (value 7/3), then 2 + s
    up to s = 3 (value 5), then 5."""
    frontier = SeparationFrontier(torch.tensor([1.0, 2.0, 5.0, 6.0], dtype=F64),
                                  torch.tensor([4.0, 1.0, 0.0, 3.0], dtype=F64))
    got = frontier.envelope()
    assert [d for d, _ in got] == pytest.approx([0.0, 1 / 3, 3.0])
    assert [v for _, v in got] == pytest.approx([1.0, 7 / 3, 5.0])
    assert frontier.feasible(5.0, 10.0) and not frontier.feasible(5.0 + 1e-9, 10.0)


# -- point clouds and fractions: hand-computed -------------------------------------------


def test_cloud_constants_hand_computed():
    """1-D clusters {0, 2} and {10, 11, 12}: means 1 and 11, unbiased variances 2 and 1;
    Delta^2 = 100, debiased 100 - 2/2 - 1/3."""
    points = torch.tensor([[0.0], [10.0], [2.0], [11.0], [12.0]], dtype=F64)
    labels = torch.tensor([5, 7, 5, 7, 7])
    noise = cloud_noise(points, labels)
    assert noise.value == pytest.approx(2.0) and noise.where == {"cluster": 5}
    assert noise.details["per_cluster"] == pytest.approx([2.0, 1.0])
    plain = cloud_separation(points, labels)
    assert plain.value == pytest.approx(100.0) and plain.where == {"cluster": 5, "other": 7}
    assert cloud_separation(points, labels, debias=True).value == pytest.approx(100.0 - 1.0 - 1.0 / 3.0)


def test_momentum_constants_over_rounds_are_the_extremes_of_the_per_round_estimates():
    rng = np.random.default_rng(10)
    momenta = torch.from_numpy(rng.normal(size=(4, 7, 3)) + np.arange(7)[None, :, None] % 3)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    result = momentum_constants(momenta, labels)
    per_round_gap = [cloud_separation(momenta[t], labels).value for t in range(4)]
    per_round_noise = [cloud_noise(momenta[t], labels).value for t in range(4)]
    assert result["Delta2"].value == pytest.approx(min(per_round_gap), rel=1e-12)
    assert result["Delta2"].where["round"] == int(np.argmin(per_round_gap))
    assert result["sigma2"].value == pytest.approx(max(per_round_noise), rel=1e-12)
    assert result["sigma2"].details["per_round"] == pytest.approx(per_round_noise, rel=1e-12)
    single = momentum_constants(momenta[2], labels)
    assert single["Delta2"].value == per_round_gap[2] and single["sigma2"].value == per_round_noise[2]


def test_federation_fractions_hand_computed():
    """Clusters 0,0,0,1,1,2,0 with Byzantine clients 2, 4, 5, 6 (N = 7): honest per
    cluster 2, 1, 0; Byzantine per cluster 2, 1, 1."""
    clusters = torch.tensor([0, 0, 0, 1, 1, 2, 0])
    byzantine = torch.tensor([False, False, True, False, True, True, True])
    got = federation_fractions(clusters, byzantine)
    assert got["n"].tolist() == [2, 2, 2, 1, 1, 0, 2]
    assert got["delta"].tolist() == pytest.approx([2 / 7, 2 / 7, 2 / 7, 1 / 7, 1 / 7, 0, 2 / 7])
    assert got["beta"].tolist() == pytest.approx([4 / 7] * 7)
    assert got["byzantine_in_cluster"].tolist() == pytest.approx([2 / 7, 2 / 7, 2 / 7, 1 / 7, 1 / 7, 1 / 7, 2 / 7])


# -- excluded non-finite rows -------------------------------------------------------------


@pytest.mark.parametrize("poison", [math.nan, 1e38])
def test_excluded_nonfinite_rows_change_nothing(poison):
    """Rows of excluded clients set to NaN or 1e38 (gradients, models, data, points):
    every estimate is finite and equals the one on the included clients alone."""
    labels, _, inputs, targets, _ = clustered_quadratics(11, 2, 4, 3, 6)
    kept = np.array([0, 2, 3, 4, 6, 7])
    include = torch.zeros(labels.size, dtype=torch.bool)
    include[kept] = True
    clusters = torch.from_numpy(labels)
    models = torch.from_numpy(np.random.default_rng(12).normal(size=(3, 3)))
    gradients = full_gradients(linear_regression(3), models, regression_data(inputs, targets))
    params = torch.from_numpy(np.random.default_rng(13).normal(size=(labels.size, 3)))
    poisoned_gradients, poisoned_params = gradients.clone(), params.clone()
    poisoned_gradients[:, ~include] = poison
    poisoned_params[~include] = poison
    poisoned_inputs = inputs.copy()
    poisoned_inputs[~include.numpy()] = poison
    poisoned_data = regression_data(poisoned_inputs, targets)
    clean_data = regression_data(inputs[kept], targets[kept])
    objective = linear_regression(3)
    pairs = [
        (intra_cluster_ratio(poisoned_gradients, clusters, include),
         intra_cluster_ratio(gradients[:, kept], clusters[kept])),
        (separation(poisoned_gradients, clusters, include), separation(gradients[:, kept], clusters[kept])),
        (gradient_noise(objective, poisoned_params, poisoned_data, include),
         gradient_noise(objective, params[kept], clean_data)),
        (smoothness(objective, poisoned_params, poisoned_data, include),
         smoothness(objective, params[kept], clean_data)),
        (strong_convexity(objective, poisoned_params, poisoned_data, include, method="dense"),
         strong_convexity(objective, params[kept], clean_data, method="dense")),
        (cloud_noise(poisoned_params, clusters, include), cloud_noise(params[kept], clusters[kept])),
        (cloud_separation(poisoned_params, clusters, include, debias=True),
         cloud_separation(params[kept], clusters[kept], debias=True)),
    ]
    for poisoned, clean in pairs:
        assert math.isfinite(poisoned.value), poisoned.name
        assert poisoned.value == pytest.approx(clean.value, rel=1e-12), poisoned.name
        if "client" in clean.where:  # client indices map back through kept; cluster labels stay
            for key in ("client", "other"):
                if key in clean.where:
                    assert poisoned.where[key] == int(kept[clean.where[key]]), poisoned.name
        else:
            assert poisoned.where == clean.where, poisoned.name
        if "per_client" in poisoned.details:
            per_client = np.array(poisoned.details["per_client"])
            assert np.isnan(per_client[~include.numpy()]).all()
            np.testing.assert_allclose(per_client[kept], clean.details["per_client"], rtol=1e-12)
    poisoned_frontier = separation_frontier(poisoned_gradients, clusters, include)
    clean_frontier = separation_frontier(gradients[:, kept], clusters[kept])
    assert torch.equal(poisoned_frontier.offsets, clean_frontier.offsets)
    assert torch.equal(poisoned_frontier.slopes, clean_frontier.slopes)


# -- error messages -----------------------------------------------------------------------


def test_bad_input_raises_errors_naming_the_argument():
    gradients = torch.zeros(2, 4, 3, dtype=F64)
    clusters = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="gradients must be a floating tensor"):
        intra_cluster_ratio(gradients[0], clusters)
    with pytest.raises(ValueError, match=r"include must be a boolean mask of shape \[4\]"):
        intra_cluster_ratio(gradients, clusters, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="include selects no client"):
        separation(gradients, clusters, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="clusters must be an integer tensor"):
        intra_cluster_ratio(gradients, clusters.double())
    with pytest.raises(ValueError, match="at least two clusters"):
        separation(gradients, clusters, torch.tensor([True, True, False, False]))
    with pytest.raises(ValueError, match="at least two clusters"):
        separation_frontier(gradients, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="d_squared must be >= 0"):
        separation_frontier(gradients, clusters).max_separation(-1.0)
    with pytest.raises(ValueError, match="chunk_models must be >= 1"):
        full_gradients(linear_regression(3), torch.zeros(2, 3, dtype=F64),
                       ClientData(torch.zeros(4, 2, 3, dtype=F64), torch.zeros(4, 2, dtype=F64)), chunk_models=0)
    wide = linear_regression(4097)
    data = ClientData(torch.zeros(1, 1, 4097, dtype=F64), torch.zeros(1, 1, dtype=F64))
    with pytest.raises(ValueError, match="d = 4097 exceeds 4096"):
        smoothness(wide, torch.zeros(1, 4097, dtype=F64), data, method="dense")
    with pytest.raises(ValueError, match="data must hold the 2 clients"):
        gradient_noise(wide, torch.zeros(2, 4097, dtype=F64), data)
    with pytest.raises(ValueError, match="samples must be >= batch_size"):
        batch_noise(1.0, 4, samples=3)
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\]"):
        momentum_noise(0.0, 1.0)
    points = torch.zeros(3, 2, dtype=F64)
    with pytest.raises(ValueError, match="no cluster has two included points"):
        cloud_noise(points, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="debias needs at least two included points"):
        cloud_separation(points, torch.tensor([0, 0, 1]), debias=True)
    with pytest.raises(ValueError, match=r"momenta must be a floating tensor \[N, d\] or \[T, N, d\]"):
        momentum_constants(torch.zeros(3, dtype=F64), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="byzantine must be a 1-D boolean mask"):
        federation_fractions(torch.tensor([0, 1]), torch.tensor([0, 1]))


def test_a_nan_gradient_makes_the_ratio_nan_not_zero():
    """A NaN gradient of an included client is no evidence that Assumption 4 holds:
    eq. (31) is NaN there, and so is the maximum (a diverged model shows up)."""
    gradients = torch.ones(1, 4, 3, dtype=torch.float64)
    gradients[0, 1] = torch.tensor([1.0, 2.0, 3.0])
    clusters = torch.tensor([0, 0, 1, 1])
    assert math.isfinite(intra_cluster_ratio(gradients, clusters).value)
    gradients[0, 3] = math.nan
    assert math.isnan(intra_cluster_ratio(gradients, clusters).value)


@pytest.mark.parametrize("first_nan", [True, False])
def test_combined_estimate_is_nan_when_a_part_is(first_nan):
    from theory_checks.types import Estimate

    nan, number = Estimate("A2", math.nan, "max", 2), Estimate("A2", 3.0, "max", 5)
    parts = (nan, number) if first_nan else (number, nan)
    combined = parts[0].combined(parts[1])
    assert math.isnan(combined.value) and combined.samples == 7
