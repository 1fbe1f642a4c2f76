"""Personalised-FL baselines: Ditto, IFCA Option II (model averaging) and KNN-Per.

Ditto is checked against Local and Global (same seed, same batch stream) and by hand
on linear regression; IFCA Option II against Option I (model averaging of one SGD step
is a step with the mean gradient) and against hostile model rows; KNN-Per's mixture
at its two ends (lambda = 0: the global softmax; lambda = 1, k = 1: the label of the
nearest training point).
"""

from __future__ import annotations

import math

import pytest
import torch

import attacks
import defenses
import defenses.ditto  # noqa: F401  (registers "ditto" until defenses/__init__ imports it)
import defenses.knn_per  # noqa: F401  (registers "knn_per")
from defenses.baselines import Global, Local
from defenses.ditto import Ditto
from defenses.ifca import IFCA, IFCAModelAveraging
from defenses.knn_per import KNNPer
from defenses.primitives import admissible_group_mean
from robust_pfl import Federation
from robust_pfl.engine.data import Batch, ClientData
from robust_pfl.engine.objectives import DenseNetwork, linear_regression
from robust_pfl.engine.tasks import SyntheticLinearRegression
from robust_pfl.engine.types import AttackBase, AttackContext

F64 = torch.float64


def regression_task(seed=0, byzantine_total=0, dtype=F64):
    return SyntheticLinearRegression(
        clusters=2, clients_per_cluster=3, dim=5, samples_per_client=6,
        validation_samples=2, test_samples=2, scale=10.0,
    ).build(seed, byzantine_total=byzantine_total, dtype=dtype)


def regression_federation(seed=0, byzantine_total=0, batch_size=4, attack=None, dtype=F64) -> Federation:
    task = regression_task(seed, byzantine_total, dtype)
    return Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, batch_size, attack)


def near_optima(seed=0) -> torch.Tensor:
    """IFCA models started near the task's two optima (so both are picked)."""
    optima = regression_task(seed).optima
    return optima + torch.randn(optima.shape, generator=torch.Generator().manual_seed(9), dtype=F64)


def classification_federation(seed=0, hidden=(), byzantine=(), attack=None, batch_size=4, dtype=F64,
                               clients=3, samples=8, features=4, classes=3) -> Federation:
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(clients, samples, features, generator=g, dtype=dtype)
    targets = torch.randint(0, classes, (clients, samples), generator=g)
    mask = torch.zeros(clients, dtype=torch.bool)
    mask[list(byzantine)] = True
    return Federation(
        DenseNetwork(features, classes, hidden, "cross_entropy"),
        ClientData(inputs, targets),
        torch.arange(clients) % 2,
        mask,
        seed,
        batch_size,
        attack,
        num_classes=classes,
    )


# -- Ditto ------------------------------------------------------------------------------------
@pytest.mark.parametrize("heavy_ball", [0.0, 0.5])
def test_ditto_lambda_zero_is_local_on_v_and_global_on_w(heavy_ball):
    ditto = Ditto(regression_federation(), Ditto.Params(lr=0.01, heavy_ball=heavy_ball, lam=0.0))
    local = Local(regression_federation(), Local.Params(lr=0.01, heavy_ball=heavy_ball))
    glob = Global(regression_federation(), Global.Params(lr=0.01, heavy_ball=heavy_ball))
    assert torch.equal(ditto.client_models(), local.client_models())
    for t in range(6):
        record = ditto.step(t)
        local_record = local.step(t)
        global_record = glob.step(t)
        assert torch.equal(ditto.client_models(), local.client_models())
        assert torch.equal(ditto.global_model(), glob.client_models()[0])
        assert torch.equal(record.updates, local_record.updates)  # lambda = 0: the plain gradient
        assert torch.equal(record.gradients, global_record.gradients)
        assert torch.equal(record.extras["global_update"], global_record.updates[0])


def test_ditto_global_model_is_global_for_any_lambda_and_personal_steps():
    ditto = Ditto(regression_federation(), Ditto.Params(lr=0.01, lam=3.0, personal_steps=3))
    glob = Global(regression_federation(), Global.Params(lr=0.01))
    # personal steps after the first draw extra batches: the global model uses the
    # round's first batch, so it only matches Global when the batches are the full data
    ditto_full = Ditto(regression_federation(batch_size=None), Ditto.Params(lr=0.01, lam=3.0, personal_steps=3))
    glob_full = Global(regression_federation(batch_size=None), Global.Params(lr=0.01))
    for t in range(4):
        ditto.step(t)
        glob.step(t)
        ditto_full.step(t)
        glob_full.step(t)
    assert torch.equal(ditto_full.global_model(), glob_full.client_models()[0])
    assert torch.isfinite(ditto.client_models()).all()


def test_ditto_large_lambda_keeps_personal_models_at_the_global_model():
    """The personal models approach the prox point of w (distance ~ |g_i| / lambda)."""

    def spread(lam: float, **options) -> float:
        algo = Ditto(regression_federation(), Ditto.Params(lr=0.005, lam=lam, **options))
        for t in range(20):
            received = algo.global_model().clone()  # the w the clients are pulled to
            algo.step(t)
        return float((algo.client_models() - received).norm(dim=-1).max())

    spreads = [spread(lam) for lam in (0.0, 10.0, 100.0)]
    assert spreads[0] > 1.0 and spreads[0] > spreads[1] > spreads[2]
    assert spread(1e4, personal_lr=1e-4, personal_steps=20) < 0.005 * spreads[0]


def test_ditto_personal_step_by_hand_on_linear_regression():
    """One step ``v -= lr (A^T (A v - y) / n + lambda (v - w))`` on full batches."""
    g = torch.Generator().manual_seed(1)
    n_clients, n, dim, lr, lam = 4, 7, 3, 0.05, 0.7
    a = torch.randn(n_clients, n, dim, generator=g, dtype=F64)
    y = torch.randn(n_clients, n, generator=g, dtype=F64)
    fed = Federation(linear_regression(dim), ClientData(a, y), torch.zeros(n_clients, dtype=torch.long),
                     torch.zeros(n_clients, dtype=torch.bool), 0, None)
    algo = Ditto(fed, Ditto.Params(lr=lr, lam=lam))

    def by_hand(v, w):
        residual = torch.einsum("cnd,cd->cn", a, v) - y
        return torch.einsum("cnd,cn->cd", a, residual) / n + lam * (v - w)

    for t in range(3):  # round 0 has v = w; later rounds test the proximal term
        v, w = algo.client_models().clone(), algo.global_model().clone()
        record = algo.step(t)
        expected = by_hand(v, w)
        torch.testing.assert_close(record.updates, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(algo.client_models(), v - lr * expected, rtol=1e-12, atol=1e-12)
        global_grads = torch.einsum("cnd,cn->cd", a, torch.einsum("cnd,d->cn", a, w) - y) / n
        torch.testing.assert_close(record.gradients, global_grads, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(algo.global_model(), w - lr * global_grads.mean(0), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(algo.client_models(), algo.global_model().expand(n_clients, -1))


def test_ditto_personal_lr_and_lambda_alias():
    fed = regression_federation()
    algo = defenses.build("ditto", fed, {"lambda": 0.5, "personal_lr": 0.02, "lr": 0.01})
    assert algo.params.lam == 0.5 and algo.personal.lr == 0.02 and algo.fedavg.optimizer.lr == 0.01
    for bad, field in [({"lambda": -1.0}, "lambda"), ({"personal_steps": 0}, "personal_steps"),
                       ({"personal_lr": 0.0}, "personal_lr")]:
        with pytest.raises(ValueError, match=field):
            defenses.build("ditto", fed, bad)


# -- IFCA Option II -----------------------------------------------------------------------------
def test_model_averaging_of_one_step_equals_gradient_averaging():
    """Option II with one local SGD step: mean_i (x_k - lr g_i) = x_k - lr mean_i g_i, so
    it follows Option I (same batches, same choices) up to rounding."""
    option_1 = IFCA(regression_federation(), IFCA.Params(lr=0.01), near_optima())
    option_2 = IFCAModelAveraging(
        regression_federation(), IFCAModelAveraging.Params(lr=0.01, local_steps=1), near_optima()
    )
    assert torch.equal(option_1.models, option_2.models)
    for t in range(8):
        r1, r2 = option_1.step(t), option_2.step(t)
        assert torch.equal(r1.assignment, r2.assignment)
        torch.testing.assert_close(r2.gradients, r1.gradients, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(r2.centres, r1.centres, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(r2.updates, r1.updates, rtol=1e-9, atol=1e-9)
    assert option_2.assignment.tolist() == [0, 0, 0, 1, 1, 1]  # both models in use: not vacuous


def test_model_averaging_local_steps_by_hand():
    """Full batches: each client runs ``local_steps`` GD steps from its model, then
    the picked models become the means of their clients' local models."""
    fed = regression_federation(batch_size=None)
    algo = IFCAModelAveraging(fed, IFCAModelAveraging.Params(lr=0.01, local_steps=3), near_optima())
    for t in range(3):
        models = algo.models.clone()
        chosen = fed.cross_losses(models, fed.train).argmin(0)
        local = models[chosen]
        for _ in range(3):
            local = local - 0.01 * fed.gradients(local, fed.train)
        record = algo.step(t)
        assert torch.equal(record.assignment, chosen)
        for k in range(models.shape[0]):
            picked = chosen == k
            expected = local[picked].mean(0) if picked.any() else models[k]
            torch.testing.assert_close(algo.models[k], expected, rtol=1e-12, atol=1e-12)
        assert torch.equal(algo.client_models(), algo.models[chosen])


def test_clients_pick_the_lowest_loss_model():
    fed = regression_federation(batch_size=None)
    algo = IFCAModelAveraging(fed, IFCAModelAveraging.Params(lr=0.01, clusters=3))
    for t in range(4):
        losses = fed.cross_losses(algo.models.clone(), fed.train)  # [K, N]
        record = algo.step(t)
        picked = losses.gather(0, record.assignment.unsqueeze(0))[0]
        assert torch.equal(picked, losses.min(0).values)


def _two_cluster_federation(attack, dtype):
    """Clients 0-2 fit optimum 0; client 3 (Byzantine) fits optimum 1 exactly, so with
    the models initialised at the optima it alone picks model 1."""
    g = torch.Generator().manual_seed(0)
    optima = torch.tensor([[1.0, -2.0, 0.5], [30.0, 40.0, -50.0]], dtype=F64)
    ids = torch.tensor([0, 0, 0, 1])
    a = torch.randn(4, 6, 3, generator=g, dtype=F64)
    noise = 0.1 * torch.randn(4, 6, generator=g, dtype=F64) * (ids == 0).view(-1, 1)  # cluster 0 only
    y = torch.einsum("cnd,cd->cn", a, optima[ids]) + noise
    fed = Federation(linear_regression(3), ClientData(a.to(dtype), y.to(dtype)), ids,
                     torch.tensor([False, False, False, True]), 0, None, attack)
    return fed, optima.to(dtype)


HOSTILE_MODELS = [(v, d) for v in (math.nan, math.inf, -math.inf) for d in (torch.float32, F64)]
HOSTILE_MODELS += [(1e38, torch.float32)]  # its squared norm overflows: inadmissible


@pytest.mark.parametrize("value, dtype", HOSTILE_MODELS)
def test_hostile_models_never_reach_a_cluster_model(value, dtype):
    fed, optima = _two_cluster_federation(attacks.ConstantValue(value), dtype)
    algo = IFCAModelAveraging(fed, IFCAModelAveraging.Params(lr=0.01, clusters=2), initial_models=optima)
    honest, _ = _two_cluster_federation(None, dtype)
    reference = IFCAModelAveraging(honest, IFCAModelAveraging.Params(lr=0.01, clusters=2), initial_models=optima)
    for t in range(5):
        record = algo.step(t)
        reference.step(t)
        assert record.assignment.tolist() == [0, 0, 0, 1]
        assert torch.isfinite(algo.models.pow(2).sum(-1)).all()
        # model 1's only client sent a hostile model: it stays where it was
        assert torch.equal(algo.models[1], optima[1])
        # model 0 is the honest clients' average, as without the attacker
        assert torch.equal(algo.models[0], reference.models[0])
    assert not torch.equal(algo.models[0], optima[0])


def test_finite_large_models_are_averaged_as_they_are():
    """1e38 is an ordinary finite row in float64: plain averaging (no defense) takes it."""
    fed, optima = _two_cluster_federation(attacks.ConstantValue(1e38), F64)
    algo = IFCAModelAveraging(fed, IFCAModelAveraging.Params(lr=0.01, clusters=2), initial_models=optima)
    algo.step(0)
    assert torch.equal(algo.models[1], torch.full((3,), 1e38, dtype=F64))


def test_admissible_group_mean_drops_hostile_rows_and_is_batched():
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0], [math.nan, 0.0], [math.inf, 1.0], [5.0, 6.0], [1e30, 0.0]],
                        dtype=torch.float32)
    groups = torch.tensor([0, 0, 1, 1, 0, 2])
    means, sizes = admissible_group_mean(rows, groups, 4)
    assert sizes.tolist() == [3, 0, 0, 0]  # 1e30 squared overflows float32: inadmissible
    assert torch.equal(means, torch.tensor([[3.0, 4.0], [0, 0], [0, 0], [0, 0]]))
    batched, batched_sizes = admissible_group_mean(torch.stack([rows, rows.flip(0)]), groups, 4)
    assert torch.equal(batched[0], means) and torch.equal(batched_sizes[0], sizes)
    flipped, flipped_sizes = admissible_group_mean(rows.flip(0), groups, 4)
    assert torch.equal(batched[1], flipped) and torch.equal(batched_sizes[1], flipped_sizes)


def test_model_averaging_delivers_models_and_exposes_the_aggregate():
    seen = []

    class Probe(AttackBase):
        def __call__(self, messages, context: AttackContext):
            aggregate = context.defense_state["aggregate"](messages)
            seen.append((context.kind, tuple(aggregate.shape), context.defense_state["assignment"].tolist()))
            return messages[..., context.byzantine, :]  # honest rows: the run is unchanged

    fed = regression_federation(byzantine_total=2, attack=Probe())
    algo = IFCAModelAveraging(fed, IFCAModelAveraging.Params(lr=0.01, local_steps=2))
    record = algo.step(0)
    assert seen == [("model", (fed.clients, 5), record.assignment.tolist())]


# -- KNN-Per ------------------------------------------------------------------------------------
def test_knn_per_lambda_zero_is_the_global_softmax():
    fed = classification_federation()
    algo = KNNPer(fed, KNNPer.Params(lr=0.1, lam=0.0))
    for t in range(3):
        algo.step(t)
    queries = torch.randn(3, 5, 4, dtype=F64)
    expected = torch.softmax(torch.einsum("nbf,cf->nbc", queries, algo.client_models()[0, :12].view(3, 4))
                             + algo.client_models()[0, 12:], dim=-1)
    torch.testing.assert_close(algo.predict_log_proba(queries).exp(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("weighting", ["uniform", "distance"])
def test_knn_per_lambda_one_k_one_returns_the_training_label(weighting):
    fed = classification_federation()
    algo = KNNPer(fed, KNNPer.Params(lam=1.0, k=1, weighting=weighting))
    algo.step(0)
    proba = algo.predict_log_proba(fed.train.inputs).exp()  # queries = the training points
    onehot = torch.nn.functional.one_hot(fed.train.targets, 3).to(F64)
    torch.testing.assert_close(proba, onehot, rtol=0, atol=1e-300)
    # a query near (not at) a training point still takes that point's label
    near = fed.train.inputs + 1e-3
    assert torch.equal(algo.predict_log_proba(near).argmax(-1), fed.train.targets)


def test_knn_per_uses_each_clients_own_training_set():
    """k = n, uniform: the vote is the client's own label histogram, whatever the query."""
    fed = classification_federation(samples=6)
    algo = KNNPer(fed, KNNPer.Params(lam=1.0, k=50))
    histogram = torch.nn.functional.one_hot(fed.train.targets, 3).to(F64).mean(1)  # [N, C]
    proba = algo.predict_log_proba(torch.randn(3, 4, 4, dtype=F64)).exp()
    torch.testing.assert_close(proba, histogram.unsqueeze(1).expand(-1, 4, -1), rtol=1e-12, atol=1e-300)


def test_knn_per_distance_weighting_by_hand():
    fed = classification_federation(samples=5)
    algo = KNNPer(fed, KNNPer.Params(lam=0.3, k=2, weighting="distance", temperature=0.5))
    query = torch.randn(3, 1, 4, dtype=F64)
    logits = algo.federation.objective.paired_outputs(algo.client_models(), Batch(query, query[..., 0]))
    distances = (fed.train.inputs - query).norm(dim=-1)  # [N, n]
    near, index = distances.topk(2, largest=False)
    weights = torch.exp(-near / 0.5)
    weights = weights / weights.sum(-1, keepdim=True)
    knn = torch.zeros(3, 3, dtype=F64).scatter_add_(-1, fed.train.targets.gather(1, index), weights)
    expected = 0.3 * knn + 0.7 * torch.softmax(logits[:, 0], -1)
    torch.testing.assert_close(algo.predict_log_proba(query)[:, 0].exp(), expected, rtol=1e-10, atol=1e-12)


def test_knn_per_shapes_normalisation_and_chunking(monkeypatch):
    fed = classification_federation(hidden=(5,), samples=10, dtype=torch.float32)
    algo = KNNPer(fed, KNNPer.Params(lam=0.5, k=3, weighting="distance"))
    algo.step(0)
    queries = torch.randn(3, 7, 4)
    log_proba = algo.predict_log_proba(queries)
    assert log_proba.shape == (3, 7, 3) and log_proba.dtype == torch.float32
    assert torch.isfinite(log_proba).all()
    torch.testing.assert_close(log_proba.exp().sum(-1), torch.ones(3, 7))
    monkeypatch.setattr(defenses.knn_per, "_DISTANCE_BUDGET", 40)  # 1 query per block
    torch.testing.assert_close(algo.predict_log_proba(queries), log_proba, rtol=0, atol=0)


def test_knn_per_datastore_follows_the_global_model():
    fed = classification_federation(hidden=(5,))
    algo = KNNPer(fed, KNNPer.Params(lr=0.5, lam=1.0))
    before = algo.datastore().clone()
    algo.step(0)
    after = algo.datastore()
    assert not torch.equal(before, after)
    assert torch.equal(after, fed.objective.paired_features(algo.client_models(), fed.train))


def test_knn_per_global_model_is_global():
    knn = KNNPer(classification_federation(), KNNPer.Params(lr=0.1))
    glob = Global(classification_federation(), Global.Params(lr=0.1))
    for t in range(4):
        knn.step(t)
        glob.step(t)
    assert torch.equal(knn.client_models(), glob.client_models())


def test_knn_per_needs_a_classification_task():
    with pytest.raises(ValueError, match="knn_per needs a classification task"):
        defenses.build("knn_per", regression_federation())
    with pytest.raises(ValueError, match="lambda"):
        defenses.build("knn_per", classification_federation(), {"lambda": 1.5})
    with pytest.raises(ValueError, match="weighting"):
        defenses.build("knn_per", classification_federation(), {"weighting": "cosine"})


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e38])
def test_knn_per_hostile_rows_never_reach_the_global_model(value):
    fed = classification_federation(byzantine=(2,), attack=attacks.ConstantValue(value), dtype=torch.float32)
    algo = KNNPer(fed, KNNPer.Params(lr=0.1))
    for t in range(4):
        algo.step(t)
    assert torch.isfinite(algo.client_models()).all()
    assert torch.isfinite(algo.predict_log_proba(fed.train.inputs)).all()


def test_knn_per_is_seeded():
    def models(seed):
        algo = KNNPer(classification_federation(seed=seed, batch_size=3), KNNPer.Params(lr=0.1))
        for t in range(3):
            algo.step(t)
        return algo.client_models()

    assert torch.equal(models(5), models(5))
    assert not torch.equal(models(5), models(6))
