"""A run's cost estimated at config load, from its sizes alone, and the warning for a
run that would take more than a day.

The estimate counts floating-point operations: per round and method, every client's
gradients (``6 d`` per sample of a batch: a forward and a backward pass of a model of
``d`` parameters, ``d`` at least ``MIN_EFFECTIVE_DIM``), the aggregation's passes
over ``d``-vectors and a robust aggregator's own work (MDA's and SMEA's subset
searches; :meth:`defenses.Algorithm.round_work`, :meth:`defenses.Aggregator.flops`),
times rounds, seeds and methods.  It divides
them by an effective rate measured on Global (the mean) at N = 250 on the MNIST MLP
(benchmarks/README.md, "Seconds per step against each step's floor"): about 1e11
FLOP/s on the 2-core CPU those benchmarks name and 3e12 on an H200; every round of
every method adds at least ``ROUND_OVERHEAD_SECONDS``.  Evaluation,
checkpoints and attacks are left out, so the estimate is a lower bound up to the
rate; it is meant to catch configs that would run for days or centuries
(``rounds = 1e30``, ``clustering_rounds = 1e9``), not to time ordinary ones.  Its
ratios are what progress uses (:func:`round_seconds`): the ETA scales the elapsed time
by the estimated cost left over the cost done, so the rate cancels out.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING

from robust_pfl.config import ExperimentConfig

if TYPE_CHECKING:
    import defenses

#: Effective FLOP/s of a step, by device type (other types: the CPU's).
EFFECTIVE_FLOPS = {"cpu": 1e11, "cuda": 3e12}
#: Seconds a round of one method costs however small its sizes: Python and kernel
#: launches (2.9 ms measured for FC on the default synthetic task on the 2-core CPU).
ROUND_OVERHEAD_SECONDS = 1e-3
#: Seconds of each serial step within a round (:attr:`defenses.base.RoundWork.serial_steps`:
#: 130 us measured per Threshold-Clustering round of FC and MC on that task).
SERIAL_STEP_SECONDS = 1e-4
#: Vectors shorter than this cost about as much as vectors this long (per-row overheads):
#: FC on a synthetic task of d = 10 with N = 8,000 took 37 s a round on that CPU, the
#: count at this width.
MIN_EFFECTIVE_DIM = 1024
#: Runs estimated past this many seconds get a :class:`CostWarning`.
LONG_RUN_SECONDS = 86_400.0
_FLOPS_PER_SAMPLE_AND_PARAMETER = 6.0  # forward (2) and backward (4) multiply-adds


class CostWarning(UserWarning):
    """A config whose run is estimated to take longer than ``LONG_RUN_SECONDS``."""


def estimated_cost(config: ExperimentConfig, params: Iterable[defenses.AlgorithmParams], clients: int,
                   model_dim: int, samples_per_client: int) -> tuple[float, float]:
    """``(FLOPs, seconds)`` of the whole run: every seed, round and method (``params``,
    validated, in the config's order); the seconds at the device type's effective
    rate (:data:`EFFECTIVE_FLOPS`) plus every round's and serial step's overhead."""
    rounds = _round_costs(config, params, clients, model_dim, samples_per_client)
    runs = float(config.rounds) * len(config.seeds)
    flops = sum(flop for flop, _ in rounds)
    return flops * runs, sum(seconds for _, seconds in rounds) * runs


def round_seconds(config: ExperimentConfig, params: Iterable[defenses.AlgorithmParams], clients: int,
                  model_dim: int, samples_per_client: int) -> tuple[float, ...]:
    """Each method's estimated seconds a round (``params`` in the config's order), as
    :func:`estimated_cost` counts them: the weights of a run's progress ETA, whose
    methods cost very different amounts a round (FC's clustering against Local's
    step)."""
    return tuple(seconds for _, seconds in _round_costs(config, params, clients, model_dim, samples_per_client))


def _round_costs(config: ExperimentConfig, params: Iterable[defenses.AlgorithmParams], clients: int,
                 model_dim: int, samples_per_client: int) -> list[tuple[float, float]]:
    """``(FLOPs, seconds)`` of one round of each method."""
    import defenses  # here, not at the top: the CLI imports this module for CostWarning before torch

    batch = config.batch_size or samples_per_client
    width = max(model_dim, MIN_EFFECTIVE_DIM)
    rate = EFFECTIVE_FLOPS.get(config.device.split(":")[0], EFFECTIVE_FLOPS["cpu"])
    rounds = []
    for method, chosen in zip(config.methods, params):
        work = defenses.REGISTRY[method.name].round_work(chosen, clients, config.task.clusters, model_dim)
        gradients = clients * work.gradients_per_client * batch * _FLOPS_PER_SAMPLE_AND_PARAMETER * width
        flops = gradients + 2.0 * work.vector_passes * width + work.extra_flops
        rounds.append((flops, flops / rate + ROUND_OVERHEAD_SECONDS + work.serial_steps * SERIAL_STEP_SECONDS))
    return rounds


def readable_duration(seconds: float) -> str:
    """``seconds`` in the largest unit that keeps the number readable."""
    for unit, size in (("years", 365.25 * 86_400), ("days", 86_400.0), ("hours", 3_600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} seconds"


def warn_if_long(config: ExperimentConfig, params: Iterable[defenses.AlgorithmParams], clients: int,
                 model_dim: int, samples_per_client: int, source: str | None = None) -> float:
    """Warn (:class:`CostWarning`) when the run's estimate passes a day; return the
    estimate in seconds."""
    flops, seconds = estimated_cost(config, params, clients, model_dim, samples_per_client)
    if seconds > LONG_RUN_SECONDS:
        where = f"{source}: " if source else ""
        warnings.warn(
            f"{where}this run would take at least about {readable_duration(seconds)} on {config.device} "
            f"({flops:.3g} FLOPs: {config.rounds} rounds x {len(config.seeds)} seeds x {len(config.methods)} "
            f"methods, N = {clients} clients, d = {model_dim}, at an effective "
            f"{EFFECTIVE_FLOPS.get(config.device.split(':')[0], EFFECTIVE_FLOPS['cpu']):.0e} FLOP/s, "
            f"and {ROUND_OVERHEAD_SECONDS:g} s a round of each method); "
            "lower rounds, seeds, clustering_rounds or the task's size if that is not meant",
            CostWarning,
            stacklevel=3,
        )
    return seconds
