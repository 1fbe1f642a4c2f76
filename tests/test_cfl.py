"""Clustered Federated Learning (Sattler et al. 2021, Alg. 1 and 2; ``defenses.cfl``).

The centre piece is the exact failure example of Werner et al. (2023, Sec. 2.1,
Fig. 1c), worked by hand in :func:`test_cfl_mis_splits_the_example_with_probability_one_half`;
then the optimal bipartition, learning on a clustered task, and attacks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attacks
from defenses import build
from defenses.cfl import ClusteredFL, bipartition, cosine_similarities
from robust_pfl import ClientData, Federation, Objective
from robust_pfl.engine.metrics import adjusted_rand_index
from robust_pfl.engine.objectives import linear_regression
from robust_pfl.engine.tasks import SyntheticLinearRegression

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64

# -- Werner et al. Sec. 2.1: the Clustered-FL example -----------------------------------------

LR = 0.1
SPLIT_ROUND = 10
# eps1 = 1/2 > |mean gradient| and eps2 = 0.2 < 1/4 <= max |g_i| at every x in (0, 1/2):
# the split fires at round SPLIT_ROUND exactly, whatever the samples (test docstring)
EXAMPLE_CFL = {"lr": LR, "eps1": 0.5, "eps2": 0.2, "split_after": SPLIT_ROUND}
SEEDS = 200


def example_federation(seed: int, batch_size: int | None = 1) -> Federation:
    """Client i's loss is 0.5 (x - y)^2 on its samples y (least squares with input 1), so
    its gradient on a sample y is x - y.  Client 1 holds {0, 0}, client 2 {1/2, 1/2},
    client 3 {0, 1}; with one sample per round, g1 = x, g2 = x - 1/2 and g3 = x or
    x - 1 with probability 1/2 each (the federation's seeded batch stream draws it)."""
    inputs = torch.ones(3, 2, 1, dtype=F64)
    targets = torch.tensor([[0.0, 0.0], [0.5, 0.5], [0.0, 1.0]], dtype=F64)
    return Federation(
        linear_regression(1), ClientData(inputs, targets), torch.tensor([0, 1, 1]),
        torch.zeros(3, dtype=torch.bool), seed, batch_size,
    )


def example_cfl(seed: int, **options) -> tuple[Federation, ClusteredFL]:
    fed = example_federation(seed)
    algo = build("cfl", fed, {**EXAMPLE_CFL, **options})
    algo.models.zero_()  # x0 = 0, in [0, 1/2]
    return fed, algo


def run_to_split(seed: int) -> tuple[ClusteredFL, torch.Tensor, torch.Tensor]:
    """CFL on the example through the split round: (algorithm, client 3's gradient and
    the model at the split round)."""
    _, algo = example_cfl(seed)
    for t in range(SPLIT_ROUND):
        record = algo.step(t)
        assert record.extras["splits"] == [] and algo.assignment.tolist() == [0, 0, 0]
    x = algo.models[0, 0].clone()
    record = algo.step(SPLIT_ROUND)
    assert record.extras["splits"] == [(0, 1)], f"seed {seed}: no split at round {SPLIT_ROUND}"
    return algo, record.gradients[:, 0], x


def parts(assignment: torch.Tensor) -> set[frozenset[int]]:
    """The partition of clients 1..3 (1-based, as in the paper)."""
    groups: dict[int, set[int]] = {}
    for client, cluster in enumerate(assignment.tolist(), start=1):
        groups.setdefault(cluster, set()).add(client)
    return {frozenset(group) for group in groups.values()}


RIGHT = {frozenset({1}), frozenset({2, 3})}
WRONG = {frozenset({1, 3}), frozenset({2})}


def test_example_gradients_true_clusters_and_fedavg_optimum():
    """g1 = x, g2 = x - 1/2, g3 in {x, x - 1}.  Client 3's expected gradient is
    x - 1/2 = g2, so the true clusters are {1} (optimum 0) and {2, 3} (optimum 1/2).
    The FedAvg optimum solves (g1 + g2 + E g3)/3 = x - 1/3 = 0: x* = 1/3.  (The paper
    writes 1/4, the optimum of clients 1 and 2 alone; at 1/3 as at 1/4 the signs of
    the gradients are the same, which is all the argument uses.)  FedAvg on full
    batches (client 3's gradient is then exactly x - 1/2) converges to 1/3."""
    fed = example_federation(0)
    x = torch.full((3, 1), 0.3, dtype=F64)
    seen = {round(float(fed.gradients(x, fed.sample_batch())[2, 0]), 12) for _ in range(40)}
    assert seen == {0.3, -0.7}
    assert fed.gradients(x, fed.sample_batch())[:2, 0].tolist() == pytest.approx([0.3, -0.2], abs=1e-15)
    full = example_federation(0, batch_size=None)
    assert full.gradients(x, full.sample_batch())[:, 0].tolist() == pytest.approx([0.3, -0.2, -0.2], abs=1e-15)
    fedavg = build("global", full, {"lr": LR})
    fedavg.model.zero_()
    for t in range(400):
        fedavg.step(t)
    assert fedavg.client_models()[:, 0].tolist() == pytest.approx([1 / 3] * 3, abs=1e-12)


def test_cfl_mis_splits_the_example_with_probability_one_half():
    """Werner et al. Sec. 2.1, Fig. 1c, by hand.

    FedAvg on the three clients (gradient mode, lr eta = 0.1, x0 = 0):
    x_{t+1} = (1 - eta) x_t + eta (1/2 + c_t)/3 with client 3's sample c_t in {0, 1}.
    Since (1 - eta) x + eta/6 > 0 and (1 - eta) x + eta/2 < 1/2 for x in [0, 1/2],
    every iterate from round 1 on lies in (0, 1/2): g1 = x > 0, g2 = x - 1/2 < 0, and
    g3 = x > 0 if c = 0, x - 1 < 0 if c = 1.

    Branching criterion at the split round: |mean g| = |x - (1/2 + c)/3| < 1/2 = eps1
    and max |g_i| >= max(x, 1/2 - x) >= 1/4 > 0.2 = eps2, so CFL splits at round
    ``split_after`` always.  In one dimension the cosine similarity of two gradients is
    the product of their signs, so the optimal bipartition (min over cuts of the max
    cross similarity, -1 here) groups equal signs:

    * c = 0, signs (+, -, +): {1, 3} | {2}, wrong (2 and 3 share the optimum 1/2);
    * c = 1, signs (+, -, -): {1} | {2, 3}, right.

    So CFL mis-splits exactly when client 3 draws the sample 0 at the split round:
    probability 1/2.  The wrong split is {1, 3} | {2}, not the paper's {1, 2} | {3}:
    g1 and g2 have opposite signs on all of (0, 1/2), similarity -1, and no optimal
    cut puts them together.  Checked per seed (mis-split <=> g3 > 0 at the split round)
    and over 200 seeds: each seed's split is one fair coin of the seed's batch stream,
    so the count of mis-splits is Binomial(200, 1/2), mean 100, sd sqrt(50) = 7.07;
    [72, 128] is +-4 sd, which a fair coin leaves with probability 6e-5."""
    wrong = 0
    for seed in range(SEEDS):
        algo, g, x = run_to_split(seed)
        assert 0 < float(x) < 0.5
        assert float(g[0]) > 0 > float(g[1]) and float(g[2]) in (pytest.approx(float(x)), pytest.approx(float(x) - 1))
        split = parts(algo.assignment)
        if float(g[2]) > 0:
            assert split == WRONG, f"seed {seed}"
            wrong += 1
        else:
            assert split == RIGHT, f"seed {seed}"
    assert 72 <= wrong <= 128, wrong


def seeds_by_split(count: int) -> tuple[list[int], list[int]]:
    """The first ``count`` seeds that mis-split and the first ``count`` that split right."""
    wrong, right = [], []
    for seed in range(SEEDS):
        algo, _, _ = run_to_split(seed)
        (wrong if parts(algo.assignment) == WRONG else right).append(seed)
        if len(wrong) >= count and len(right) >= count:
            return wrong[:count], right[:count]
    raise AssertionError("too few seeds of each kind")


ROUNDS = 2000
BURN_IN = 100


def test_cfl_never_recovers_from_the_mis_split():
    """After {1, 3} | {2}: cluster {2} runs x <- x - eta (x - 1/2) and reaches 1/2;
    cluster {1, 3} runs x <- x - eta (x - c/2), whose fixed point in expectation is
    1/4, the optimum of (f1 + f3)/2: client 1's model stays 1/4 from its optimum 0 and
    client 3's 1/4 from its optimum 1/2, forever.  {1, 3} has 2 < min_split_size = 3
    members, so it is never split again, and CFL never merges clusters: the assignment
    is fixed from the split round on.  After the right split the same dynamics reach
    0 for {1} and 1/2 (in expectation) for {2, 3}.

    Tolerance of the time averages: around its fixed point the {1, 3} model is an AR(1)
    process x' - 1/4 = 0.9 (x - 1/4) + e with e = +-0.025, stationary sd
    0.025 / sqrt(1 - 0.81) = 0.057; the mean of 2000 rounds has sd about
    0.057 sqrt(1.9 / (0.1 * 2000)) = 0.0056, and 0.03 is over 5 sd ({2, 3}: the same)."""
    wrong_seeds, right_seeds = seeds_by_split(2)
    for seed in wrong_seeds + right_seeds:
        _, algo = example_cfl(seed)
        trace = []
        for t in range(ROUNDS + BURN_IN):
            algo.step(t)
            if t > SPLIT_ROUND:
                assert algo.models.shape[0] == 2 and parts(algo.assignment) in (WRONG, RIGHT)
                assert torch.equal(algo.assignment, first_assignment)
            elif t == SPLIT_ROUND:
                first_assignment = algo.assignment.clone()
            trace.append(algo.client_models()[:, 0].clone())
        average = torch.stack(trace[BURN_IN:]).mean(0).tolist()
        final = algo.client_models()[:, 0].tolist()
        if seed in wrong_seeds:
            assert final[1] == pytest.approx(0.5, abs=1e-12)  # {2}: deterministic
            assert final[0] == final[2]  # {1, 3} share one model
            assert average[0] == pytest.approx(0.25, abs=0.03)  # client 1: optimum 0
            assert average[2] == pytest.approx(0.25, abs=0.03)  # client 3: optimum 1/2
        else:
            assert final[0] == pytest.approx(0.0, abs=1e-12)
            assert average[1] == pytest.approx(0.5, abs=0.03) and final[1] == final[2]


def test_without_the_size_limit_cfl_still_never_reunites_clients_2_and_3():
    """With min_split_size = 2 the cluster {1, 3} is split too (any cut of two clients
    is into singletons), so every client ends alone, i.e. Local: no more bias, but
    clients 2 and 3, which share an optimum, never share a cluster again (CFL has no
    merge step)."""
    wrong_seeds, _ = seeds_by_split(3)
    for seed in wrong_seeds:
        _, algo = example_cfl(seed, min_split_size=2)
        for t in range(300):
            algo.step(t)
            if t >= SPLIT_ROUND:
                assert algo.assignment[1] != algo.assignment[2]
        assert parts(algo.assignment) == {frozenset({1}), frozenset({2}), frozenset({3})}


FC_PAPER = {"lr": LR, "radius": {"policy": "quantile", "q": 0.2}, "clustering_rounds": 10}


def example_fc(seed: int):
    fed = example_federation(seed)
    algo = build("fc", fed, FC_PAPER)
    algo.models.zero_()
    return algo


def test_fc_never_mixes_clients_with_different_optima_on_the_example():
    """Federated-Clustering (Alg. 2) with the paper's settings (20% quantile radius,
    10 clustering rounds, no momentum) re-clusters at every round (Werner et al.
    Sec. 2.1: it "can recover from past clustering errors").  By hand: receiver i
    clusters {g_j(x_i)}_j from its own gradient.  The distances are {0, 1/2, c} at
    client 1, {0, 1/2, 1/2} at client 2 (g1 - g2 = 1/2, g3 - g2 = 1/2 - c) and
    {0, c, 1/2} at client 3 (own x - c).  The interpolated 20% quantile of three
    distances {0, a, b} is 0.4 times the middle one, at most 0.2 < 1/2: the ball holds
    only rows equal to the receiver's own gradient, so the centre never moves
    (eq. 24) and the update is the client's own stochastic gradient, an unbiased
    estimate of its own gradient.  Checked in every round CFL needs to commit
    (rounds 0..10), for all 200 seeds, at the same models as CFL (x0 = 0)."""
    for seed in range(SEEDS):
        algo = example_fc(seed)
        for t in range(SPLIT_ROUND + 1):
            record = algo.step(t)
            torch.testing.assert_close(record.updates, record.gradients, rtol=0, atol=1e-15)


@pytest.mark.slow  # 2,000 rounds on every mis-split seed; the default run keeps the per-round check above
def test_fc_ends_with_each_client_at_its_own_optimum_on_the_example():
    """Consequently (Werner et al. Thm 3.3: each client reaches a stationary point of
    its own loss): client 1 x <- 0.9 x reaches 0, client 2 reaches 1/2, and client 3
    runs SGD on its own samples, an AR(1) around 1/2 with e = +-0.05 (sd
    0.05 / sqrt(0.19) = 0.115; the mean of 2000 rounds has sd about 0.011, tolerance
    0.05).  On the seeds where CFL mis-splits, CFL leaves clients 1 and 3 a quarter
    away (previous tests); FC does not."""
    wrong_seeds, _ = seeds_by_split(2)
    for seed in wrong_seeds:
        algo = example_fc(seed)
        trace = []
        for t in range(ROUNDS + BURN_IN):
            algo.step(t)
            trace.append(algo.client_models()[:, 0].clone())
        final = algo.client_models()[:, 0].tolist()
        assert final[0] == pytest.approx(0.0, abs=1e-12)
        assert final[1] == pytest.approx(0.5, abs=1e-12)
        assert torch.stack(trace[BURN_IN:]).mean(0)[2].item() == pytest.approx(0.5, abs=0.05)


# -- the bipartition ---------------------------------------------------------------------------


class Centres(Objective):
    """0.5 ||x - y||^2 averaged over a client's points y (inputs ``[n, d]``): gradient
    x - mean y.  Initial models at 0."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def loss(self, params, inputs, targets):
        return 0.5 * (params - inputs).pow(2).sum(-1).mean()

    def init(self, count, generator, dtype):
        return torch.zeros(count, self.dim, dtype=dtype)


HAND = [[1.0, 0.1], [1.0, -0.1], [-1.0, 0.2], [-1.0, -0.2]]


def hand_federation(byzantine: int = 0, attack=None) -> Federation:
    points = torch.tensor(HAND + [[0.0, 0.0]] * byzantine, dtype=F64).unsqueeze(1)
    n = points.shape[0]
    mask = torch.arange(n) >= len(HAND)
    return Federation(Centres(2), ClientData(points, torch.zeros(n, 1, dtype=F64)),
                      torch.tensor([0, 0, 1, 1] + [0] * byzantine), mask, 0, None, attack)


def brute_force_bipartition(similarity: np.ndarray) -> float:
    """min over all cuts of the max similarity across (Sattler et al. Alg. 1)."""
    m = similarity.shape[0]
    best = math.inf
    for mask in range(1, 2 ** (m - 1)):
        second = [i for i in range(1, m) if mask >> (i - 1) & 1]
        first = [i for i in range(m) if i not in second]
        best = min(best, float(similarity[np.ix_(first, second)].max()))
    return best


def test_cfl_splits_two_opposite_directions_by_hand():
    """Four clients with optima c = (1, .1), (1, -.1), (-1, .2), (-1, -.2), all at x = 0:
    gradients -c, mean exactly 0 (< eps1), norms about 1 (> eps2): CFL splits at round
    0.  Cosines across the cut {1, 2} | {3, 4}: -0.98/sqrt(1.01 * 1.04) = -0.9562 (1-3
    and 2-4) and -1.02/sqrt(1.01 * 1.04) = -0.9952; the largest, -0.9562, is the
    smallest possible (every other cut puts a pair of cosine +0.92 or +0.98 across).  Each
    part then moves by its own mean: models lr * (1, 0) and lr * (-1, 0)."""
    fed = hand_federation()
    algo = build("cfl", fed, {"lr": 0.5, "eps1": 0.1, "eps2": 0.5, "split_after": 0})
    record = algo.step(0)
    assert record.extras["splits"] == [(0, 1)]
    assert algo.assignment.tolist() == [0, 0, 1, 1]
    torch.testing.assert_close(algo.models, torch.tensor([[0.5, 0.0], [-0.5, 0.0]], dtype=F64), rtol=0, atol=1e-15)
    first, second, cross = bipartition(record.gradients)
    assert (first, second) == ([0, 1], [2, 3])
    assert cross == pytest.approx(-0.98 / math.sqrt(1.01 * 1.04), abs=1e-12)
    assert cross == pytest.approx(brute_force_bipartition(cosine_similarities(record.gradients)), abs=1e-12)
    # parts of two clients are never split again (min_split_size = 3)
    for t in range(1, 30):
        assert algo.step(t).extras["splits"] == []


def test_single_linkage_is_the_optimal_bipartition_and_complete_linkage_is_not():
    """Single linkage's last merge cuts the maximum-similarity spanning tree at its
    weakest edge, which minimises the largest cross similarity (checked against all
    cuts on random instances).  Complete linkage (the authors' notebook) can cut
    elsewhere: unit vectors at 0, 10, 25, 42 degrees.  Complete linkage merges
    0-10 (10 deg), then 25-42 (17 deg, against 25 deg from 25 to {0, 10}), and cuts
    {0, 10} | {25, 42} with cross similarity cos 15 deg; the optimal cut is
    {0, 10, 25} | {42}, cos 17 deg."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        m = int(torch.randint(2, 8, (1,), generator=generator))
        updates = torch.randn(m, 3, generator=generator, dtype=F64)
        first, second, cross = bipartition(updates, "single")
        assert sorted(first + second) == list(range(m)) and first and second and 0 in first
        assert cross == pytest.approx(brute_force_bipartition(cosine_similarities(updates)), abs=1e-12)
    angles = torch.deg2rad(torch.tensor([0.0, 10.0, 25.0, 42.0], dtype=F64))
    fan = torch.stack([angles.cos(), angles.sin()], dim=1)
    assert bipartition(fan, "single")[:2] == ([0, 1, 2], [3])
    assert bipartition(fan, "single")[2] == pytest.approx(math.cos(math.radians(17)), abs=1e-12)
    assert bipartition(fan, "complete")[:2] == ([0, 1], [2, 3])
    assert bipartition(fan, "complete")[2] == pytest.approx(math.cos(math.radians(15)), abs=1e-12)


def test_gamma_max_refuses_a_split_that_is_not_separated_enough():
    """Alg. 1's check: split only when sqrt((1 - alpha_cross_max) / 2) > gamma_max; on
    the hand case sqrt((1 + 0.9562) / 2) = 0.9890."""
    separation = math.sqrt((1 + 0.98 / math.sqrt(1.01 * 1.04)) / 2)
    for gamma, splits in ((separation - 1e-3, [(0, 1)]), (separation + 1e-3, [])):
        algo = build("cfl", hand_federation(), {"lr": 0.5, "eps1": 0.1, "eps2": 0.5, "split_after": 0,
                                                 "gamma_max": gamma})
        assert algo.step(0).extras["splits"] == splits


def test_nan_byzantine_row_does_not_crash_a_split_and_keeps_its_cluster_id():
    """A Byzantine client sending NaN, Inf or 1e300 (squared norm overflows float64) is
    left out of the mean, the norms and the similarities: the split is the hand case's,
    the Byzantine client keeps cluster 0 (the part of the lowest-index admissible
    client), and no model is touched.  A 1e100 row is admissible: the cluster's mean
    update is then huge, so there is no split, and the step stays finite."""
    for value in (math.nan, math.inf, 1e300, 1e100):
        fed = hand_federation(byzantine=1, attack=attacks.ConstantValue(value))
        algo = build("cfl", fed, {"lr": 0.5, "eps1": 0.1, "eps2": 0.5, "split_after": 0})
        record = algo.step(0)
        if value == 1e100:  # admissible (finite squared norm) but the mean norm is huge: no split
            assert record.extras["splits"] == [] and torch.isfinite(algo.models).all()
            continue
        assert record.extras["splits"] == [(0, 1)]
        assert algo.assignment.tolist() == [0, 0, 1, 1, 0]
        torch.testing.assert_close(algo.models, torch.tensor([[0.5, 0.0], [-0.5, 0.0]], dtype=F64), rtol=0, atol=1e-15)


def test_model_mode_with_one_plain_step_is_gradient_mode():
    """local_steps = 1 (clients send models x - lr g) gives the pseudo-gradients
    (x - (x - lr g)) / lr = g: the same splits and, to rounding, the same models as
    gradient mode."""
    runs = []
    for steps in (0, 1):
        task, fed = clustered_task(0)
        algo = build("cfl", fed, {**TASK_CFL, "local_steps": steps})
        runs.append([(algo.step(t).extras["splits"], algo.client_models().clone()) for t in range(120)])
    assert [s for s, _ in runs[0]] == [s for s, _ in runs[1]]
    assert any(s for s, _ in runs[0])
    torch.testing.assert_close(runs[0][-1][1], runs[1][-1][1], rtol=1e-9, atol=1e-9)


# -- learning on a clustered task ------------------------------------------------------------

TASK_CFL = {"lr": 0.02, "eps1": 0.5, "eps2": 1.0, "split_after": 20}


def clustered_task(seed: int, byzantine: int = 0, attack=None, clusters: int = 2):
    """Werner et al.'s synthetic linear regression, small: K clusters of 4 clients,
    d = 5, 9 samples each (determined), optima N(0, I), full batches."""
    task = SyntheticLinearRegression(
        clusters=clusters, clients_per_cluster=4, dim=5, samples_per_client=9,
        validation_samples=2, test_samples=2, scale=1.0, optimum="gaussian",
    ).build(seed, byzantine_total=byzantine, dtype=F64)
    return task, Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, None, attack)


def honest_error(task, fed, algo) -> float:
    honest = ~fed.byzantine
    error = algo.client_models()[honest] - task.optima[task.cluster_ids[honest]]
    return float(error.pow(2).sum(-1).mean())


def pure(assignment: torch.Tensor, truth: torch.Tensor) -> bool:
    """Every CFL cluster holds clients of one true cluster only."""
    return all(truth[assignment == c].unique().numel() == 1 for c in assignment.unique())


@pytest.mark.parametrize("clusters", [2, 4])
def test_cfl_learns_a_clustered_task_and_beats_global(clusters):
    """FedAvg first converges to the mixture's stationary point, where the two
    clusters' gradients point apart; CFL splits there (Sattler et al.'s separation
    theorem: the cut never mixes clusters when they are well separated) and each part
    then reaches its own optimum.  After 300 rounds on 3 seeds every CFL cluster is
    pure, and the honest error is below 5% of FedAvg's (which is stuck at the mixture's
    optimum, error about 1-8 here)."""
    for seed in range(3):
        task, fed = clustered_task(seed, clusters=clusters)
        cfl = build("cfl", fed, TASK_CFL)
        _, fed_global = clustered_task(seed, clusters=clusters)
        fedavg = build("global", fed_global, {"lr": TASK_CFL["lr"]})
        for t in range(300):
            cfl.step(t)
            fedavg.step(t)
        assert pure(cfl.assignment, task.cluster_ids), (seed, cfl.assignment.tolist())
        assert cfl.models.shape[0] >= clusters
        assert honest_error(task, fed, cfl) < 0.05 * honest_error(task, fed_global, fedavg), seed
        if clusters == 2:
            assert adjusted_rand_index(task.cluster_ids, cfl.assignment) > 0.4


def test_max_clusters_caps_the_splits():
    task, fed = clustered_task(0, clusters=4)
    algo = build("cfl", fed, {**TASK_CFL, "max_clusters": 2})
    for t in range(300):
        algo.step(t)
    assert algo.models.shape[0] == 2 and algo.assignment.unique().numel() == 2


# -- under attack ------------------------------------------------------------------------------


def test_large_gradient_stops_every_split_and_cfl_is_then_fedavg():
    """CFL is not a robust aggregator: 2 of 10 clients sending 1e6 + 200 N(0, 1) per
    coordinate keep every cluster's mean update norm near 2e5 sqrt(5) >> eps1, so CFL
    never splits and is undefended FedAvg: its models equal Global's (same messages,
    same mean), finite, and far from the optima."""
    task, fed = clustered_task(0, byzantine=2, attack=attacks.LargeGradient())
    cfl = build("cfl", fed, TASK_CFL)
    _, fed_global = clustered_task(0, byzantine=2, attack=attacks.LargeGradient())
    fedavg = build("global", fed_global, {"lr": TASK_CFL["lr"]})
    for t in range(100):
        assert cfl.step(t).extras["splits"] == []
        fedavg.step(t)
    honest = ~fed.byzantine
    assert torch.isfinite(cfl.client_models()[honest]).all()
    torch.testing.assert_close(cfl.client_models(), fedavg.client_models(), rtol=1e-12, atol=0)
    assert honest_error(task, fed, cfl) > 1e6


@pytest.mark.parametrize("attack", ["nan", "bit_flip"])
def test_cfl_under_attack_keeps_honest_models_finite(attack):
    """NaN rows are inadmissible: the splits proceed among the others, the Byzantine
    clients keep the id of the cluster they were in, every honest cluster is pure and
    learns (error < 5% of FedAvg's).  Bit flip (-g, each Byzantine client's own
    gradient) is admissible: its rows point against their cluster, and models stay
    finite."""
    made = attacks.ConstantValue(math.nan) if attack == "nan" else attacks.BitFlip()
    task, fed = clustered_task(1, byzantine=2, attack=made)
    cfl = build("cfl", fed, TASK_CFL)
    _, fed_global = clustered_task(1, byzantine=2, attack=made)
    fedavg = build("global", fed_global, {"lr": TASK_CFL["lr"]})
    for t in range(300):
        cfl.step(t)
        fedavg.step(t)
    honest = ~fed.byzantine
    assert torch.isfinite(cfl.client_models()[honest]).all()
    assert cfl.models.shape[0] >= 2
    if attack == "nan":
        assert pure(cfl.assignment[honest], task.cluster_ids[honest])
        assert honest_error(task, fed, cfl) < 0.05 * honest_error(task, fed_global, fedavg)


def test_bad_parameters_name_the_field():
    fed = example_federation(0)
    for field, value in (("eps1", 0.0), ("eps2", -1.0), ("min_split_size", 1), ("split_after", -1),
                         ("max_clusters", 0), ("local_steps", -1), ("linkage", "average"), ("gamma_max", 1.0)):
        with pytest.raises(ValueError, match=field):
            build("cfl", fed, {field: value})
