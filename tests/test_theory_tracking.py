"""The ``[theory]`` table: estimates of A, Delta, sigma, L, mu recorded along a run with
oracle clusters, from honest clients only; a bad table fails at config load."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from robust_pfl.config import ConfigError, MethodConfig, load_config, parse_config
from robust_pfl.engine.data import ClientData
from robust_pfl.experiments import build_task, run_method, validate
from robust_pfl.engine.tasks import Task
from theory_checks.estimators import gradient_noise, intra_cluster_ratio, separation
from theory_checks.tracking import TheoryTracker

pytestmark = pytest.mark.usefixtures("single_thread")

ALL = ["A", "Delta", "sigma", "L", "mu", "momentum"]
GRADIENTS = ["A", "Delta", "sigma", "L", "mu"]  # every estimate that any method allows
METHODS = {"fc": {"name": "fc", "lr": 1e-3}, "mc": {"name": "mc", "lr": 1e-3, "alpha": 0.5}}


def attacked_config(estimate=GRADIENTS, every=3, rounds=6, attack="large_gradient", methods=("fc", "mc"), **theory):
    """A small attacked run whose tracker measures every ``every`` rounds (no budget)
    unless ``theory`` says otherwise."""
    theory = {"budget": math.inf, **theory}
    return validate(parse_config({
        "seeds": [0],
        "rounds": rounds,
        "eval_every": rounds,
        "dtype": "float64",
        "batch_size": 4,
        "task": {"clusters": 2, "clients_per_cluster": 3, "noise": 1.0},
        "byzantine": {"total": 2},
        "attack": {"name": attack},
        "methods": [METHODS[name] for name in methods],
        "theory": {"estimate": estimate, "every": every, **theory},
    }))


@pytest.mark.parametrize("method", ["fc", "mc"])
def test_attacked_run_records_finite_honest_estimates(method):
    """Under the large-gradient attack (N(1e6, 200^2) rows) every recorded estimate is
    finite, at round 0, every ``every`` rounds and the last (MC also sends momenta)."""
    config = attacked_config(ALL if method == "mc" else GRADIENTS, methods=(method,))
    table = run_method(config.methods[0], config, 0)
    theory = [row for row in table.rows if row["metric"].startswith("theory_")]
    rounds = {row["round"] for row in theory}
    assert rounds == {0, 3, 6}
    names = {row["metric"] for row in theory}
    expected = {"theory_A2", "theory_Delta2", "theory_sigma2", "theory_sigma2_batch", "theory_L", "theory_mu"}
    assert expected <= names
    if method == "mc":  # MC sends momenta: Assumptions 8-9 recorded after round 0
        assert {"theory_momentum_Delta2", "theory_momentum_sigma2"} <= names
    assert all(math.isfinite(row["value"]) for row in theory), [r for r in theory if not math.isfinite(r["value"])]
    # the separated synthetic clusters: a positive gap, a smooth convex least-squares loss
    for row in theory:
        if row["metric"] in ("theory_Delta2", "theory_L", "theory_sigma2"):
            assert row["value"] > 0, row
        if row["metric"] == "theory_mu":
            assert row["value"] >= -1e-8, row


SYSTEMS = ["pdl_tc", "pfl_tc", "fedspd", "clove", "cfl", "cgpfl", "hypcluster"]


@pytest.mark.parametrize("name", SYSTEMS)
def test_the_theory_table_works_on_the_other_systems_unchanged(name):
    """The estimates come from federations and records only, so the clustered-PFL
    systems (graph systems included) record them like FC: finite under attack, at
    round 0, every ``every`` rounds and the last."""
    config = attacked_config(estimate=["A", "Delta", "sigma"])
    table = run_method(MethodConfig(name=name, lr=1e-3), config, 0)
    theory = [row for row in table.rows if row["metric"].startswith("theory_")]
    assert {row["round"] for row in theory} == {0, 3, 6}
    assert {"theory_A2", "theory_Delta2", "theory_sigma2"} <= {row["metric"] for row in theory}
    assert all(math.isfinite(row["value"]) for row in theory)


def _honest_only(task: Task) -> Task:
    keep = (~task.byzantine).nonzero().squeeze(-1)

    def pick(data: ClientData) -> ClientData:
        return ClientData(data.inputs[keep], data.targets[keep])

    return Task(task.objective, pick(task.train), pick(task.validation), pick(task.test),
                task.cluster_ids[keep], task.byzantine[keep], task.optima, task.num_classes)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), 1e38])
def test_byzantine_rows_never_reach_an_estimate(poison):
    """The tracker on a federation whose Byzantine clients hold poisoned data and
    poisoned models gives exactly what it gives on the honest clients alone."""
    config = attacked_config()
    task = build_task(config, 0)
    bad = task.byzantine
    poisoned = Task(task.objective,
                    ClientData(torch.where(bad.view(-1, 1, 1), poison, task.train.inputs),
                               torch.where(bad.view(-1, 1), poison, task.train.targets)),
                    task.validation, task.test, task.cluster_ids, task.byzantine, task.optima)
    generator = torch.Generator().manual_seed(1)
    models = torch.randn(bad.numel(), task.objective.dim, generator=generator, dtype=torch.float64)
    models[bad] = poison
    estimate = ["A", "Delta", "sigma", "L", "mu"]
    with_byzantine = TheoryTracker(poisoned, estimate, lanczos_steps=20).measure(models)
    honest = TheoryTracker(_honest_only(task), estimate, lanczos_steps=20).measure(models[~bad])
    assert with_byzantine.keys() == honest.keys()
    for name, value in honest.items():
        assert math.isfinite(value)
        assert with_byzantine[name] == pytest.approx(value, rel=1e-12), name


def test_tracker_agrees_with_the_estimators_called_directly():
    """A^2 and Delta^2 are the estimators' values over every honest model, sigma^2 the
    per-sample noise at each client's own model."""
    config = attacked_config(["A", "Delta", "sigma"])
    task = build_task(config, 0)
    honest = ~task.byzantine
    generator = torch.Generator().manual_seed(2)
    models = torch.randn(honest.numel(), task.objective.dim, generator=generator, dtype=torch.float64)
    # a budget of one model per chunk: the chunks' combination is checked too
    got = TheoryTracker(task, ["A", "Delta", "sigma"], memory_budget_mb=1).measure(models)
    data = task.train.select(honest.nonzero().squeeze(-1))
    gradients = task.objective.cross_gradients(models[honest], data)
    clusters = task.cluster_ids[honest]
    assert got["theory_A2"] == pytest.approx(intra_cluster_ratio(gradients, clusters).value, rel=1e-12)
    assert got["theory_Delta2"] == pytest.approx(separation(gradients, clusters).value, rel=1e-12)
    assert got["theory_sigma2"] == pytest.approx(gradient_noise(task.objective, models[honest], data).value, rel=1e-12)


def test_estimates_written_to_history(tmp_path):
    """``robust-pfl run`` with a ``[theory]`` table writes the estimates to history.csv."""
    import pandas as pd

    from robust_pfl.cli import main

    path = tmp_path / "run.toml"
    path.write_text(textwrap.dedent("""
        rounds = 4
        eval_every = 2
        dtype = "float64"
        [task]
        clusters = 2
        clients_per_cluster = 2
        [[methods]]
        name = "ground_truth"
        lr = 0.001
        [theory]
        estimate = ["A", "Delta"]
        every = 2
        budget = inf
    """))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    frame = pd.read_csv(tmp_path / "out" / "history.csv")
    theory = frame[frame["metric"].str.startswith("theory_")]
    assert sorted(theory["metric"].unique()) == ["theory_A2", "theory_Delta2"]
    assert sorted(theory["round"].unique()) == [0, 2, 4]


@pytest.mark.parametrize(
    "table, field, shown",
    [
        ('estimate = ["A", "sigmaa"]', "theory.estimate[1]", "'A', 'Delta', 'sigma', 'L', 'mu' or 'momentum'"),
        ("estimate = []", "theory.estimate", "must be a non-empty list"),
        ('estimate = ["A"]\nevery = 0', "theory.every", "must be an integer >= 1, got 0"),
        ('estimate = ["A"]\nevry = 5', "theory.evry", "did you mean 'every'"),
        ('estimate = ["A", "A"]', "theory.estimate", "distinct"),
        ('estimate = "A"', "theory.estimate", "list"),
    ],
)
def test_bad_theory_table_fails_at_load_naming_the_field(tmp_path, table, field, shown):
    path = tmp_path / "bad.toml"
    path.write_text('[[methods]]\nname = "fc"\n[theory]\n' + table + "\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert field in message and shown in message and str(path) in message


def test_separation_needs_two_clusters():
    with pytest.raises(ConfigError, match="theory.estimate: 'Delta' and 'momentum' compare clusters"):
        parse_config({"task": {"clusters": 1}, "methods": [{"name": "fc"}], "theory": {"estimate": ["Delta"]}})


def test_momentum_needs_two_clients_per_cluster():
    """Assumption 8's spread needs two momenta in a cluster: refused at load, not after
    the first round."""
    with pytest.raises(ConfigError, match="'momentum' measures the momenta's spread .*task.clients_per_cluster >= 2, got 1"):
        parse_config({"task": {"clients_per_cluster": 1}, "methods": [{"name": "mc"}],
                      "theory": {"estimate": ["momentum"]}})


# -- cost: draws, Lanczos, the budget --------------------------------------------------------


def test_draws_are_seeded_by_the_run_and_the_round():
    task = build_task(attacked_config(), 0)
    tracker = TheoryTracker(task, ["sigma"], clients=3, seed=5)
    honest = int((~task.byzantine).sum())
    first = tracker.drawn(10)
    assert first.numel() == 3 and torch.equal(first, first.sort().values) and int(first.max()) < honest
    assert torch.equal(first, TheoryTracker(task, ["sigma"], clients=3, seed=5).drawn(10))
    assert any(not torch.equal(first, tracker.drawn(r)) for r in range(11, 20))
    assert any(not torch.equal(first, TheoryTracker(task, ["sigma"], clients=3, seed=s).drawn(10)) for s in range(6, 12))
    assert torch.equal(TheoryTracker(task, ["sigma"], clients=None).drawn(3), torch.arange(honest))


def test_a_measurement_is_the_estimators_on_the_drawn_clients():
    config = attacked_config(["A", "Delta", "sigma"])
    task = build_task(config, 0)
    honest = (~task.byzantine).nonzero().squeeze(-1)
    models = torch.randn(task.byzantine.numel(), task.objective.dim, generator=torch.Generator().manual_seed(3),
                         dtype=torch.float64)
    tracker = TheoryTracker(task, ["A", "Delta", "sigma"], clients=2, seed=1)
    chosen = tracker.drawn(4)
    got = tracker.measure(models, round_index=4)
    data = task.train.select(honest)
    gradients = task.objective.cross_gradients(models[honest][chosen], data)
    clusters = task.cluster_ids[honest]
    assert got["theory_A2"] == pytest.approx(intra_cluster_ratio(gradients, clusters).value, rel=1e-12)
    assert got["theory_Delta2"] == pytest.approx(separation(gradients, clusters).value, rel=1e-12)
    own = models[honest][chosen]
    assert got["theory_sigma2"] == pytest.approx(gradient_noise(task.objective, own, data.select(chosen)).value,
                                                 rel=1e-12)


def test_lanczos_curvature_matches_the_dense_spectrum():
    """On the least-squares task (d = 10) ten Lanczos steps span the whole space: L and
    mu equal the dense Hessians' extreme eigenvalues."""
    from theory_checks.estimators import smoothness, strong_convexity

    task = build_task(attacked_config(), 0)
    models = torch.randn(task.byzantine.numel(), task.objective.dim, generator=torch.Generator().manual_seed(4),
                         dtype=torch.float64)
    for estimator in (smoothness, strong_convexity):
        lanczos = estimator(task.objective, models, task.train, method="lanczos", iterations=task.objective.dim)
        dense = estimator(task.objective, models, task.train, method="dense")
        assert lanczos.value == pytest.approx(dense.value, rel=1e-9)
        assert lanczos.details["converged"]


def test_cost_counts_per_sample_gradients():
    """Hand count: 6 honest clients of 9 samples, 2 drawn, 12 Lanczos steps."""
    task = build_task(attacked_config(), 0)
    assert int((~task.byzantine).sum()) == 6 and task.train.inputs.shape[1] == 9
    tracker = TheoryTracker(task, ["A", "Delta", "sigma", "L", "mu"], clients=2, lanczos_steps=12)
    assert tracker.cost() == 2 * 6 * 9 + 2 * 9 + 2 * 3 * 12 * 2 * 9
    assert TheoryTracker(task, ["momentum"]).cost() == 0


def test_the_budget_bounds_the_counted_work_of_the_measurements():
    """Every intermediate measurement keeps the measurements' counted work within the
    budget's share of the training's; round 0 and the last are always measured; a
    larger budget measures more often."""
    rounds = 60
    found = {}
    for budget in (0.2, 0.8, math.inf):
        config = attacked_config(["A", "sigma"], every=2, rounds=rounds, methods=("fc",), budget=budget, clients=2)
        table = run_method(config.methods[0], config, 0)
        found[budget] = sorted({row["round"] for row in table.rows if row["metric"] == "theory_A2"})
    config = attacked_config(["A", "sigma"], methods=("fc",))
    task = build_task(config, 0)
    cost = TheoryTracker(task, ["A", "sigma"], clients=2).cost()
    # FC computes the 6 honest senders' gradients (the attack overwrites the 2
    # Byzantine rows unread) at the 6 honest receivers' models, batch 4
    per_round = 6 * 6 * 4
    for budget in (0.2, 0.8):
        rounds_measured = found[budget]
        assert rounds_measured[0] == 0 and rounds_measured[-1] == rounds
        for count, done in enumerate(rounds_measured[1:-1], start=1):  # `count` measured before this one
            assert (count + 1) * cost <= budget * per_round * done
    assert found[math.inf] == list(range(0, rounds + 1, 2))
    assert len(found[0.2]) < len(found[0.8]) < len(found[math.inf])


def test_momentum_estimate_needs_a_method_that_sends_momenta():
    with pytest.raises(ConfigError, match=r"theory.estimate: 'momentum' reads the momenta .*methods\[0\] = 'fc' sends none"):
        attacked_config(ALL, methods=("fc", "mc"))
    assert attacked_config(ALL, methods=("mc",)).theory.estimate == ALL


def test_budget_must_be_positive():
    with pytest.raises(ConfigError, match="theory.budget"):
        parse_config({"methods": [{"name": "fc"}], "theory": {"estimate": ["A"], "budget": 0.0}})


def test_the_federation_counts_its_per_sample_gradients():
    """A model on one sample counts 1: N models on their own batch of b, M models on
    every one of N clients' batches, losses alike."""
    from robust_pfl.experiments import build_federation

    config = attacked_config()
    task = build_task(config, 0)
    federation = build_federation(task, config, 0)
    assert federation.sample_gradients == 0
    batch = federation.sample_batch()  # 8 clients, batch 4
    models = task.objective.init(8, torch.Generator().manual_seed(0), torch.float64)
    federation.gradients(models, batch)
    assert federation.sample_gradients == 8 * 4
    federation.cross_gradients(models[:3], batch)
    assert federation.sample_gradients == 8 * 4 + 3 * 8 * 4
    federation.cross_losses(models[:2], batch)
    assert federation.sample_gradients == 8 * 4 + 3 * 8 * 4 + 2 * 8 * 4
    out = torch.zeros_like(models)
    federation.gradients(models, batch, out=out, skip_unread=True)  # the 2 Byzantine rows are skipped
    assert federation.sample_gradients == 8 * 4 + 3 * 8 * 4 + 2 * 8 * 4 + 6 * 4
