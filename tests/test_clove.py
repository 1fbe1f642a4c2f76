"""CLoVE (Clustering of Loss Vector Embeddings, Alg. 1 of the CLoVE paper).

The paper's claims checked here: CLoVE recovers the true clusters (ARI 1.0) within a
few rounds from random models and beats one global model on clustered data (Sec. 5,
Tables 1, 2, 4); clusters are matched to models by the minimum-cost bipartite
matching of summed losses (Alg. 1 line 10), checked by hand on a 3x3 case and
against brute force; the square-root embedding (Sec. 4's SLV) clusters the square
roots; model averaging (Option I) and gradient averaging (Option II) by hand.  The
robustness rules (not in the paper): non-finite or overflowing loss reports never
crash a round, are never clustered and never reach an honest model.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import defenses
from defenses.clove import CLoVE, agglomerative, kmeans_labels, min_cost_matching
from robust_pfl import Federation
from robust_pfl.engine.metrics import adjusted_rand_index
from robust_pfl.engine.tasks import SyntheticLinearRegression
from robust_pfl.engine.tasks.images import ImageTask
from robust_pfl.engine.types import AttackBase, AttackContext

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def digits_task(kind: str = "private_label", seed: int = 0):
    return ImageTask(dataset="digits", kind=kind, clusters=4, clients_per_cluster=5,
                     model={"name": "mlp", "hidden": [32]}).build(seed)


def federation(task, attack=None, batch_size: int | None = 16, seed: int = 0) -> Federation:
    return Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, batch_size, attack,
                      num_classes=task.num_classes)


def synthetic_task(seed: int = 0, byzantine_total: int = 0):
    """Three clusters of five clients, features N(k, 1), optima N(0, I): well separated."""
    return SyntheticLinearRegression(
        clusters=3, clients_per_cluster=5, dim=5, samples_per_client=20, validation_samples=5,
        test_samples=5, scale=1.0, optimum="gaussian", noise=0.1,
    ).build(seed, byzantine_total=byzantine_total, dtype=F64)


def honest_accuracy(task, models: torch.Tensor) -> float:
    accuracy = task.evaluate(models)["test_accuracy"]
    return float(accuracy[~task.byzantine].mean())


# -- learning and cluster recovery (Sec. 5) ---------------------------------------------------
@pytest.mark.parametrize("options", [
    {},
    {"aggregation": "gradient"},
    {"embedding": "sqrt_loss"},
    {"optimizer": "adam", "lr": 1e-3, "heavy_ball": 0.0},
])
def test_clove_recovers_the_clusters_in_a_few_rounds_and_beats_global(options):
    """Digits, private label (cluster k relabels y -> y + k mod 10): one model cannot
    serve four labelings.  CLoVE's ARI reaches 1.0 within three rounds from random
    models and stays there, and its accuracy is far above Global's."""
    task = digits_task()
    opts = {"lr": 0.1, "heavy_ball": 0.9, **options}
    algo = defenses.build("clove", federation(task), opts)
    aris = [adjusted_rand_index(task.cluster_ids, algo.step(t).assignment) for t in range(30)]
    first = next(t for t, ari in enumerate(aris) if ari == 1.0)
    assert first <= 2, aris
    assert all(ari == 1.0 for ari in aris[first:]), aris
    glob = defenses.build("global", federation(task), {"lr": 0.1, "heavy_ball": 0.9})
    for t in range(30):
        glob.step(t)
    clove_acc, global_acc = honest_accuracy(task, algo.client_models()), honest_accuracy(task, glob.client_models())
    assert clove_acc > 0.8 and clove_acc > global_acc + 0.4, (clove_acc, global_acc)


@pytest.mark.parametrize("clustering", ["kmeans", "agglomerative"])
@pytest.mark.parametrize("aggregation", ["model", "gradient"])
def test_sqrt_loss_embedding_recovers_synthetic_clusters_in_the_first_round(clustering, aggregation):
    """Mixed linear regression (the setting of Theorem 4.1): k-means of the square-root
    loss vectors recovers the clusters in one shot, and the models then approach
    their clusters' optima (loss far below Global's)."""
    task = synthetic_task()
    fed = federation(task, batch_size=10)
    algo = defenses.build("clove", fed, {"lr": 0.02, "embedding": "sqrt_loss", "clustering": clustering,
                                         "aggregation": aggregation})
    aris = [adjusted_rand_index(task.cluster_ids, algo.step(t).assignment) for t in range(15)]
    assert aris == [1.0] * 15
    glob = defenses.build("global", federation(task, batch_size=10), {"lr": 0.02})
    for t in range(15):
        glob.step(t)
    ours = float(task.evaluate(algo.client_models())["test_loss"].mean())
    theirs = float(task.evaluate(glob.client_models())["test_loss"].mean())
    assert ours < 0.7 * theirs, (ours, theirs)


# -- matching (Alg. 1 line 10) --------------------------------------------------------------
def test_min_cost_matching_by_hand():
    """Clusters A, B both have their lowest summed loss on model 0; the matching that
    minimises the total is A -> 1, B -> 0, C -> 2 (cost 2 + 1 + 1 = 4, against 7 for
    A -> 0, B -> 1), not each cluster's own lowest."""
    cost = torch.tensor([[1.0, 2.0, 9.0], [1.0, 5.0, 9.0], [9.0, 9.0, 1.0]], dtype=F64)
    assert min_cost_matching(cost).tolist() == [1, 0, 2]


def test_clove_assigns_clients_by_the_min_cost_matching():
    """The same 3x3 case through the server: clients 0-1 report [0.5, 1, 4.5] (cluster
    A, summed [1, 2, 9]), clients 2-3 [0.5, 2.5, 4.5] (B), clients 4-5 [4.5, 4.5, 0.5]
    (C).  A goes to model 1 although every one of its clients has its lowest loss on
    model 0."""
    task = synthetic_task()
    fed = federation(task)
    algo = CLoVE(fed, CLoVE.Params(clusters=3))
    reports = torch.tensor([[0.5, 1.0, 4.5]] * 2 + [[0.5, 2.5, 4.5]] * 2 + [[4.5, 4.5, 0.5]] * 2, dtype=F64)
    previous = torch.zeros(6, dtype=torch.long)
    assert algo._assign(reports, fed.rng("test"), previous).tolist() == [1, 1, 0, 0, 2, 2]
    agglo = CLoVE(fed, CLoVE.Params(clusters=3, clustering="agglomerative"))
    assert agglo._assign(reports, fed.rng("test"), previous).tolist() == [1, 1, 0, 0, 2, 2]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.integers(0, 10_000))
def test_min_cost_matching_is_the_brute_force_minimum(groups, extra, seed):
    k = groups + extra
    cost = torch.rand(groups, k, generator=torch.Generator().manual_seed(seed), dtype=F64) * 10
    chosen = min_cost_matching(cost)
    assert len(set(chosen.tolist())) == groups and int(chosen.max()) < k
    total = float(cost[torch.arange(groups), chosen].sum())
    best = min(sum(float(cost[g, m]) for g, m in enumerate(p)) for p in itertools.permutations(range(k), groups))
    assert total == pytest.approx(best, rel=1e-12, abs=1e-12)


# -- embeddings and clustering ------------------------------------------------------------------
def test_sqrt_embedding_clusters_the_square_roots():
    """Four clients report [v, v] for v = 0, 1, 4, 9 to K = 2 models.  2-means of the
    losses groups {0, 1, 4} | {9} (SSE 8.7 against 13 for {0, 1} | {4, 9}); 2-means of
    their square roots (0, 1, 2, 3) groups {0, 1} | {4, 9}."""
    task = synthetic_task()
    fed = federation(task)
    reports = torch.tensor([[0.0, 0.0], [1.0, 1.0], [4.0, 4.0], [9.0, 9.0]], dtype=F64)
    previous = torch.zeros(4, dtype=torch.long)

    def partition(embedding: str) -> set[frozenset[int]]:
        algo = CLoVE(fed, CLoVE.Params(clusters=2, embedding=embedding))
        assignment = algo._assign(reports, fed.rng("test"), previous).tolist()
        return {frozenset(i for i, a in enumerate(assignment) if a == m) for m in set(assignment)}

    assert partition("loss") == {frozenset({0, 1, 2}), frozenset({3})}
    assert partition("sqrt_loss") == {frozenset({0, 1}), frozenset({2, 3})}


def test_kmeans_finds_separated_blobs_and_is_seeded():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=F64)
    truth = torch.arange(3).repeat_interleave(7)
    points = centres[truth] + 0.5 * torch.randn(21, 2, generator=g, dtype=F64)
    labels = kmeans_labels(points, 3, torch.Generator().manual_seed(1))
    assert adjusted_rand_index(truth, labels) == 1.0
    again = kmeans_labels(points, 3, torch.Generator().manual_seed(1))
    assert torch.equal(labels, again)
    assert adjusted_rand_index(truth, agglomerative(points, 3)) == 1.0
    # fewer points than clusters: every point alone
    assert kmeans_labels(points[:2], 3, g).tolist() == [0, 1]
    assert agglomerative(points[:3], 3).tolist() == [0, 1, 2]


# -- the two aggregations by hand -------------------------------------------------------------
def test_gradient_averaging_by_hand():
    """Option II: model m moves by lr times the mean gradient of its clients (full
    batches, so the gradients are deterministic)."""
    task = synthetic_task()
    fed = federation(task, batch_size=None)
    algo = CLoVE(fed, CLoVE.Params(lr=0.01, aggregation="gradient", embedding="sqrt_loss"))
    for t in range(3):
        models = algo.models.clone()
        record = algo.step(t)
        gradients = fed.gradients(models[record.assignment], fed.train)
        for m in range(models.shape[0]):
            members = record.assignment == m
            expected = models[m] - 0.01 * gradients[members].mean(0) if members.any() else models[m]
            torch.testing.assert_close(algo.models[m], expected, rtol=1e-12, atol=1e-12)
        assert torch.equal(algo.client_models(), algo.models[record.assignment])


def test_model_averaging_by_hand_and_reported_losses_on_the_training_set():
    """Option I: each client runs local_steps GD steps from its matched model; model
    m becomes the mean of its clients' local models.  The loss vectors are each
    client's losses on its whole training set (Alg. 1 line 6)."""
    task = synthetic_task()
    fed = federation(task, batch_size=None)
    algo = CLoVE(fed, CLoVE.Params(lr=0.01, local_steps=3, embedding="sqrt_loss"))
    for t in range(3):
        models = algo.models.clone()
        record = algo.step(t)
        torch.testing.assert_close(record.extras["reported_losses"], fed.cross_losses(models, fed.train).T)
        local = models[record.assignment]
        for _ in range(3):
            local = local - 0.01 * fed.gradients(local, fed.train)
        for m in range(models.shape[0]):
            members = record.assignment == m
            expected = local[members].mean(0) if members.any() else models[m]
            torch.testing.assert_close(algo.models[m], expected, rtol=1e-12, atol=1e-12)


# -- hostile loss reports --------------------------------------------------------------------
class ForgedReports(AttackBase):
    """Replaces the Byzantine loss reports by ``rows`` (cycled over the Byzantine
    clients); every other message is sent honestly."""

    forges_losses = True

    def __init__(self, rows: list[list[float]]) -> None:
        self.rows = rows
        self.calls = 0

    def __call__(self, messages: torch.Tensor, context: AttackContext) -> torch.Tensor:
        own = messages[..., context.byzantine, :].clone()
        if context.kind == "loss":
            self.calls += 1
            for b in range(own.shape[-2]):
                own[..., b, :] = torch.tensor(self.rows[b % len(self.rows)], dtype=own.dtype)[: own.shape[-1]]
        return own


HOSTILE_REPORTS = {
    "nan": [[math.nan] * 4],
    "inf": [[math.inf] * 4],
    "-inf": [[-math.inf] * 4],
    "mixed": [[math.nan, 1.0, math.inf, -math.inf], [-math.inf, math.nan, math.nan, 2.0]],
    "1e38": [[1e38] * 4],
    "huge-and-negative": [[1e300, -1e300, 0.0, 1.0], [-5.0, -6.0, -7.0, -8.0]],
}


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("hostile", sorted(HOSTILE_REPORTS))
@pytest.mark.parametrize("name, options", [
    ("clove", {}), ("clove", {"embedding": "sqrt_loss"}), ("clove", {"clustering": "agglomerative"}),
    ("clove", {"aggregation": "gradient"}), ("ifca", {}), ("ifca_model_avg", {}),
])
def test_hostile_loss_reports_never_crash_or_reach_honest_models(name, options, hostile, dtype):
    """NaN, +-Inf, overflowing, huge or negative reported losses: the rounds run, the
    honest models stay finite, and a report with no finite entry keeps the client's
    previous model."""
    task = SyntheticLinearRegression(clusters=2, clients_per_cluster=4, dim=4, samples_per_client=8,
                                     validation_samples=4, test_samples=4, scale=1.0,
                                     optimum="gaussian").build(0, byzantine_total=2, dtype=dtype)
    attack = ForgedReports(HOSTILE_REPORTS[hostile])
    fed = federation(task, attack, batch_size=4)
    algo = defenses.build(name, fed, {"lr": 0.01, **options})
    previous = algo.assignment.clone()
    for t in range(5):
        record = algo.step(t)
        assert torch.isfinite(algo.client_models()[~fed.byzantine]).all()
        assert record.assignment.shape == (fed.clients,)
        assert int(record.assignment.max()) < algo.models.shape[0] and int(record.assignment.min()) >= 0
        if hostile in ("nan", "inf", "-inf"):
            assert torch.equal(record.assignment[fed.byzantine], previous[fed.byzantine])
        previous = record.assignment.clone()
    assert attack.calls == 5


def test_unclusterable_reports_take_their_lowest_finite_loss():
    """A report with a non-finite entry is not clustered; its client takes the model
    of its lowest finite entry (IFCA's rule), and the honest clients are clustered as
    if it were absent."""
    task = synthetic_task()
    fed = federation(task)
    algo = CLoVE(fed, CLoVE.Params(clusters=3))
    honest = torch.tensor([[0.5, 1.0, 4.5]] * 2 + [[0.5, 2.5, 4.5]] * 2 + [[4.5, 4.5, 0.5]] * 2, dtype=F64)
    hostile = torch.tensor([[math.nan, 7.0, 3.0], [math.inf, -math.inf, math.nan]], dtype=F64)
    previous = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])
    assignment = algo._assign(torch.cat([honest, hostile]), fed.rng("test"), previous)
    assert assignment.tolist() == [1, 1, 0, 0, 2, 2, 2, 1]


# -- parameters -----------------------------------------------------------------------------
@pytest.mark.parametrize("bad, field", [
    ({"optimizer": "adam", "heavy_ball": 0.9}, "heavy_ball"),
    ({"optimizer": "adam", "aggregation": "gradient"}, "aggregation"),
    ({"embedding": "log"}, "embedding"),
    ({"clustering": "dbscan"}, "clustering"),
    ({"local_steps": 0}, "local_steps"),
    ({"kmeans_restarts": 0}, "kmeans_restarts"),
    ({"linkage": "centroid"}, "linkage"),
])
def test_bad_parameters_name_the_field(bad, field):
    fed = federation(synthetic_task())
    with pytest.raises(ValueError, match=field):
        defenses.build("clove", fed, bad)
