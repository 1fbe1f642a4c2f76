"""Conformance suite that every registered defense must pass (cf. scikit-learn's
``check_estimator``).

Every test is parametrised over ``sorted(defenses.REGISTRY)``, so an algorithm added to
the registry is checked automatically; ``global`` is also run with every registered
robust aggregator (cases ``global:<aggregator>``, default options), so an aggregator
added to ``defenses.AGGREGATORS`` is checked inside a training run too.  The checks are the contract of
:class:`defenses.base.Algorithm` (in the spirit of scikit-learn's ``check_estimator``):

* shapes: ``client_models()`` is ``[N, d]`` in the federation's dtype; ``step(t)``
  returns a :class:`robust_pfl.RoundRecord` for round ``t`` with per-client tensors of
  the right shapes; algorithms that form clusters report an assignment;
* parameters are validated at construction, naming the bad field;
* seeded determinism: the same seed gives bit-identical models, another seed does not;
* no mutation of the federation's data, and records are snapshots;
* hostile Byzantine rows (NaN, +-Inf, 1e38, large gradients) never make an honest
  client's model non-finite, and never raise;
* honest-only invariant: without Byzantine clients the attack is never called and the
  run equals one without an attack.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

import attacks
import defenses
from robust_pfl.engine.data import ClientData
from robust_pfl.engine.objectives import logistic_regression
from defenses import AGGREGATORS, REGISTRY
from robust_pfl import Federation, RoundRecord
from robust_pfl.engine.tasks import SyntheticLinearRegression
from robust_pfl.engine.types import AttackBase, AttackContext

ALGORITHMS = sorted(REGISTRY)
# method case -> (registered algorithm, extra options); plain names map to themselves
# Bulyan's default f = 1 needs n >= 7, more than the federation without Byzantine clients has
SMALL_N_SPECS: dict[str, Any] = {"bulyan": {"name": "bulyan", "fraction": 0.125}}
AGGREGATED = {f"global:{a}": ("global", {"aggregator": SMALL_N_SPECS.get(a, a)}) for a in sorted(AGGREGATORS)
              if a != "mean"}
METHODS = ALGORITHMS + sorted(AGGREGATED)

CLUSTERS = 2
CLIENTS_PER_CLUSTER = 3
BYZANTINE = 2
DIM = 5
ROUNDS = 4


def needs_classes(method: str) -> bool:
    return getattr(REGISTRY[algorithm_of(method)], "requires_classification", False)


def as_classification(task, classes: int = 2):
    """The same inputs and clusters, labels ``y > 0`` (2 classes), logistic regression."""

    def labels(data):
        return ClientData(data.inputs, (data.targets > 0).long())

    return dataclasses.replace(
        task,
        objective=logistic_regression(DIM, classes),
        train=labels(task.train),
        validation=labels(task.validation),
        test=labels(task.test),
        optima=None,
        num_classes=classes,
    )


def make_task(
    seed: int, byzantine_total: int = BYZANTINE, dtype: torch.dtype = torch.float64, method: str | None = None
):
    """The regression task, or its classification twin for methods that need classes."""
    task = _make_task(seed, byzantine_total, dtype)
    return as_classification(task) if method is not None and needs_classes(method) else task


def _make_task(seed: int, byzantine_total: int = BYZANTINE, dtype: torch.dtype = torch.float64):
    return SyntheticLinearRegression(
        clusters=CLUSTERS,
        clients_per_cluster=CLIENTS_PER_CLUSTER,
        dim=DIM,
        samples_per_client=6,
        validation_samples=4,
        test_samples=4,
        scale=10.0,
    ).build(seed, byzantine_total=byzantine_total, dtype=dtype)


def make_federation(task, seed: int, attack=None) -> Federation:
    # batch_size < samples_per_client, so the batch stream is genuinely random
    return Federation(
        task.objective, task.train, task.cluster_ids, task.byzantine, seed, 4, attack, num_classes=task.num_classes
    )


def algorithm_of(method: str) -> str:
    """The registered algorithm of a method case (``global:median`` -> ``global``)."""
    return AGGREGATED.get(method, (method, {}))[0]


def build_method(method: str, fed: Federation, options: dict[str, Any]):
    return defenses.build(algorithm_of(method), fed, options)


def options_for(name: str, randomised: bool = False) -> dict[str, Any]:
    """Small learning rate; a permissive quantile radius where the algorithm has one.
    ``randomised`` also switches on the options that draw random numbers of their own
    (FC's random subgroups, random-client centre seeding), where they exist.  A
    ``global:<aggregator>`` case adds its aggregator."""
    fields = REGISTRY[algorithm_of(name)].Params.model_fields
    options: dict[str, Any] = {"lr": 1e-3, **AGGREGATED.get(name, (name, {}))[1]}
    if "radius" in fields:
        options["radius"] = {"policy": "quantile", "q": 0.5}
    if randomised:
        if "groups" in fields:
            options["groups"] = 2
        if "init" in fields:
            options["init"] = "random_clients"
    return options


def run(name: str, seed: int = 0, attack=None, byzantine_total: int = BYZANTINE,
        dtype: torch.dtype = torch.float64, rounds: int = ROUNDS, randomised: bool = False):
    task = make_task(seed, byzantine_total, dtype, method=name)
    fed = make_federation(task, seed, attack)
    algo = build_method(name, fed, options_for(name, randomised))
    records = [algo.step(t) for t in range(rounds)]
    return fed, algo, records


class SpyAttack(AttackBase):
    """Records every call; returns zeros of the required shape."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: torch.Tensor, context: AttackContext) -> torch.Tensor:
        self.calls += 1
        shape = (*messages.shape[:-2], int(context.byzantine.sum()), messages.shape[-1])
        return messages.new_zeros(shape)


def record_tensors(record: RoundRecord) -> dict[str, torch.Tensor]:
    fields = ("gradients", "momenta", "updates", "centres", "assignment", "cluster_updates")
    return {f: getattr(record, f) for f in fields if getattr(record, f) is not None}


# -- registry hygiene ---------------------------------------------------------------------
def test_registry_is_not_empty_and_keys_match_names():
    assert ALGORITHMS, "no algorithm registered"
    for name, cls in REGISTRY.items():
        assert cls.name == name
        assert isinstance(cls.summary, str) and cls.summary.strip()


# -- shapes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
def test_shapes_and_round_records(name):
    task = make_task(0, method=name)
    fed = make_federation(task, 0, attacks.LargeGradient())
    algo = build_method(name, fed, options_for(name))
    n, d = fed.clients, task.objective.dim
    assert n == CLUSTERS * CLIENTS_PER_CLUSTER + BYZANTINE

    models = algo.client_models()
    assert models.shape == (n, d)
    assert models.dtype == fed.dtype

    for t in (0, 1, 2):
        record = algo.step(t)
        assert isinstance(record, RoundRecord)
        assert record.round_index == t
        for field in ("gradients", "momenta", "updates"):
            value = getattr(record, field)
            if value is not None:
                assert value.shape == (n, d), field
        if record.assignment is not None:
            assert record.assignment.shape == (n,)
            assert not record.assignment.is_floating_point()
        if record.centres is not None:
            assert record.centres.dim() == 2 and record.centres.shape[1] == d
            if record.assignment is not None:
                assert int(record.assignment.max()) < record.centres.shape[0]
        if REGISTRY[algorithm_of(name)].forms_clusters:
            assert record.assignment is not None, "forms_clusters but no assignment reported"
        models = algo.client_models()
        assert models.shape == (n, d)
        assert models.dtype == fed.dtype


# -- construction-time validation ---------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("bad, field", [({"lr": 0.0}, "lr"), ({"lr": -1.0}, "lr"),
                                        ({"heavy_ball": 1.0}, "heavy_ball"),
                                        ({"no_such_option": 1}, "no_such_option")])
def test_bad_parameters_rejected_naming_the_field(name, bad, field):
    fed = make_federation(make_task(0, method=name), 0)
    with pytest.raises(ValueError) as info:
        build_method(name, fed, {**options_for(name), **bad})
    assert field in str(info.value)


# -- determinism ----------------------------------------------------------------------------
@pytest.mark.parametrize("randomised", [False, True], ids=["defaults", "randomised-options"])
@pytest.mark.parametrize("name", METHODS)
def test_same_seed_gives_bit_identical_runs(name, randomised):
    # the attack draws from its own seeded stream: it must be reproducible too
    _, first, records_a = run(name, seed=3, attack=attacks.LargeGradient(), randomised=randomised)
    _, second, records_b = run(name, seed=3, attack=attacks.LargeGradient(), randomised=randomised)
    assert torch.equal(first.client_models(), second.client_models())
    for ra, rb in zip(records_a, records_b):
        ta, tb = record_tensors(ra), record_tensors(rb)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), key


@pytest.mark.parametrize("name", METHODS)
def test_different_seed_gives_different_run(name):
    _, first, _ = run(name, seed=0)
    _, second, _ = run(name, seed=1)
    assert not torch.equal(first.client_models(), second.client_models())


# -- no mutation ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
def test_federation_data_not_mutated(name):
    task = make_task(0, method=name)
    before = {
        "train.inputs": task.train.inputs.clone(),
        "train.targets": task.train.targets.clone(),
        "cluster_ids": task.cluster_ids.clone(),
        "byzantine": task.byzantine.clone(),
    }
    fed = make_federation(task, 0, attacks.LargeGradient())
    algo = build_method(name, fed, options_for(name))
    for t in range(ROUNDS):
        algo.step(t)
    after = {
        "train.inputs": fed.train.inputs,
        "train.targets": fed.train.targets,
        "cluster_ids": fed.cluster_ids,
        "byzantine": fed.byzantine,
    }
    for key, value in before.items():
        assert torch.equal(after[key].cpu(), value), key
    assert torch.equal(task.train.inputs, before["train.inputs"])
    assert torch.equal(task.train.targets, before["train.targets"])


# Attacks that let engines skip the Byzantine senders' honest gradients: one reads
# nothing (and draws its rows in place), two read only the honest senders' rows.
SKIPPING_ATTACKS = {
    "large_gradient": lambda: attacks.LargeGradient(),
    "bit_flip_client": lambda: attacks.build("bit_flip", {"source": "client", "client": 1}),
    "bit_flip_mean": lambda: attacks.build("bit_flip", {"source": "mean"}),
}


@pytest.mark.parametrize("attack", sorted(SKIPPING_ATTACKS))
@pytest.mark.parametrize("name", METHODS)
def test_skipping_work_for_unread_byzantine_rows_changes_no_honest_model(name, attack, call_path_attack):
    """An attack that reads nothing, or only the honest senders' rows, lets engines
    skip the Byzantine senders' honest gradients (this task's Byzantine clients are one
    block); the honest models match the run that computes everything."""
    fed, skipped, _ = run(name, seed=3, attack=SKIPPING_ATTACKS[attack]())
    assert not fed.byzantine_rows_read
    _, computed, _ = run(name, seed=3, attack=call_path_attack(SKIPPING_ATTACKS[attack](), reads_messages=True))
    honest = ~fed.byzantine
    torch.testing.assert_close(
        skipped.client_models()[honest], computed.client_models()[honest], rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("name", METHODS)
def test_turning_record_snapshots_off_changes_no_result(name):
    """``snapshot_records = False`` (what the experiment runner sets) only lets records
    alias the algorithm's reused buffers (and leave out what is never materialised:
    MC's gradients, and the per-client updates of clustered systems, which are
    ``cluster_updates[assignment]`` or ``centres[assignment]``): models and every
    tensor a record still carries are bit-identical to the snapshotting run."""
    runs = []
    for snapshot in (True, False):
        task = make_task(0, method=name)
        fed = make_federation(task, 0, attacks.LargeGradient())
        algo = build_method(name, fed, options_for(name))
        algo.snapshot_records = snapshot
        seen = []
        for t in range(ROUNDS):
            seen.append({k: v.clone() for k, v in record_tensors(algo.step(t)).items()})
        runs.append((algo.client_models().clone(), seen))
    (models_on, records_on), (models_off, records_off) = runs
    assert torch.equal(models_on, models_off)
    for on, off in zip(records_on, records_off):
        assert set(off) <= set(on)
        if "updates" in on and "updates" not in off:  # the cluster's vector each client applied
            applied = off["cluster_updates"] if "cluster_updates" in off else off["centres"]
            assert torch.equal(on["updates"], applied[off["assignment"]])
        for key in off:
            assert torch.equal(on[key], off[key]), key


@pytest.mark.parametrize("name", METHODS)
def test_round_records_are_snapshots(name):
    """A record returned by step(t) is not changed by later rounds (theory checks and
    metrics collect records over time)."""
    task = make_task(0, method=name)
    fed = make_federation(task, 0, attacks.LargeGradient())
    algo = build_method(name, fed, options_for(name))
    first = algo.step(0)
    frozen = {k: v.clone() for k, v in record_tensors(first).items()}
    assert frozen, "step() reported no tensor at all"
    for t in range(1, ROUNDS):
        algo.step(t)
    for key, value in record_tensors(first).items():
        assert torch.equal(value, frozen[key]), f"record.{key} changed by later rounds"


# -- hostile Byzantine rows -----------------------------------------------------------------
HOSTILE = {
    "nan": lambda: attacks.ConstantValue(math.nan),
    "inf": lambda: attacks.ConstantValue(math.inf),
    "-inf": lambda: attacks.ConstantValue(-math.inf),
    "1e38": lambda: attacks.ConstantValue(1e38),
    "large_gradient": lambda: attacks.LargeGradient(),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
@pytest.mark.parametrize("name", METHODS)
def test_hostile_byzantine_rows_never_reach_honest_models(name, hostile, dtype):
    # 1e38 overflows squared norms and sums in float32: the interesting case
    fed, algo, records = run(name, seed=0, attack=HOSTILE[hostile](), dtype=dtype, rounds=6)
    honest_models = algo.client_models()[~fed.byzantine]
    assert honest_models.shape[0] == CLUSTERS * CLIENTS_PER_CLUSTER
    assert torch.isfinite(honest_models).all(), f"{name} under {hostile}: honest model not finite"
    for record in records:
        if record.gradients is not None:
            # honest vectors are recorded before the attack
            assert torch.isfinite(record.gradients[~fed.byzantine]).all()


# -- honest-only invariant ------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
def test_without_byzantine_clients_the_attack_is_never_called(name):
    spy = SpyAttack()
    fed_spy, with_spy, records_spy = run(name, seed=1, attack=spy, byzantine_total=0)
    assert not bool(fed_spy.byzantine.any())
    assert spy.calls == 0
    _, without, records_none = run(name, seed=1, attack=None, byzantine_total=0)
    assert torch.equal(with_spy.client_models(), without.client_models())
    for ra, rb in zip(records_spy, records_none):
        ta, tb = record_tensors(ra), record_tensors(rb)
        for key in ta:
            assert torch.equal(ta[key], tb[key]), key


def test_spy_attack_is_called_when_byzantine_clients_exist():
    """Guards the honest-only test against a vacuous spy: with Byzantine clients, an
    aggregating algorithm (FedAvg) does call the attack."""
    spy = SpyAttack()
    run("global", seed=1, attack=spy, byzantine_total=BYZANTINE, rounds=2)
    assert spy.calls == 2


# -- centre seeding ---------------------------------------------------------------------------
SEEDED_CENTRES = [name for name in ALGORITHMS if "init" in REGISTRY[name].Params.model_fields]


@pytest.mark.parametrize("init", ["kmeans++", "random_clients"])
@pytest.mark.parametrize("name", SEEDED_CENTRES)
def test_overflowing_byzantine_rows_never_become_centres(name, init):
    """threshold_clustering's robustness rule: a row whose squared norm overflows is
    inadmissible, "so no NaN, Inf or overflowing Byzantine row can reach a centre".  The
    centre seeding must respect it too (k-means++ documents that it never picks an
    inadmissible row); 1e38 rows in float32 are such rows."""
    assert SEEDED_CENTRES, "no algorithm with centre seeding registered"
    for seed in range(6):
        task = make_task(seed, dtype=torch.float32)
        fed = make_federation(task, seed, attacks.ConstantValue(1e38))
        algo = defenses.build(name, fed, {**options_for(name), "init": init})
        for t in range(5):
            record = algo.step(t)
            assert record.centres is not None
            squared = record.centres.pow(2).sum(-1)
            assert torch.isfinite(squared).all(), (
                f"{name} init={init} seed={seed} round={t}: a centre is an overflowing row"
            )
        # and the honest models stay at the scale of the task, far from 1e38 * lr
        assert float(algo.client_models()[~fed.byzantine].abs().max()) < 1e6


@pytest.mark.parametrize("name", ALGORITHMS)
def test_sends_momenta_is_declared_exactly_when_records_carry_momenta(name):
    """The ``[theory]`` table refuses ``momentum`` at load for an algorithm that does not
    declare ``sends_momenta``: the declaration must match the records."""
    _, _, records = run(name, rounds=2)
    assert all((record.momenta is not None) == REGISTRY[name].sends_momenta for record in records), name


# -- the public check (defenses.check_algorithm) -------------------------------------------------
@pytest.mark.parametrize("name", ALGORITHMS)
def test_check_algorithm_passes_every_registered_algorithm(name):
    defenses.check_algorithm(name)


class _NaiveMean(defenses.Algorithm):
    """FedAvg that averages whatever it receives: a NaN row reaches every model."""

    name = "naive_mean_test"
    summary = "plain mean of the received gradients"

    def __init__(self, federation, params) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).expand(federation.clients, -1).clone()

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        gradients = fed.gradients(self.models, fed.sample_batch())
        received = fed.deliver(gradients, round_index, "gradient")
        self.models -= self.params.lr * received.mean(0)
        return RoundRecord(round_index)

    def client_models(self) -> torch.Tensor:
        return self.models


def test_check_algorithm_names_a_broken_algorithm_of_ones_own():
    with pytest.raises(defenses.conformance.ConformanceError, match="honest model is not finite under nan"):
        defenses.check_algorithm(_NaiveMean)


class _Forgetful(_NaiveMean):
    """Its checkpoint leaves the models out and restores fresh ones."""

    name = "forgetful_test"

    def __getstate__(self):
        return {key: value for key, value in self.__dict__.items() if key != "models"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.models = self.federation.init_params(1).expand(self.federation.clients, -1).clone()

    def step(self, round_index: int) -> RoundRecord:  # robust enough to pass the hostile checks
        fed = self.federation
        gradients = fed.gradients(self.models, fed.sample_batch())
        received = fed.deliver(gradients, round_index, "gradient")
        self.models -= self.params.lr * torch.nan_to_num(received, 0.0, 0.0, 0.0).clamp(-1, 1).mean(0)
        return RoundRecord(round_index)


class _NodeAttacksOnly(_Forgetful):
    """Declares node-side Flower attacks on a method the Flower adapter does not wrap."""

    name = "node_attacks_only_test"
    flower_node_attacks = True


def test_check_algorithm_names_flower_node_attacks_without_flower():
    with pytest.raises(defenses.conformance.ConformanceError, match="flower_node_attacks without flower"):
        defenses.check_algorithm(_NodeAttacksOnly)


def test_check_algorithm_names_a_checkpoint_that_does_not_round_trip():
    with pytest.raises(defenses.conformance.ConformanceError, match="checkpoint does not round-trip"):
        defenses.check_algorithm(_Forgetful)


def test_an_algorithm_without_client_models_is_refused_where_it_is_registered():
    """``step`` and ``client_models`` are abstract: registering an algorithm that
    leaves one out fails at its definition, naming it."""

    class StepOnly(defenses.Algorithm):
        name, summary = "step_only_test", "no client_models"

        def step(self, round_index):
            return RoundRecord(round_index)

    with pytest.raises(TypeError, match="does not implement client_models"):
        defenses.register(StepOnly)
    assert "step_only_test" not in REGISTRY
