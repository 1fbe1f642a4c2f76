"""FLTrust and FoolsGold (defenses.trust_aggregation): server rules that need more than
the rows received this round.

Each rule is checked against a straightforward NumPy implementation written here from
the paper's algorithm (loops over clients, float64), on rows and on a constructed
federation run; by hand on small cases (a row with negative cosine to the server's
update gets no trust; sybils sending one update are weighted 0); against NaN / Inf /
1e38 rows; by the public ``check_algorithm``; and ``global``'s refactored step is
checked bit for bit against its former code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np
import pytest
import torch

import attacks
import defenses
import defenses.trust_aggregation  # registers "fltrust" and "foolsgold" until defenses/__init__ imports it
from defenses.baselines import Global
from defenses.optimiser import HeavyBall
from defenses.aggregators import make_aggregator
from defenses.round_buffers import RoundBuffers
from defenses.trust_aggregation import (
    FLTrust,
    FoolsGold,
    fltrust_aggregate,
    foolsgold_aggregate,
    foolsgold_weights,
)
from robust_pfl import Federation
from robust_pfl.engine.tasks import SyntheticLinearRegression
from robust_pfl.engine.types import AttackBase, AttackContext

F64 = torch.float64


def federation(seed: int = 0, byzantine_total: int = 2, batch_size: int | None = 4, attack=None,
               dtype: torch.dtype = F64, clients_per_cluster: int = 3) -> Federation:
    task = SyntheticLinearRegression(
        clusters=2, clients_per_cluster=clients_per_cluster, dim=5, samples_per_client=6,
        validation_samples=2, test_samples=2, scale=10.0,
    ).build(seed, byzantine_total=byzantine_total, dtype=dtype)
    return Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, batch_size, attack)


# -- independent references, from the papers (loops over clients, float64 NumPy) ---------------
def admissible(row: np.ndarray) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(row).all() and np.isfinite(np.sum(row.astype(np.float64) ** 2)))


def reference_fltrust(rows: np.ndarray, g0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cao et al. eq. 4: TS_i = ReLU(cos(g_i, g0)); g = sum_i TS_i ||g0||/||g_i|| g_i / sum_j TS_j
    (0 where no trust)."""
    rows, g0 = rows.astype(np.float64), g0.astype(np.float64)
    n, d = rows.shape
    scores, total, acc = np.zeros(n), 0.0, np.zeros(d)
    g0_norm = np.linalg.norm(g0) if admissible(g0) else 0.0
    for i in range(n):
        if not admissible(rows[i]) or g0_norm == 0.0:
            continue
        norm = np.linalg.norm(rows[i])
        if norm == 0.0:
            continue
        cos = float(rows[i] @ g0) / (norm * g0_norm)
        scores[i] = max(cos, 0.0)
        acc += scores[i] * (g0_norm / norm) * rows[i]
        total += scores[i]
    return (acc / total if total > 0 else np.zeros(d)), scores


def reference_foolsgold_weights(histories: np.ndarray, kappa: float = 1.0) -> np.ndarray:
    """Fung et al. Alg. 1 as the authors' ``foolsgold()`` computes it (cs = cos - I,
    pardoning, 1 - max, clip, rescale, 0.99, logit, clip); inadmissible histories are
    similar to nothing and get weight 0; all-zero alphas give all-zero weights."""
    h = histories.astype(np.float64)
    n = h.shape[0]
    ok = np.array([admissible(row) for row in h])
    cs = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j and ok[i] and ok[j]:
                ni, nj = np.linalg.norm(h[i]), np.linalg.norm(h[j])
                cs[i, j] = 0.0 if ni == 0 or nj == 0 else h[i] @ h[j] / (ni * nj)
    maxcs = cs.max(axis=1)
    for i in range(n):
        for j in range(n):
            if i != j and maxcs[i] < maxcs[j]:
                cs[i, j] = cs[i, j] * maxcs[i] / maxcs[j]
    wv = 1 - cs.max(axis=1)
    wv = np.clip(wv, 0, 1)
    wv[~ok] = 0
    if wv.max() == 0:
        return np.zeros(n)
    wv = wv / wv.max()
    wv[wv == 1] = 0.99
    with np.errstate(divide="ignore"):
        wv = kappa * (np.log(wv / (1 - wv)) + 0.5)
    wv[np.isinf(wv) & (wv > 0)] = 1
    wv[wv > 1] = 1
    wv[wv < 0] = 0
    return wv


def reference_foolsgold(rows: np.ndarray, history: np.ndarray, kappa: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """This round's weighted mean: weights from history + rows, inadmissible rows 0."""
    with np.errstate(over="ignore", invalid="ignore"):
        weights = reference_foolsgold_weights(history.astype(np.float64) + rows.astype(np.float64), kappa)
    acc, total = np.zeros(rows.shape[1]), 0.0
    for i in range(rows.shape[0]):
        if admissible(rows[i]) and weights[i] > 0:
            acc += weights[i] * rows[i].astype(np.float64)
            total += weights[i]
        else:
            weights[i] = 0.0
    return (acc / total if total > 0 else acc), weights


def random_rows(seed: int, n: int, d: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d, generator=g, dtype=F64) * 0.5 + torch.randn(n, d, generator=g, dtype=F64)


# -- FLTrust on rows ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_fltrust_rule_matches_the_papers_equation(seed):
    rows = random_rows(seed, 9, 6)
    rows[3] = 0.0  # a zero row: no direction, no trust
    g0 = random_rows(100 + seed, 1, 6)[0]
    out, scores = fltrust_aggregate(rows, g0)
    expected, expected_scores = reference_fltrust(rows.numpy(), g0.numpy())
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scores.numpy(), expected_scores, rtol=1e-12, atol=1e-12)
    assert (expected_scores == 0).any() and (expected_scores > 0).any()  # both cases exercised
    # batched over leading dimensions: each problem as alone
    batch = torch.stack([rows, rows.flip(0) * 3.0, -rows])
    out_b, _ = fltrust_aggregate(batch, g0)
    for k in range(3):
        torch.testing.assert_close(out_b[k], fltrust_aggregate(batch[k], g0)[0], rtol=1e-12, atol=1e-12)


def test_fltrust_gives_no_trust_to_a_row_against_the_server_update():
    """By hand: g0 = (3, 4), ||g0|| = 5; a = (1, 0): cos 0.6; b = (0, 2): cos 0.8;
    c = (-10, -10): cos < 0, trust 0 whatever its size.  Rescaled to norm 5, a -> (5, 0),
    b -> (0, 5); aggregate (0.6 (5, 0) + 0.8 (0, 5)) / 1.4 = (3, 4) / 1.4."""
    g0 = torch.tensor([3.0, 4.0], dtype=F64)
    for c in ([-10.0, -10.0], [-1e6, -1.0], [-1e300, -1e300]):
        rows = torch.tensor([[1.0, 0.0], [0.0, 2.0], c], dtype=F64)
        out, scores = fltrust_aggregate(rows, g0)
        torch.testing.assert_close(scores, torch.tensor([0.6, 0.8, 0.0], dtype=F64), rtol=1e-15, atol=1e-15)
        torch.testing.assert_close(out, torch.tensor([3.0, 4.0], dtype=F64) / 1.4, rtol=1e-15, atol=1e-15)
    # a huge row along g0 counts as much as a small one: its size never gets through
    rows = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3e100, 4e100]], dtype=F64)
    out, scores = fltrust_aggregate(rows, g0)
    assert scores[2] == pytest.approx(1.0)
    assert float(out.norm()) <= 5.0 + 1e-12


def test_fltrust_with_no_trusted_row_gives_the_zero_update():
    g0 = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    rows = torch.tensor([[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    out, scores = fltrust_aggregate(rows, g0)
    assert torch.equal(out, torch.zeros(3, dtype=F64)) and torch.equal(scores, torch.zeros(3, dtype=F64))
    # a zero or non-finite server update trusts nobody
    for bad in (torch.zeros(3, dtype=F64), torch.full((3,), math.nan, dtype=F64)):
        out, scores = fltrust_aggregate(torch.eye(3, dtype=F64), bad)
        assert torch.equal(out, torch.zeros(3, dtype=F64)) and not scores.any()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_fltrust_non_finite_and_overflowing_rows_are_absent(dtype):
    rows = random_rows(7, 10, 4).to(dtype)
    g0 = rows[:5].mean(0)
    hostile = rows.clone()
    hostile[1], hostile[4, 2], hostile[7] = math.nan, -math.inf, 1e38 if dtype == torch.float32 else 1e300
    hostile[8] = math.inf
    kept = torch.ones(10, dtype=torch.bool)
    kept[[1, 4, 7, 8]] = False
    out, scores = fltrust_aggregate(hostile, g0)
    assert torch.isfinite(out).all() and not scores[~kept].any()
    torch.testing.assert_close(out, fltrust_aggregate(rows[kept], g0)[0])


# -- FoolsGold on rows ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_foolsgold_weights_match_the_papers_algorithm(seed):
    g = torch.Generator().manual_seed(seed)
    histories = random_rows(seed, 8, 5)
    # near-copies (sybil-like) so that the similarities, pardoning and clipping all act
    histories[5] = histories[4] + 0.05 * torch.randn(5, generator=g, dtype=F64)
    histories[6] = histories[4] * 2.0 + 0.2 * torch.randn(5, generator=g, dtype=F64)
    kappa = [1.0, 0.5, 0.1][seed % 3]  # 0.1: the 0.99 cap shows through the clip
    weights = foolsgold_weights(histories, kappa)
    expected = reference_foolsgold_weights(histories.numpy(), kappa)
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-9, atol=1e-12)
    assert (expected < 1).any()
    # batched over leading dimensions
    batch = torch.stack([histories, histories.flip(0), histories * torch.tensor([1.0, -1.0, 1.0, 1.0, 2.0], dtype=F64)])
    batched = foolsgold_weights(batch, kappa)
    for k in range(3):
        torch.testing.assert_close(batched[k], foolsgold_weights(batch[k], kappa), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_foolsgold_aggregate_matches_the_reference_over_rounds(seed):
    n, d = 7, 4
    history = torch.zeros(n, d, dtype=F64)
    reference_history = np.zeros((n, d))
    for t in range(5):
        rows = random_rows(10 * seed + t, n, d)
        rows[5:] = rows[5] if t % 2 == 0 else rows[5] * 3.0  # two sybils, sometimes rescaled
        out, weights = foolsgold_aggregate(rows, history)
        expected, expected_weights = reference_foolsgold(rows.numpy(), reference_history)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(weights.numpy(), expected_weights, rtol=1e-10, atol=1e-12)
        history += rows
        reference_history += rows.numpy()


def test_foolsgold_weights_sybils_sending_one_update_to_zero():
    """By hand: 3 honest clients with orthogonal-ish, changing updates; 3 sybils send
    the same update every round.  Their histories are identical (cos 1, every pardon
    ratio 1), so alpha = 1 - 1 = 0 and the logit is -inf: weight 0.  The honest
    histories have max similarity < 1 to everyone, the least similar gets 0.99 and
    logit ln(99) + 0.5 > 1: weight 1."""
    d = 4
    history = torch.zeros(6, d, dtype=F64)
    sybil = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=F64)
    for t in range(4):
        honest = torch.eye(d, dtype=F64)[:3] + 0.1 * t * torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=F64)
        rows = torch.cat([honest, sybil.expand(3, d)])
        out, weights = foolsgold_aggregate(rows, history)
        history += rows
        assert torch.equal(weights[3:], torch.zeros(3, dtype=F64)), weights
        assert bool((weights[:3] > 0).all())
        torch.testing.assert_close(out, (weights[:3].unsqueeze(-1) * honest).sum(0) / weights[:3].sum())
    # a plain mean would be pulled to the sybils' update; FoolsGold's is the honest clients'
    assert float(out[3]) < 0.5


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_foolsgold_non_finite_and_overflowing_rows_are_absent(dtype):
    n, d = 8, 4
    history = random_rows(3, n, d).to(dtype)
    rows = random_rows(4, n, d).to(dtype)
    hostile = rows.clone()
    hostile[1], hostile[4, 2], hostile[6] = math.nan, math.inf, 1e38 if dtype == torch.float32 else 1e300
    kept = torch.ones(n, dtype=torch.bool)
    kept[[1, 4, 6]] = False
    out, weights = foolsgold_aggregate(hostile, history)
    assert torch.isfinite(out).all() and not weights[~kept].any()
    out_kept, weights_kept = foolsgold_aggregate(rows[kept], history[kept])
    torch.testing.assert_close(weights[kept], weights_kept)
    torch.testing.assert_close(out, out_kept)
    # every history inadmissible: zero update, no NaN
    out, weights = foolsgold_aggregate(torch.full((3, d), math.nan, dtype=dtype), torch.zeros(3, d, dtype=dtype))
    assert torch.equal(out, torch.zeros(d, dtype=dtype)) and not weights.any()


# -- the algorithms on a federation ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ConstantRows(AttackBase):
    """Every Byzantine row the same vector (sybils); probes the server's aggregate with
    the full delivered messages when ``probe``, and keeps what the probe said."""

    name: ClassVar[str] = "test_constant_rows"
    summary: ClassVar[str] = "one fixed row for every Byzantine client"
    row: tuple[float, ...] = (1.0, -2.0, 0.5, 3.0, 1.0)
    probe: bool = False
    seen: list = dataclasses.field(default_factory=list, compare=False)

    def rows(self, messages: torch.Tensor, context: AttackContext) -> torch.Tensor:
        shape = (*messages.shape[:-2], int(context.byzantine.sum()), messages.shape[-1])
        return torch.tensor(self.row, dtype=messages.dtype).expand(shape).clone()

    def __call__(self, messages: torch.Tensor, context: AttackContext) -> torch.Tensor:
        rows = self.rows(messages, context)
        if self.probe:
            full = messages.clone()
            full[..., context.byzantine, :] = rows
            probe = context.defense_state["aggregate"]
            probe(torch.stack([full, full * 2.0]))  # probing twice must change nothing
            self.seen.append(probe(full)[0].clone())
        return rows


@dataclasses.dataclass(frozen=True)
class FlippedMean(AttackBase):
    """Every Byzantine row ``-scale`` times the honest rows' mean."""

    name: ClassVar[str] = "test_flipped_mean"
    summary: ClassVar[str] = "minus a multiple of the honest mean"
    scale: float = 10.0

    def __call__(self, messages: torch.Tensor, context: AttackContext) -> torch.Tensor:
        mean = messages[..., ~context.byzantine, :].mean(-2, keepdim=True)
        return (-self.scale * mean).expand(*messages.shape[:-2], int(context.byzantine.sum()), -1).clone()


def linear_regression_gradient(model: np.ndarray, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Least squares 0.5 mean (a^T x - y)^2: mean a (a^T x - y)."""
    return inputs.T @ (inputs @ model - targets.reshape(-1)) / inputs.shape[0]


def test_fltrust_run_matches_the_reference_round_by_round():
    """Full batches (no batch stream): each round, g0 is the least-squares gradient on
    the root set at the shared model, the received rows are the honest gradients with
    the Byzantine rows (-10 x the honest mean), and the step is x -= lr * eq. 4."""
    attack = FlippedMean()
    fed = federation(seed=1, batch_size=None, attack=attack)
    lr = 0.05
    algo = FLTrust(fed, FLTrust.Params(lr=lr, root_samples=10))
    root_x, root_y = algo.root.inputs[0].numpy(), algo.root.targets[0].numpy()
    # the root set: 10 distinct samples of the honest clients
    honest_x = fed.train.inputs[fed.honest].reshape(-1, 5).numpy()
    matches = [np.flatnonzero((honest_x == row).all(axis=1)) for row in root_x]
    assert all(m.size == 1 for m in matches) and len({int(m[0]) for m in matches}) == 10
    model = fed.init_params(1)[0].numpy().copy()
    for t in range(6):
        record = algo.step(t)
        g0 = linear_regression_gradient(model, root_x, root_y)
        np.testing.assert_allclose(record.extras["server_update"].numpy(), g0, rtol=1e-10, atol=1e-12)
        received = record.gradients.numpy().copy()
        received[fed.byzantine.numpy()] = -10.0 * received[fed.honest.numpy()].mean(axis=0)
        update, scores = reference_fltrust(received, g0)
        np.testing.assert_allclose(record.extras["trust"].numpy(), scores, rtol=1e-10, atol=1e-12)
        model = model - lr * update
        np.testing.assert_allclose(algo.client_models()[0].numpy(), model, rtol=1e-10, atol=1e-12)
    assert not record.extras["trust"][fed.byzantine].any()  # they point away from g0


def test_foolsgold_run_matches_the_reference_and_silences_sybils():
    attack = ConstantRows()
    fed = federation(seed=2, batch_size=4, attack=attack, byzantine_total=3)
    lr = 0.02
    algo = FoolsGold(fed, FoolsGold.Params(lr=lr, confidence=1.0))
    model = fed.init_params(1)[0].numpy().copy()
    history = np.zeros((fed.clients, 5))
    for t in range(6):
        record = algo.step(t)
        received = record.gradients.numpy().copy()
        received[fed.byzantine.numpy()] = attack.row
        update, weights = reference_foolsgold(received, history)
        history += received
        np.testing.assert_allclose(record.extras["weights"].numpy(), weights, rtol=1e-9, atol=1e-12)
        model = model - lr * update
        np.testing.assert_allclose(algo.client_models()[0].numpy(), model, rtol=1e-9, atol=1e-12)
        assert not record.extras["weights"][fed.byzantine].any()  # identical sybils: weight 0
        assert bool((record.extras["weights"][fed.honest] > 0).any())
    np.testing.assert_allclose(algo.history.numpy(), history, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["fltrust", "foolsgold"])
def test_probing_the_aggregate_changes_nothing_and_tells_the_truth(name):
    """An adaptive attack's probe (``defense_state["aggregate"]``) of the delivered
    messages is the update the server then applies, and probing (even batched) leaves
    the run as it is: FoolsGold's history is committed only by the real round."""
    runs = []
    for probe in (False, True):
        attack = ConstantRows(probe=probe)
        fed = federation(seed=4, attack=attack)
        algo = defenses.build(name, fed, {"lr": 0.01})
        records = [algo.step(t) for t in range(4)]
        runs.append(algo.client_models().clone())
        if probe:
            assert len(attack.seen) == 4
            for seen, record in zip(attack.seen, records):
                assert torch.equal(seen, record.updates[0])
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("name", ["fltrust", "foolsgold"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e38])
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["float32", "float64"])
def test_hostile_rows_never_reach_the_shared_model(name, value, dtype):
    fed = federation(seed=0, attack=attacks.ConstantValue(value), dtype=dtype)
    algo = defenses.build(name, fed, {"lr": 0.01})
    clean = defenses.build(name, federation(seed=0, attack=None, byzantine_total=0, dtype=dtype), {"lr": 0.01})
    for t in range(5):
        record = algo.step(t)
        weights = record.extras["trust" if name == "fltrust" else "weights"]
        assert not weights[fed.byzantine].any()
        clean.step(t)
    assert torch.isfinite(algo.client_models()).all()
    # the shared model moves as far as a clean run's: nothing of 1e38 got through
    assert float(algo.client_models().abs().max()) < 10 * float(clean.client_models().abs().max()) + 1.0


@pytest.mark.parametrize("name, options", [("fltrust", {}), ("fltrust", {"root_samples": 8, "heavy_ball": 0.5}),
                                           ("foolsgold", {}), ("foolsgold", {"confidence": 0.5, "heavy_ball": 0.5})])
def test_check_algorithm_passes(name, options):
    defenses.check_algorithm(name, options)


@pytest.mark.parametrize("name, bad, field", [
    ("fltrust", {"root_samples": 0}, "root_samples"),
    ("fltrust", {"root_samples": 2.5}, "root_samples"),
    ("fltrust", {"root_samples": 37}, "root_samples"),  # 6 honest clients x 6 samples = 36
    ("foolsgold", {"confidence": 0.0}, "confidence"),
    ("foolsgold", {"confidence": -1.0}, "confidence"),
    ("foolsgold", {"confidence": math.inf}, "confidence"),
    ("fltrust", {"aggregator": "median"}, "aggregator"),
    ("foolsgold", {"lr": 0.0}, "lr"),
])
def test_bad_options_raise_naming_the_field(name, bad, field):
    with pytest.raises(ValueError, match=field):
        defenses.build(name, federation(), bad)


def test_root_set_defaults_to_the_papers_100_or_the_whole_honest_pool():
    small = FLTrust(federation(), FLTrust.Params())
    assert small.root.inputs.shape[:2] == (1, 36)
    big = FLTrust(federation(clients_per_cluster=10), FLTrust.Params())
    assert big.root.inputs.shape[:2] == (1, 100)
    assert torch.equal(FLTrust(federation(), FLTrust.Params(root_samples=36)).root.inputs, small.root.inputs)
    # the server's gradient is counted with the clients': one batch of 4 on top of N x 4
    fed = federation()
    FLTrust(fed, FLTrust.Params()).step(0)
    assert fed.sample_gradients == fed.clients * 4 + 4


# -- global's refactored step -----------------------------------------------------------------------
class FormerGlobal:
    """``global``'s step as it was before its server rule became overridable hooks."""

    def __init__(self, fed: Federation, lr: float, heavy_ball: float, aggregator) -> None:
        self.fed, self.aggregator = fed, make_aggregator(aggregator)
        self.model = fed.init_params(1)
        self.optimizer = HeavyBall(lr, heavy_ball, self.model)
        self.previous = None
        self._rng = fed.rng("global-aggregator")
        self._round = RoundBuffers()

    def _probe(self, messages):
        copy = torch.Generator(device=self._rng.device)
        copy.set_state(self._rng.get_state())
        return self.aggregator(messages, self.previous, copy).unsqueeze(-2)

    def step(self, round_index: int) -> torch.Tensor:
        fed = self.fed
        _, received = self._round.delivered_gradients(
            fed, self.model.expand(fed.clients, -1), fed.sample_batch(reuse=True), round_index,
            {"aggregate": self._probe})
        update = self.aggregator(received, self.previous, self._rng).unsqueeze(0)
        self.previous = update[0]
        self.optimizer.apply(self.model, update)
        return update


@pytest.mark.parametrize("aggregator", ["mean", "median", {"name": "centered_clipping"},
                                        {"name": "bucketing", "s": 2}])
@pytest.mark.parametrize("probe", [False, True])
def test_global_is_bit_identical_to_its_former_step(aggregator, probe):
    runs = []
    for build in (lambda fed: Global(fed, Global.Params(lr=0.01, heavy_ball=0.5, aggregator=aggregator)),
                  lambda fed: FormerGlobal(fed, 0.01, 0.5, aggregator)):
        attack = ConstantRows(probe=probe)
        algo = build(federation(seed=3, attack=attack))
        updates = [algo.step(t) for t in range(5)]
        runs.append((algo.model.clone(), [u.updates[0] if hasattr(u, "updates") else u[0] for u in updates],
                     list(attack.seen)))
    (model_a, updates_a, seen_a), (model_b, updates_b, seen_b) = runs
    assert torch.equal(model_a, model_b)
    assert all(torch.equal(a, b) for a, b in zip(updates_a, updates_b))
    assert len(seen_a) == len(seen_b) and all(torch.equal(a, b) for a, b in zip(seen_a, seen_b))
