"""Public conformance checks for robust aggregators (:func:`check_aggregator`) and
algorithms (:func:`check_algorithm`): they run on a class of your own what the
project's suites run on every registered one.

A robust aggregator (a subclass of :class:`defenses.aggregators.Aggregator`,
registered with ``defenses.register_aggregator``) maps messages ``[..., N, d]`` (and
optionally the previous aggregate and a generator) to ``[..., d]`` and must:

* keep the messages' dtype, aggregate every leading block as it would alone, and be
  finite whatever up to ``f < N/2`` rows hold (NaN, Inf, 1e38, large gradients);
* give the same output for the same generator seed and write into no input;
* treat NaN, Inf and overflowing rows as absent, and return the previous aggregate
  (if finite) or zeros where no row is admissible.

An algorithm (a subclass of :class:`defenses.Algorithm`, registered with
``defenses.register``) must give ``[N, d]`` models and a record per round, the same
models for the same seed, leave the federation's data unwritten, keep every honest
model finite under such rows, and survive a checkpoint: pickled after some rounds and
restored, it continues bit for bit as the uninterrupted run does.  Its declared flags
are bools, and ``flower_node_attacks`` comes only with ``flower``.  What it passes to
``deliver`` as ``defense_state`` is what its ``published_state`` declares
(:mod:`robust_pfl.engine.defense_state`): the same keys at each kind of delivery, of
the declared shapes, ``None`` only where declared.

Each failed property raises :class:`ConformanceError` naming it (``defenses.ConformanceError``,
the class ``attacks.ConformanceError`` is too: :mod:`robust_pfl.engine.conformance`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

import torch
from torch import Tensor

from defenses.aggregators import Aggregator, make_aggregator
from robust_pfl.engine.conformance import ConformanceError
from robust_pfl.engine.defense_state import state_problems
from robust_pfl.engine.types import AttackBase, AttackContext, RoundRecord

F64 = torch.float64
HOSTILE_ROWS = ("nan", "inf", "-inf", "1e38", "large_gradient", "mixed")


def _require(condition: bool, aggregator: Aggregator, message: str) -> None:
    if not condition:
        raise ConformanceError(f"{type(aggregator).__name__}: {message}")


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def honest_cloud(seed: int, n: int, d: int, dtype: torch.dtype = F64) -> Tensor:
    """``n`` seeded rows around a random centre."""
    generator = _seeded(seed)
    centre = torch.randn(d, generator=generator, dtype=F64)
    return (centre + torch.randn(n, d, generator=generator, dtype=F64)).to(dtype)


def check_aggregator(aggregator: Aggregator | type[Aggregator] | str) -> None:
    """Check an aggregator (an instance, a class built with its defaults, or a
    registered name) against the contract of the module docstring.

    Raises:
        ConformanceError: the first property that fails, named.
    """
    agg = aggregator() if isinstance(aggregator, type) else make_aggregator(aggregator)
    check_shapes_and_batching(agg)
    check_determinism_and_no_mutation(agg)
    for hostile in HOSTILE_ROWS:
        for dtype in (torch.float32, F64):
            check_hostile_rows(agg, hostile, dtype)
    check_no_admissible_row(agg)
    check_inadmissible_rows_are_absent(agg)


def check_shapes_and_batching(agg: Aggregator) -> None:
    """``[N, d]``, ``[B, N, d]`` and ``[A, B, N, d]`` give ``[d]``, ``[B, d]``, ``[A, B,
    d]`` of the messages' dtype, finite, each block as it aggregates alone."""
    n, d = 9, 4
    for dtype in (torch.float32, F64):
        x = torch.randn(3, 2, n, d, generator=_seeded(1), dtype=dtype)
        x[0, 1, 2] = math.nan  # blocks with different admissible counts
        x[2, 0, :3] = 1e38 if dtype == torch.float32 else math.inf
        _require(agg(x[0, 0]).shape == (d,) and agg(x[0]).shape == (2, d), agg, "wrong output shape")
        out = agg(x)  # no generator: an order-dependent rule keeps the given order
        _require(out.shape == (3, 2, d) and out.dtype == dtype, agg, f"returned {out.dtype} {tuple(out.shape)}")
        _require(bool(torch.isfinite(out).all()), agg, "non-finite output with NaN / Inf / 1e38 rows")
        for i in range(3):
            for j in range(2):
                _require(torch.allclose(out[i, j], agg(x[i, j]), rtol=1e-5, atol=1e-6), agg,
                         "a batched block differs from the same block aggregated alone")


def check_determinism_and_no_mutation(agg: Aggregator) -> None:
    x = torch.randn(4, 9, 5, generator=_seeded(2), dtype=F64)
    x[1, 3] = math.inf
    previous = torch.randn(4, 5, generator=_seeded(3), dtype=F64)
    x_before, previous_before = x.clone(), previous.clone()
    first = agg(x, previous, _seeded(7))
    _require(torch.equal(first, agg(x, previous, _seeded(7))), agg, "the same seed gave another aggregate")
    _require(torch.equal(x, x_before) and torch.equal(previous, previous_before), agg,
             "wrote into the messages or the previous aggregate")


def check_hostile_rows(agg: Aggregator, hostile: str, dtype: torch.dtype) -> None:
    """``f = 4`` of 9 rows hostile (``hostile`` of :data:`HOSTILE_ROWS`): a finite
    aggregate, with and without a previous one."""
    n, d, f = 9, 6, 4
    x = honest_cloud(0, n, d, dtype)
    if hostile == "large_gradient":
        x[:f] = 1e6 + 200 * torch.randn(f, d, generator=_seeded(1), dtype=F64).to(dtype)
    elif hostile == "mixed":
        x[0], x[1], x[2], x[3] = math.nan, math.inf, -math.inf, 1e38
        x[3, 0] = -1e38
    else:
        x[:f] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "1e38": 1e38}[hostile]
    batched = torch.stack([x, x.flip(0)])
    for previous in (None, torch.ones(d, dtype=dtype)):
        _require(bool(torch.isfinite(agg(batched, previous, _seeded(0))).all()), agg,
                 f"non-finite aggregate with {f} of {n} rows {hostile} ({dtype})")


def check_no_admissible_row(agg: Aggregator) -> None:
    """No admissible row: the previous aggregate if it is finite, else zeros."""
    x = torch.full((2, 7, 3), math.nan, dtype=F64)
    x[1, :, 0] = math.inf
    _require(torch.equal(agg(x), torch.zeros(2, 3, dtype=F64)), agg, "no admissible row and no previous: not zeros")
    previous = torch.tensor([1.0, -2.0, 3.0], dtype=F64)
    _require(torch.equal(agg(x, previous, _seeded(0)), previous.expand(2, 3)), agg,
             "no admissible row: not the previous aggregate")
    _require(torch.equal(agg(x, torch.full((3,), math.nan, dtype=F64)), torch.zeros(2, 3, dtype=F64)), agg,
             "returned a non-finite previous aggregate")


def check_inadmissible_rows_are_absent(agg: Aggregator) -> None:
    """With the rows' order kept (no generator), NaN / Inf / overflowing rows change
    nothing: the aggregate of the admissible rows alone."""
    x = honest_cloud(4, 10, 3, torch.float32)
    x[1], x[4, 2], x[7] = math.nan, -math.inf, 1e38
    kept = torch.ones(10, dtype=torch.bool)
    kept[[1, 4, 7]] = False
    _require(torch.allclose(agg(x), agg(x[kept]), rtol=1.3e-6, atol=1e-5), agg,
             "an inadmissible row changed the aggregate")


# -- algorithms ----------------------------------------------------------------------------------
# A small federation: 2 clusters of 3 honest clients and 2 Byzantine ones, d = 5.
_CLUSTERS, _PER_CLUSTER, _BYZANTINE, _DIM = 2, 3, 2, 5


def _small_federation(cls: type, seed: int, attack, dtype: torch.dtype = F64):
    """The synthetic regression (or its two-class twin for an algorithm that needs
    classes) with the Byzantine clients, batches of 4 of 6 samples."""
    from robust_pfl.engine.data import ClientData
    from robust_pfl.engine.federation import Federation
    from robust_pfl.engine.objectives import logistic_regression
    from robust_pfl.engine.tasks import SyntheticLinearRegression

    task = SyntheticLinearRegression(clusters=_CLUSTERS, clients_per_cluster=_PER_CLUSTER, dim=_DIM,
                                     samples_per_client=6, validation_samples=4, test_samples=4,
                                     scale=10.0).build(seed, byzantine_total=_BYZANTINE, dtype=dtype)
    if cls.requires_classification:
        def labels(data):
            return ClientData(data.inputs, (data.targets > 0).long())

        task = dataclasses.replace(task, objective=logistic_regression(_DIM, 2), train=labels(task.train),
                                   validation=labels(task.validation), test=labels(task.test), optima=None,
                                   num_classes=2)
    return Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, 4, attack,
                      num_classes=task.num_classes)


def _options(cls: type, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A small learning rate and a permissive quantile radius where the algorithm has
    one, then ``options``."""
    fields = cls.Params.model_fields
    out: dict[str, Any] = {"lr": 1e-3}
    if "radius" in fields:
        out["radius"] = {"policy": "quantile", "q": 0.5}
    return {**out, **(options or {})}


def check_algorithm(algorithm: str | type, options: Mapping[str, Any] | None = None, rounds: int = 4) -> None:
    """Check an algorithm (a registered name, or a subclass of
    :class:`defenses.Algorithm`) on a small federation: the ``defense_state`` it
    publishes against its ``published_state``, shapes of its models and round
    records, seeded determinism, the federation's data untouched, and hostile Byzantine
    rows (NaN, Inf, 1e38, large gradients; float32 and float64) never reaching an
    honest client's model, and a checkpoint round trip.  ``options`` are passed to its
    ``Params``.

    Raises:
        ConformanceError: the first property that fails, named.
    """
    from defenses.base import REGISTRY

    cls = REGISTRY[algorithm] if isinstance(algorithm, str) else algorithm
    check_algorithm_declarations(cls)
    chosen = _options(cls, options)
    check_algorithm_published_state(cls, chosen)
    check_algorithm_shapes(cls, chosen, rounds)
    check_algorithm_determinism(cls, chosen, rounds)
    check_algorithm_checkpoint(cls, chosen, rounds)
    for name, attack in _hostile_attacks().items():
        for dtype in (torch.float32, F64):
            check_algorithm_hostile_rows(cls, chosen, name, attack, dtype, rounds)


def check_algorithm_declarations(cls: type) -> None:
    """Its declared flags (:class:`defenses.Algorithm`) are bools, and
    ``flower_node_attacks`` (a Byzantine node attacks its own reply under Flower) is
    declared only with ``flower`` (the Flower adapter wraps it)."""
    for flag in ("forms_clusters", "sends_momenta", "requires_classification", "flower", "flower_node_attacks"):
        value = getattr(cls, flag, None)
        if not isinstance(value, bool):
            raise ConformanceError(f"{cls.__name__}: {flag} must be a bool, got {value!r}")
    if cls.flower_node_attacks and not cls.flower:
        raise ConformanceError(f"{cls.__name__}: declares flower_node_attacks without flower "
                               "(node-side attacks only mean something where the Flower adapter wraps it)")


@dataclasses.dataclass(frozen=True)
class HostileRows(AttackBase):
    """Byzantine rows ``value + spread * N(0, 1)`` per coordinate (``spread = 0``: the
    constant ``value``, NaN and Inf included): the checks' own attack, so that
    ``defenses`` needs nothing from ``attacks``."""

    name: ClassVar[str] = "conformance_hostile_rows"
    summary: ClassVar[str] = "constant or large random rows"
    reads_messages: ClassVar[bool] = False
    value: float = 1e6
    spread: float = 0.0

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        shape = (*messages.shape[:-2], int(context.byzantine.sum()), messages.shape[-1])
        rows = torch.full(shape, self.value, dtype=messages.dtype, device=messages.device)
        if self.spread:
            noise = torch.randn(shape, generator=context.generator, dtype=F64, device=context.generator.device)
            rows = rows + self.spread * noise.to(device=messages.device, dtype=messages.dtype)
        return rows


@dataclasses.dataclass(frozen=True)
class StateRecorder(AttackBase):
    """Sends the Byzantine clients' honest rows and records, at every delivery, what
    in ``context.defense_state`` breaks the algorithm's ``published_state``."""

    name: ClassVar[str] = "conformance_state_recorder"
    summary: ClassVar[str] = "honest rows; records the published state"
    needs: ClassVar[frozenset[str]] = frozenset({"adaptive"})
    forges_losses: ClassVar[bool] = True  # loss reports carry state too
    declared: Any = None
    clients: int = 0
    dim: int = 0
    problems: list[str] = dataclasses.field(default_factory=list, compare=False, hash=False)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        self.problems.extend(state_problems(self.declared, context.kind, context.round_index, messages,
                                            context.defense_state, self.clients, self.dim, context.receivers,
                                            context.senders))
        return messages[..., context.byzantine, :].clone()


def _hostile_attacks() -> dict[str, HostileRows]:
    return {"nan": HostileRows(math.nan), "inf": HostileRows(math.inf), "-inf": HostileRows(-math.inf),
            "1e38": HostileRows(1e38), "large_gradient": HostileRows(1e6, 200.0)}


def _built(cls: type, options: dict[str, Any], seed: int, attack=None, dtype: torch.dtype = F64):
    federation = _small_federation(cls, seed, attack, dtype)
    return federation, cls(federation, cls.Params(**options))


def check_algorithm_published_state(cls: type, options: dict[str, Any], rounds: int = 2) -> None:
    """Over ``rounds`` rounds (round 0 included), every delivery's ``defense_state``
    holds the keys ``cls.published_state`` declares for its kind of message (none for a
    kind it declares nothing for), of the declared shapes and dtypes, ``None`` only
    where declared; probes, called on the delivered messages, return the declared
    shapes."""
    probe = _small_federation(cls, 0, None)
    recorder = StateRecorder(cls.published_state, probe.clients, probe.objective.dim)
    federation, algo = _built(cls, options, 0, recorder)
    for t in range(rounds):
        algo.step(t)
    _require(not recorder.problems, algo, f"its defense_state breaks its published_state "
             f"({cls.published_state.label}): {'; '.join(dict.fromkeys(recorder.problems))}")


def check_algorithm_shapes(cls: type, options: dict[str, Any], rounds: int = 4) -> None:
    """``client_models()`` is ``[N, d]`` in the federation's dtype; ``step(t)`` returns
    the round's record, per-client tensors ``[N, d]``, an integer ``[N]`` assignment
    (required when the algorithm ``forms_clusters``)."""
    federation, algo = _built(cls, options, 0, _hostile_attacks()["large_gradient"])
    n, d = federation.clients, federation.objective.dim
    for t in range(rounds):
        record = algo.step(t)
        _require(isinstance(record, RoundRecord) and record.round_index == t, algo,
                 f"step({t}) must return the RoundRecord of round {t}")
        for name in ("gradients", "momenta", "updates"):
            value = getattr(record, name)
            _require(value is None or tuple(value.shape) == (n, d), algo, f"record.{name} must be [N, d]")
        if record.assignment is not None:
            _require(tuple(record.assignment.shape) == (n,) and not record.assignment.is_floating_point(), algo,
                     "record.assignment must be an integer [N]")
        _require(not cls.forms_clusters or record.assignment is not None, algo,
                 "forms_clusters, but the record has no assignment")
        models = algo.client_models()
        _require(tuple(models.shape) == (n, d) and models.dtype == federation.dtype, algo,
                 "client_models() must be [N, d] in the federation's dtype")


def check_algorithm_determinism(cls: type, options: dict[str, Any], rounds: int = 4) -> None:
    """The same seed gives bit-identical models; the federation's data are not written."""
    runs = []
    for _ in range(2):
        federation, algo = _built(cls, options, 3, _hostile_attacks()["large_gradient"])
        before = federation.train.inputs.clone(), federation.train.targets.clone()
        for t in range(rounds):
            algo.step(t)
        _require(torch.equal(federation.train.inputs, before[0]) and torch.equal(federation.train.targets, before[1]),
                 algo, "wrote into the federation's data")
        runs.append(algo.client_models().clone())
    _require(torch.equal(runs[0], runs[1]), cls, "the same seed gave other models")


def check_algorithm_hostile_rows(cls: type, options: dict[str, Any], name: str, attack, dtype: torch.dtype,
                                 rounds: int = 4) -> None:
    """Byzantine rows of ``attack`` (named ``name``) leave every honest client's model
    finite, and raise nothing."""
    federation, algo = _built(cls, options, 0, attack, dtype)
    for t in range(rounds):
        algo.step(t)
    honest = algo.client_models()[~federation.byzantine]
    _require(bool(torch.isfinite(honest).all()), algo, f"an honest model is not finite under {name} rows ({dtype})")


def check_algorithm_checkpoint(cls: type, options: dict[str, Any], rounds: int = 4) -> None:
    """Saved after ``rounds // 2`` rounds as the engine saves it (a pickle naming the
    federation's data instead of storing them, with the global random states) and
    restored, the algorithm's remaining rounds give bit-identical models."""
    import tempfile
    from pathlib import Path

    from robust_pfl.engine.pickling import (
        global_random_state,
        load_checkpoint,
        restore_global_random_state,
        save_checkpoint,
        shared_objects,
    )

    federation, algo = _built(cls, options, 5, _hostile_attacks()["large_gradient"])
    half = rounds // 2
    for t in range(half):
        algo.step(t)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "conformance.ckpt"
        shared = shared_objects({"train": federation.train})
        save_checkpoint(path, half, "conformance", {"algorithm": algo, "random": global_random_state()}, shared)
        for t in range(half, rounds):
            algo.step(t)
        uninterrupted = algo.client_models().clone()
        _, state = load_checkpoint(path, "conformance", lambda done: shared)
    restore_global_random_state(state["random"])
    restored = state["algorithm"]
    _require(type(restored) is type(algo), algo, "the checkpoint restored another class")
    for t in range(half, rounds):
        restored.step(t)
    _require(torch.equal(restored.client_models(), uninterrupted), algo,
             "a checkpoint does not round-trip: the restored run's models differ from the uninterrupted run's")
