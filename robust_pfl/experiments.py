"""Composition root: turns a validated config into federations, algorithms and
results.  The only module (with :mod:`robust_pfl.cli` and the recipes) that knows the
core, ``attacks`` and ``defenses`` together."""

from __future__ import annotations

import functools
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from pydantic import ValidationError

import attacks
import defenses
from robust_pfl.config import (
    ConfigError,
    ExperimentConfig,
    ImageTaskConfig,
    MethodConfig,
    config_error,
    parse_config,
    validation_problems,
)
from robust_pfl.datasets import DatasetError, LabelledImages, load_dataset
from robust_pfl.federation import Federation
from robust_pfl.metrics import adjusted_rand_index
from robust_pfl.registry import did_you_mean
from robust_pfl.results import ResultTable, write_results
from robust_pfl.tasks import SyntheticLinearRegression, Task
from robust_pfl.types import RoundRecord

if TYPE_CHECKING:
    from theory_checks.tracking import TheoryTracker

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def validate(config: ExperimentConfig, source: str | None = None) -> ExperimentConfig:
    """Check method and attack names and options against the registries, and an image
    task's sizes against its data.

    Raises :class:`ConfigError` naming the field (``methods[1].radius`` ...) under
    ``invalid config <source>:``.
    """

    def fail(where: str, message: str) -> ConfigError:
        return config_error(source, [(where, message)])

    for index, method in enumerate(config.methods):
        where = f"methods[{index}]"
        if method.name not in defenses.REGISTRY:
            raise fail(
                f"{where}.name",
                f"unknown method {method.name!r}{did_you_mean(method.name, defenses.REGISTRY)}; "
                f"allowed: {sorted(defenses.REGISTRY)}",
            )
        params = defenses.REGISTRY[method.name].Params
        try:
            params(**method.options())
        except ValidationError as error:
            also = list(MethodConfig.model_fields)
            raise config_error(source, validation_problems(error, params, (where,), also)) from None
    if config.attack.name != "none":
        if config.attack.name not in attacks.REGISTRY:
            names = ["none", *sorted(attacks.REGISTRY)]
            raise fail(
                "attack.name",
                f"unknown attack {config.attack.name!r}{did_you_mean(config.attack.name, names)}; allowed: {names}",
            )
        try:
            attack = attacks.build(config.attack.name, config.attack.options())
        except ValueError as error:
            raise fail("attack", str(error)) from None
        if "data" in getattr(attack, "needs", ()) and not isinstance(config.task, ImageTaskConfig):
            raise fail(
                "attack.name",
                f"{config.attack.name!r} poisons labels and needs a classification task "
                f"(task.name = 'image'), not {config.task.name!r}",
            )
    _check_client_count(config, fail)
    labels = [m.display for m in config.methods]
    if len(set(labels)) != len(labels):
        raise fail("methods", f"labels must be unique, got {labels} (set 'label')")
    if isinstance(config.task, ImageTaskConfig):
        try:  # missing or corrupt data fails here, before any work
            data = _dataset(config.task.dataset, config.task.data_dir)
        except DatasetError as error:
            raise fail("task.data_dir", str(error)) from None
        try:  # so do sizes the data cannot give
            for seed in config.seeds:
                config.task.builder().check(seed, config.byzantine.placement(), data)
        except ValueError as error:
            raise fail("", f"task.{error}") from None
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise fail("device", f"{config.device!r} requested but CUDA is not available")
    return config


def client_count(config: ExperimentConfig) -> int:
    """N, honest plus Byzantine, that the config's task will have."""
    clusters, honest = config.task.clusters, config.task.clients_per_cluster
    byzantine = config.byzantine.placement().counts(clusters, honest)
    return clusters * honest + int(byzantine.sum())


def _check_client_count(config: ExperimentConfig, fail: Callable[[str, str], ConfigError]) -> None:
    """Methods whose options depend on N (e.g. ``krum`` needs n > 2f + 2) are checked
    against the config's client count now, not when the run reaches them."""
    n = client_count(config)
    for index, method in enumerate(config.methods):
        spec = method.options().get("aggregator")
        if method.name != "global" or spec is None:
            continue
        try:
            defenses.make_aggregator(spec).check(n)
        except ValueError as error:
            raise fail(f"methods[{index}].aggregator", f"{error} (the config has N = {n} clients)") from None


def build_task(config: ExperimentConfig, seed: int) -> Task:
    """The task of ``config`` for ``seed`` (image data sets are loaded once per
    process and shared by all seeds)."""
    placement = config.byzantine.placement()
    if isinstance(config.task, ImageTaskConfig):
        builder = config.task.builder()
        data = _dataset(builder.dataset, builder.data_dir)
        return builder.build(seed, placement=placement, dtype=DTYPES[config.dtype], data=data)
    spec = config.task.model_dump(exclude={"name"})
    return SyntheticLinearRegression(**spec).build(seed, dtype=DTYPES[config.dtype], placement=placement)


@functools.lru_cache(maxsize=2)
def _dataset(name: str, data_dir: str | None) -> LabelledImages:
    return load_dataset(name, data_dir)


def build_federation(task: Task, config: ExperimentConfig, seed: int) -> Federation:
    attack = None if config.attack.name == "none" else attacks.build(config.attack.name, config.attack.options())
    return Federation(
        objective=task.objective,
        train=task.train,
        cluster_ids=task.cluster_ids,
        byzantine=task.byzantine,
        seed=seed,
        batch_size=config.batch_size,
        attack=attack,
        device=torch.device(config.device),
        num_classes=task.num_classes,
    )


def honest_means(task: Task, algorithm: defenses.Algorithm, record: RoundRecord | None = None) -> dict[str, float]:
    """Honest-client averages of the task's per-client metrics for the algorithm's
    personalised models (or its own predictor, e.g. KNN-Per's mixture), the fraction
    of honest models that are not finite (must stay 0 under any attack), and for
    algorithms that form clusters the adjusted Rand index of the honest clients'
    assignment against the true clusters."""
    models = algorithm.client_models()
    honest = ~task.byzantine.to(models.device)
    per_client = task.evaluate(models, getattr(algorithm, "predict_log_proba", None))
    out = {name: float(values[honest].double().mean()) for name, values in per_client.items()}
    out["nonfinite_models"] = float((~torch.isfinite(models[honest]).all(-1)).double().mean())
    if record is not None and record.assignment is not None:
        truth = task.cluster_ids.to(models.device)[honest]
        out["ari"] = adjusted_rand_index(truth, record.assignment[honest])
    return out


def run_method(
    method: MethodConfig,
    config: ExperimentConfig,
    seed: int,
    on_round: Callable[[], None] | None = None,
    task: Task | None = None,
) -> ResultTable:
    """Train one method for ``config.rounds`` rounds; metrics every ``eval_every``."""
    task = task or build_task(config, seed)
    federation = build_federation(task, config, seed)
    algorithm = defenses.build(method.name, federation, method.options())
    algorithm.snapshot_records = False  # each record is read within its round only
    evaluation = task.to(federation.device)
    table = ResultTable()
    table.add(method.display, seed, 0, honest_means(evaluation, algorithm))
    tracker = theory_tracker(config, evaluation)
    if tracker is not None:
        table.add(method.display, seed, 0, tracker.measure(algorithm.client_models()))
    redeal = _epoch_redealer(config, task, seed)
    for round_index in range(config.rounds):
        if redeal is not None:
            redeal(federation, round_index)
        record = algorithm.step(round_index)
        if on_round is not None:
            on_round()
        done = round_index + 1
        if done % config.eval_every == 0 or done == config.rounds:
            table.add(method.display, seed, done, honest_means(evaluation, algorithm, record))
        if tracker is not None and tracker.due(done, config.rounds):
            table.add(method.display, seed, done, tracker.measure(algorithm.client_models(), record, federation.train))
    return table


def theory_tracker(config: ExperimentConfig, task: Task) -> TheoryTracker | None:
    """The ``[theory]`` table's tracker for ``task`` (``None`` without the table)."""
    if config.theory is None:
        return None
    from theory_checks.tracking import TheoryTracker  # only runs that ask for estimates load them

    theory = config.theory
    return TheoryTracker(
        task,
        theory.estimate,
        every=theory.every,
        batch_size=config.batch_size,
        power_iterations=theory.power_iterations,
        memory_budget_mb=theory.memory_budget_mb,
    )


def _epoch_redealer(
    config: ExperimentConfig, task: Task, seed: int
) -> Callable[[Federation, int], None] | None:
    """With ``task.reshuffle_every_epoch``: a hook that re-deals the train split at the
    start of every epoch after the first (an epoch = ``ceil(n / batch_size)`` rounds)."""
    if not (isinstance(config.task, ImageTaskConfig) and config.task.reshuffle_every_epoch):
        return None
    builder = config.task.builder()
    data = _dataset(builder.dataset, builder.data_dir)
    samples = task.train.samples_per_client
    per_epoch = math.ceil(samples / min(config.batch_size or samples, samples))

    def redeal(federation: Federation, round_index: int) -> None:
        if round_index > 0 and round_index % per_epoch == 0:
            federation.redeal(builder.reshuffle(task, round_index // per_epoch, seed, data))

    return redeal


def run_cell_config(payload: dict[str, Any], source: str, timed: bool = False) -> list[dict[str, Any]]:
    """Tidy rows ``(round, metric, value)`` of a grid cell's config (one method, one
    seed), validated first; ``timed`` adds its wall time as metric ``seconds``."""
    config = validate(parse_config(payload, source), source)
    start = time.perf_counter()
    table = run_method(config.methods[0], config, config.seeds[0])
    rows = [{k: v for k, v in row.items() if k not in ("method", "seed")} for row in table.rows]
    if timed:
        rows.append({"round": config.rounds, "metric": "seconds", "value": time.perf_counter() - start})
    return rows


def progress_bar(total: int, description: str, enabled: bool | None = None):
    """A tqdm bar on a terminal, silent otherwise."""
    from tqdm.auto import tqdm

    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, desc=description, disable=not enabled, leave=False)


def run_experiment(config: ExperimentConfig, out_dir: Path | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Run every method for every seed; write ``history.csv``/``summary.json``."""
    validate(config)
    torch.use_deterministic_algorithms(True, warn_only=True)
    table = ResultTable()
    total = config.rounds * len(config.methods) * len(config.seeds)
    with progress_bar(total, "robust-pfl run", progress) as bar:
        for seed in config.seeds:
            task = build_task(config, seed)
            for method in config.methods:
                bar.set_postfix_str(f"{method.display} seed={seed}")
                table.extend(run_method(method, config, seed, on_round=lambda: bar.update(1), task=task))
    extra = {"config": config.model_dump(mode="json")}
    if out_dir is not None:
        return write_results(table, Path(out_dir), extra)
    return {"final": table.final(), **extra}
