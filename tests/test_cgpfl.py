"""CGPFL and CGPFL-Heur (papers/cgpfl.txt, Alg. 1, eq. 6, eq. 12).

Checked: the algorithm learns a clustered task that one global model cannot fit; the
server's k-means++ recovers well-separated clusters; ``alpha = 1`` makes each cluster
model exactly the mean of its members and ``alpha < 1`` blends the matched old model
(eq. 6); one round of Alg. 1 lines 4-13 by hand; CGPFL-Heur's K is the minimiser of
eq. 12 where the formula is defined and follows the documented rule where it is not
(``d > e m``); under large-gradient attack no honest client shares a cluster with a
Byzantine copy, and non-finite rows never crash a round.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attacks
import defenses
from defenses.cgpfl import (
    CGPFL,
    CGPFLHeur,
    generalisation_term,
    heuristic_clusters,
    heuristic_scores,
)
from defenses.kmeans_init import _distances_to, _squared_distances, kmeans
from robust_pfl import Federation
from robust_pfl.engine.data import ClientData
from robust_pfl.engine.metrics import adjusted_rand_index
from robust_pfl.engine.objectives import linear_regression
from robust_pfl.engine.tasks import ImageTask, SyntheticLinearRegression
from robust_pfl.engine.types import AttackBase, AttackContext

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("single_thread")


def clustered_task(seed: int = 0, byzantine_total: int = 0, dtype=F64):
    """Two clusters of four clients, 10-dim regression with 6 samples each: every
    local problem is under-determined and the two optima differ (global cannot fit)."""
    return SyntheticLinearRegression(
        clusters=2, clients_per_cluster=4, dim=10, samples_per_client=6, validation_samples=4,
        test_samples=50, scale=1.0, optimum="gaussian", noise=0.1,
    ).build(seed, byzantine_total=byzantine_total, dtype=dtype)


def federation_of(task, seed: int = 0, attack=None, batch_size: int | None = 4) -> Federation:
    return Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, batch_size, attack)


SMALL_STEPS = {"lr": 0.02, "personal_lr": 0.02}  # this task's curvature needs smaller steps than MNIST's


def trained(name: str, options: dict, rounds: int, seed: int = 0, byzantine_total: int = 0, attack=None):
    task = clustered_task(seed, byzantine_total)
    algo = defenses.build(name, federation_of(task, seed, attack), options)
    records = [algo.step(t) for t in range(rounds)]
    return task, algo, records


def honest_test_loss(task, models: torch.Tensor) -> float:
    honest = ~task.byzantine
    return float(task.evaluate(models)["test_loss"][honest].mean())


# -- learning -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_cgpfl_learns_the_cluster_structure_that_global_and_local_cannot(seed):
    """Sec. 5's claim in kind: clustered generalisation beats one global model (FedAvg)
    and purely local training, and the k-means clusters are the true ones."""
    task, cgpfl, records = trained("cgpfl", {"clusters": 2, **SMALL_STEPS}, rounds=30, seed=seed)
    _, glob, _ = trained("global", {"lr": 0.02}, rounds=500, seed=seed)
    _, local, _ = trained("local", {"lr": 0.02}, rounds=500, seed=seed)
    ours = honest_test_loss(task, cgpfl.client_models())
    assert ours < 0.2 * honest_test_loss(task, glob.client_models())
    assert ours < 0.2 * honest_test_loss(task, local.client_models())
    assert adjusted_rand_index(task.cluster_ids, records[-1].assignment) == 1.0
    # pFedMe (K = 1, the paper's special case) is no better than global on this task
    _, pfedme, _ = trained("cgpfl", {"clusters": 1, **SMALL_STEPS}, rounds=30, seed=seed)
    assert ours < 0.2 * honest_test_loss(task, pfedme.client_models())


# -- the server's k-means -------------------------------------------------------------------------
def separated_points(seed: int = 0, per_cluster: int = 5, dim: int = 6):
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[0.0] * dim, [50.0] * dim, [0.0, -80.0] + [0.0] * (dim - 2)], dtype=F64)
    truth = torch.arange(3).repeat_interleave(per_cluster)
    points = centres[truth] + torch.randn(truth.numel(), dim, generator=g, dtype=F64)
    order = torch.randperm(truth.numel(), generator=g)
    return points[order], truth[order]


@pytest.mark.parametrize("seed", range(5))
def test_kmeans_plus_plus_recovers_well_separated_clusters_and_ignores_inadmissible_rows(seed):
    points, truth = separated_points(seed)
    hostile = torch.tensor([[math.nan] * 6, [math.inf] * 6], dtype=F64)
    result = kmeans(torch.cat([points, hostile]), 3, torch.Generator().manual_seed(seed))
    assert adjusted_rand_index(truth, result.labels[: truth.numel()]) == 1.0
    assert result.labels[truth.numel():].tolist() == [-1, -1]
    assert torch.isfinite(result.centres).all()


@settings(deadline=None, max_examples=60)
@given(rows=st.integers(1, 40), dim=st.integers(1, 9), seed=st.integers(0, 10_000), some=st.booleans(),
       wide=st.booleans())
def test_kmeans_seeding_distances_equal_the_blocked_ones_bit_for_bit(rows, dim, seed, some, wide):
    """The seeding converts rows that fit in one block to float64 once: its distances are
    the blocked ones' exactly, for every row subset and dtype, so seeding is unchanged."""
    g = torch.Generator().manual_seed(seed)
    points = (torch.randn(rows, dim, generator=g, dtype=F64) * 1e3).to(F64 if wide else torch.float32)
    chosen = torch.randperm(rows, generator=g)[: max(1, rows // 2)].sort().values if some else None
    centre = torch.randn(dim, generator=g, dtype=F64)
    assert torch.equal(_distances_to(points, chosen)(centre), _squared_distances(points, chosen, centre))


def hand_federation(inputs_dim: int = 2, clients: int = 4, byzantine=(), attack=None, samples: int = 3) -> Federation:
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(clients, samples, inputs_dim, generator=g, dtype=F64)
    targets = torch.randn(clients, samples, generator=g, dtype=F64)
    mask = torch.zeros(clients, dtype=torch.bool)
    mask[list(byzantine)] = True
    return Federation(
        linear_regression(inputs_dim), ClientData(inputs, targets), torch.arange(clients) % 2, mask, 0, None, attack
    )


def test_server_step_with_alpha_one_sets_each_cluster_model_to_the_mean_of_its_members():
    """Eq. 6 with alpha = 1: omega_k = mean of the uploaded copies of cluster k, exactly."""
    algo = CGPFL(hand_federation(), CGPFL.Params(clusters=2, alpha=1.0))
    received = torch.tensor([[0.0, 0.0], [2.0, 0.0], [10.0, 10.0], [12.0, 10.0]], dtype=F64)
    models, assignment, extras = algo._server(received, torch.Generator().manual_seed(0))
    assert assignment[0] == assignment[1] != assignment[2] == assignment[3]
    assert torch.equal(models[assignment[0]], torch.tensor([1.0, 0.0], dtype=F64))
    assert torch.equal(models[assignment[2]], torch.tensor([11.0, 10.0], dtype=F64))
    assert extras["clusters"] == 2 and extras["kmeans_cost"] == pytest.approx(1.0)  # every copy 1 from its mean


def test_server_step_with_alpha_below_one_blends_the_matched_old_model():
    """Eq. 6: omega_k <- (1 - alpha) omega_k + alpha * mean, where the new cluster near
    [11, 10] continues the old model nearest it (slot 0 here), whatever label k-means
    gave it."""
    algo = CGPFL(hand_federation(), CGPFL.Params(clusters=2, alpha=0.5))
    algo.models = torch.tensor([[10.0, 10.0], [0.0, 0.0]], dtype=F64)
    received = torch.tensor([[0.0, 0.0], [2.0, 0.0], [10.0, 10.0], [12.0, 10.0]], dtype=F64)
    for seed in range(4):  # whatever the seeding labels, the slots follow the old models
        models, assignment, _ = algo._server(received, torch.Generator().manual_seed(seed))
        assert assignment.tolist() == [1, 1, 0, 0]
        assert torch.equal(models, torch.tensor([[10.5, 10.0], [0.5, 0.0]], dtype=F64))


def test_one_round_of_algorithm_1_by_hand():
    """R = 2, S = 1, K = 1, full-batch least squares: theta -= eta (g(theta) + lambda
    (theta - omega)) (line 8), omega -= lr lambda (omega - theta) (line 10), and the one
    cluster model becomes the mean of the uploaded copies (lines 12-13)."""
    fed = hand_federation(inputs_dim=3, clients=4)
    p = CGPFL.Params(clusters=1, local_rounds=2, personal_steps=1, lr=0.01, personal_lr=0.05, lam=3.0)
    algo = CGPFL(fed, p)
    theta = algo.client_models().clone()
    omega = algo.models[0].expand(4, -1).clone()
    a, y = fed.train.inputs, fed.train.targets
    for _ in range(2):
        grad = torch.einsum("nsd,ns->nd", a, torch.einsum("nsd,nd->ns", a, theta) - y) / a.shape[1]
        theta = theta - 0.05 * (grad + 3.0 * (theta - omega))
        omega = omega - 0.01 * 3.0 * (omega - theta)
    record = algo.step(0)
    torch.testing.assert_close(algo.client_models(), theta, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(algo.cluster_models()[0], omega.mean(0), rtol=1e-12, atol=1e-12)
    assert record.assignment.tolist() == [0, 0, 0, 0]


# -- CGPFL-Heur -------------------------------------------------------------------------------------
def test_heuristic_picks_the_minimiser_of_eq_12_where_the_formula_is_defined():
    """d = 10, m = 1000: log(e m / d) = 1 + log 100 = 5.60517; the generalisation term
    sqrt(0.01 K * 5.60517) = 0.236752 sqrt(K) = 0.236752, 0.334818, 0.410067, 0.473505."""
    terms = [generalisation_term(10, 1000, k) for k in (1, 2, 3, 4)]
    assert terms == pytest.approx([0.236752, 0.334818, 0.410067, 0.473505], abs=1e-6)
    costs = [1.0, 0.2, 0.15, 0.0]
    # mu = 1: e = 1.236752, 0.534818, 0.560067, 0.473505 -> K = 4
    assert heuristic_scores(10, 1000, costs, 1.0) == pytest.approx([1.236752, 0.534818, 0.560067, 0.473505], abs=1e-6)
    assert heuristic_clusters(10, 1000, costs, 1.0) == 4
    # mu = 0.5: e = 0.736752, 0.434818, 0.485067, 0.473505 -> K = 2
    assert heuristic_clusters(10, 1000, costs, 0.5) == 2
    # mu = 0: the generalisation term alone, increasing in K -> K = 1
    assert heuristic_clusters(10, 1000, costs, 0.0) == 1
    # the rule is not used where the formula is defined
    assert heuristic_clusters(10, 1000, costs, 0.5, "zero") == 2


def test_heuristic_follows_the_documented_rule_where_the_formula_is_undefined():
    """d = 1000 > e m = 271.8 (m = 100): log(e m / d) = -1.30 < 0 and eq. 12 would take
    the square root of a negative number.  drop_log: sqrt(d K / m) = sqrt(10 K);
    zero: 0, so K^ minimises mu cost(K) alone."""
    for k in (1, 2, 5):
        assert generalisation_term(1000, 100, k, "drop_log") == pytest.approx(math.sqrt(10 * k))
        assert generalisation_term(1000, 100, k, "zero") == 0.0
    costs = [10.0, 4.0, 3.9, 3.9]
    # drop_log, mu = 1: e = 13.162, 8.472, 9.377, 10.225 -> K = 2
    assert heuristic_clusters(1000, 100, costs, 1.0, "drop_log") == 2
    # zero: e = mu cost = 10, 4, 3.9, 3.9 -> K = 3 (the smallest on ties)
    assert heuristic_clusters(1000, 100, costs, 1.0, "zero") == 3
    # at d = e m exactly... just beyond, the formula's log is negative; just below it is tiny
    assert generalisation_term(271, 100, 4) == pytest.approx(math.sqrt(2.71 * 4 * math.log(math.e * 100 / 271)))


def heur_run(task, rounds: int = 2, seed: int = 0, attack=None, **options):
    algo = CGPFLHeur(federation_of(task, seed, attack), CGPFLHeur.Params(**{**SMALL_STEPS, **options}))
    records = [algo.step(t) for t in range(rounds)]
    return algo, records


@pytest.mark.parametrize("mu", [0.0, 1.0, 100.0])
def test_cgpfl_heur_chooses_k_at_the_first_round_by_eq_12_and_keeps_it(mu):
    """Defined case: d = 10 parameters, m = 8 clients * 6 samples = 48 (d < e m)."""
    task = clustered_task(0)
    algo, records = heur_run(task, rounds=3, mu=mu)
    d, m = algo.dimensions()
    assert (d, m) == (10, 48) and d < math.e * m
    costs = records[0].extras["heuristic_costs"].tolist()
    assert len(costs) == 4  # max_clusters = N // 2
    expected = heuristic_clusters(d, m, costs, mu)
    assert algo.chosen_clusters == expected
    assert algo.cluster_models().shape == (expected, d)
    scores = records[0].extras["heuristic_scores"]
    assert int(scores.argmin()) + 1 == expected
    for record in records:
        assert record.extras["clusters"] == expected
        assert int(record.assignment.max()) < expected
    if mu == 0.0:
        assert expected == 1  # the generalisation term alone grows with K
    if mu == 100.0:
        assert expected >= 2  # the two true clusters are worth their term


def test_cgpfl_heur_on_a_network_with_d_above_e_m_follows_the_documented_rule():
    """Digits MLP 64-64-10 (d = 4810) on 8 clients holding 1288 samples: d > e m."""
    task = ImageTask(
        dataset="digits", kind="private_label", clusters=2, clients_per_cluster=4, model={"name": "mlp", "hidden": [64]},
    ).build(0, dtype=F64)
    for rule in ("drop_log", "zero"):
        fed = Federation(task.objective, task.train, task.cluster_ids, task.byzantine, 0, 8, None, num_classes=10)
        algo = CGPFLHeur(fed, CGPFLHeur.Params(mu=1.0, undefined_rule=rule))
        record = algo.step(0)
        d, m = algo.dimensions()
        assert d > math.e * m
        costs = record.extras["heuristic_costs"].tolist()
        if rule == "drop_log":
            scores = [math.sqrt(d * k / m) + c for k, c in enumerate(costs, start=1)]
        else:
            scores = costs
        assert record.extras["heuristic_scores"].tolist() == pytest.approx(scores)
        assert algo.chosen_clusters == 1 + min(range(len(scores)), key=lambda i: (scores[i], i))


def test_cgpfl_heur_with_non_finite_rows_at_the_first_round_tries_only_admissible_counts():
    task = clustered_task(0, byzantine_total=6)  # 8 honest + 6 Byzantine, N // 2 = 7
    algo, records = heur_run(task, rounds=2, attack=attacks.ConstantValue(math.nan), mu=1.0, max_clusters=20)
    assert len(records[0].extras["heuristic_costs"]) == 8  # the 8 admissible copies
    assert torch.isfinite(algo.client_models()[~task.byzantine]).all()
    assert torch.isfinite(algo.cluster_models()).all()


# -- attacks -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_under_large_gradient_no_honest_client_shares_a_cluster_with_a_byzantine_copy(seed):
    """k-means's squared error puts the far copies (N(1e6, 200^2) per coordinate) in
    clusters of their own: with K = 4 > 2 true clusters the honest clients still
    split into the true clusters, every cluster model an honest client receives is a
    mean of honest copies only, and the honest loss is at most 1.5 times that of the
    unattacked run (here it is lower: the far copies take the two surplus clusters,
    which the unattacked run spends splitting true clusters)."""
    task, algo, records = trained(
        "cgpfl", {"clusters": 4, **SMALL_STEPS}, 30, seed, byzantine_total=2, attack=attacks.LargeGradient()
    )
    honest = ~task.byzantine
    for record in records:
        honest_slots = set(record.assignment[honest].tolist())
        assert honest_slots.isdisjoint(record.assignment[task.byzantine].tolist())
        assert float(record.centres[sorted(honest_slots)].abs().max()) < 1e3
    assert adjusted_rand_index(task.cluster_ids[honest], records[-1].assignment[honest]) == 1.0
    assert torch.isfinite(algo.client_models()[honest]).all()
    _, clean, _ = trained("cgpfl", {"clusters": 4, **SMALL_STEPS}, 30, seed, byzantine_total=2)  # no attack
    attacked_loss = honest_test_loss(task, algo.client_models())
    clean_loss = honest_test_loss(task, clean.client_models())
    assert attacked_loss < 1.5 * clean_loss + 0.05


def test_under_large_gradient_with_k_equal_to_the_true_clusters_the_honest_clusters_merge():
    """The damage, stated: with K = 2 the two Byzantine copies take one cluster, so all
    honest clients share the other (CGPFL with one model for them, like pFedMe); their
    cluster model is still a mean of honest copies, their models finite and bounded."""
    task, algo, records = trained(
        "cgpfl", {"clusters": 2, **SMALL_STEPS}, 30, 0, byzantine_total=2, attack=attacks.LargeGradient()
    )
    honest = ~task.byzantine
    last = records[-1]
    assert len(set(last.assignment[honest].tolist())) == 1
    assert set(last.assignment[honest].tolist()).isdisjoint(last.assignment[task.byzantine].tolist())
    assert float(algo.client_models()[honest].abs().max()) < 1e2
    # unattacked runs of the same clients (the Byzantine ones behaving honestly)
    _, merged, _ = trained("cgpfl", {"clusters": 1, **SMALL_STEPS}, 30, 0, byzantine_total=2)
    _, separated, _ = trained("cgpfl", {"clusters": 2, **SMALL_STEPS}, 30, 0, byzantine_total=2)
    attacked = honest_test_loss(task, algo.client_models())
    assert attacked > 5 * honest_test_loss(task, separated.client_models())  # the harm is real
    assert attacked < 1.5 * honest_test_loss(task, merged.client_models())  # and bounded by K = 1's


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e38])
@pytest.mark.parametrize("name", ["cgpfl", "cgpfl_heur"])
def test_non_finite_or_overflowing_rows_never_crash_or_reach_a_cluster_model(name, value):
    task = clustered_task(0, byzantine_total=2, dtype=torch.float32)
    algo = defenses.build(name, federation_of(task, 0, attacks.ConstantValue(value)), {**SMALL_STEPS})
    for t in range(4):
        record = algo.step(t)
        assert torch.isfinite(record.centres.pow(2).sum(-1)).all()
    assert torch.isfinite(algo.client_models()[~task.byzantine]).all()


class ProbingAttack(AttackBase):
    """Sends the honest rows unchanged and keeps what the defense's probe says the
    clients would receive."""

    reads_messages = True

    def __init__(self) -> None:
        self.probed: list[torch.Tensor] = []

    def __call__(self, messages: torch.Tensor, context: AttackContext) -> torch.Tensor:
        self.probed.append(context.defense_state["aggregate"](messages))
        return messages[..., context.byzantine, :]


@pytest.mark.parametrize("name", ["cgpfl", "cgpfl_heur"])
def test_aggregate_probe_predicts_the_received_models_and_changes_nothing(name):
    spy = ProbingAttack()
    task, probed, _ = trained(name, {**SMALL_STEPS}, 3, 0, byzantine_total=2, attack=spy)
    assert len(spy.probed) == 3
    assert torch.equal(spy.probed[-1], probed.cluster_models()[probed.assignment])
    _, plain, _ = trained(name, {**SMALL_STEPS}, 3, 0, byzantine_total=2)
    assert torch.equal(probed.client_models(), plain.client_models())


def test_parameters_are_validated_naming_the_field():
    fed = federation_of(clustered_task(0))
    with pytest.raises(ValueError, match="alpha"):
        CGPFL(fed, CGPFL.Params(alpha=1.5))
    with pytest.raises(ValueError, match="lr \\* lambda"):
        CGPFL(fed, CGPFL.Params(lr=0.2, lam=12.0))
    with pytest.raises(ValueError, match="undefined_rule"):
        CGPFLHeur.Params(undefined_rule="clamp")
    assert CGPFL.Params(**{"lambda": 3.0}).lam == 3.0
    defaults = CGPFL.Params()
    assert (defaults.clusters, defaults.lam, defaults.local_rounds, defaults.personal_steps, defaults.lr, defaults.alpha) == (
        4, 12.0, 10, 5, 0.005, 1.0
    )
