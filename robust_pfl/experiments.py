"""Composition root: turns a validated config into federations, algorithms and
results.  The only module (with :mod:`robust_pfl.cli` and the recipes) that knows the
core, ``attacks`` and ``defenses`` together."""

from __future__ import annotations

import functools
import itertools
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
from pydantic import ValidationError

import attacks
import defenses
from defenses.ball_diagnostics import ball_metrics
from defenses.base import unknown_method
from robust_pfl import costs
from robust_pfl.checkpoint import checkpoint_name, fingerprint
from robust_pfl.engine.pickling import (
    CheckpointError,
    global_random_state,
    load_checkpoint,
    remove_checkpoint,
    restore_global_random_state,
    save_checkpoint,
    shared_objects,
)
from robust_pfl.config import (
    ExperimentConfig,
    ImageTaskConfig,
    MethodConfig,
    Problem,
    Skips,
    SyntheticTaskConfig,
    check_config,
    config_error,
    merged_problems,
    note_skip,
    read_config,
    skipped_checks,
    validation_problems,
)
from robust_pfl.engine.datasets import DatasetError, LabelledImages, load_dataset
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.metrics import adjusted_rand_index, attack_success_rate
from robust_pfl.engine.networks import make_network
from robust_pfl.provenance import provenance
from robust_pfl.engine.results import ResultTable, write_results
from robust_pfl.engine.devices import memory_budget_mb, resolve_device
from robust_pfl.engine.progress import progress_bar, verbose
from robust_pfl.engine.rounds import run_rounds
from robust_pfl.engine.seeding import deterministic_kernels_within
from robust_pfl.engine.tasks import ImageTask, SyntheticLinearRegression, Task
from robust_pfl.engine.tasks.images import RedealCache, TooManyByzantine
from robust_pfl.engine.tasks.transforms import normalization_stats
from robust_pfl.engine.data import Batch
from robust_pfl.engine.types import AttackBase, BackdoorAttack, RoundRecord

if TYPE_CHECKING:
    from theory_checks.tracking import TheoryTracker

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class Built:
    """What :func:`validate` builds from a config, once, and every run of the config
    reuses: the attack (``None`` for ``"none"``), each method's parameters (in config
    order), the device, the run's cost estimate in seconds and each method's estimated
    seconds a round (the weights of the progress ETA)."""

    attack: AttackBase | None
    params: tuple[defenses.AlgorithmParams, ...]
    device: torch.device
    seconds: float = 0.0  # the run's cost estimate (robust_pfl.costs), every seed and method
    round_seconds: tuple[float, ...] = ()  # per method, in config order (robust_pfl.costs.round_seconds)


def built(config: ExperimentConfig) -> Built:
    """``config``'s :class:`Built` parts: those :func:`validate` made, or, for a config
    that skipped validation, made by validating it now (and kept with it)."""
    if config._built is None:
        config._built = validate(config)._built
    return config._built


def method_params(config: ExperimentConfig, method: MethodConfig) -> defenses.AlgorithmParams:
    """The parameters of ``method``: as built at validation for one of the config's
    own methods, else (a recipe's candidate setting) built now."""
    if method in config.methods:
        return built(config).params[config.methods.index(method)]
    cls = defenses.REGISTRY[method.name]
    return cls.with_run_budgets(cls.Params(**method.options()), byzantine_count(config), client_count(config))[0]


def validate(config: ExperimentConfig, source: str | None = None) -> ExperimentConfig:
    """Check method and attack names and options against the registries, the checks
    across them (client counts, attacks a task or method cannot take, unique labels),
    an image task's sizes against its data, and the device against the machine.
    Returns the config with ``device = "auto"`` replaced by the device it picks.

    Raises :class:`ConfigError` naming every bad field (``methods[1].radius`` ...) under
    ``invalid config <source>:``, each once; a check that reads a part another check
    refused (a method's options, the attack) is skipped, the others all run.
    """
    checked, problems = _validated(config, source, frozenset())
    if problems:
        raise config_error(source, merged_problems(problems))
    return checked


def parse_and_validate(data: Mapping[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> ExperimentConfig:
    """A config mapping parsed (:func:`robust_pfl.config.check_config`: plug-ins, the
    schema's fields and cross-checks) and validated (:func:`validate`) with every
    stage's problems in one :class:`ConfigError`, each field named once: a bad task
    field, a bad attack option and a bad method option are reported together, not one
    per rerun.  A check reading a part an earlier stage refused is skipped (it would
    judge that part's default, not the file)."""
    checked = check_config(data, source, base_dir)
    skips = checked.skipped()
    config, later = (None, []) if checked.config is None else _validated(checked.config, source, checked.unchecked,
                                                                         skips)
    problems = merged_problems(*checked.stages, later)
    if problems or config is None:
        raise config_error(source, problems + skipped_checks(skips, problems))
    return config


def load_and_validate(path: str | Path, device: str | None = None) -> ExperimentConfig:
    """A TOML config file read (:func:`robust_pfl.config.read_config`; ``device``
    replaces its ``device``) and checked by :func:`parse_and_validate`, as ``robust-pfl
    run`` does."""
    path = Path(path)
    return parse_and_validate(read_config(path, device), str(path), base_dir=path.parent)


Add = Callable[[str, str], None]  # records a problem: (field path, message)


def _validated(config: ExperimentConfig, source: str | None, unchecked: frozenset[str],
               skips: Skips | None = None) -> tuple[ExperimentConfig, list[Problem]]:
    """:func:`validate`'s checks, every one run whose parts are valid: ``(config,
    problems)``.  ``unchecked`` names the parts an earlier stage refused (top-level
    keys, ``methods[i]``, ``plugins``): checks reading them are skipped, and each
    skipped check's field is added to ``skips`` with the parts it missed
    (:func:`robust_pfl.config.skipped_checks` words them).  Only a config with no
    problems and nothing unchecked comes back built, its device resolved."""
    problems: list[Problem] = []

    def add(where: str, message: str) -> None:
        problems.append((where, message))

    def skipped(*parts: str, judging: str | None = None) -> bool:
        """Whether one of ``parts`` was refused; if so, the check ``judging`` (a field,
        then what of it is checked where the field alone does not say) is recorded as
        skipped (a guard that is not a check, or a check with nothing to judge, names
        none)."""
        refused = [part for part in parts if part in unchecked or part.partition("[")[0] in unchecked]
        if refused and judging is not None:
            note_skip(skips, judging, [part.partition("[")[0] if part not in unchecked else part
                                       for part in refused])
        return bool(refused)

    chosen, shortfalls = _checked_methods(config, source, add, skipped)
    attack = None
    if not skipped("attack"):
        try:
            attack = attacks.build(config.attack.name, config.attack.options())
        except attacks.UnknownAttack as error:
            if not skipped("plugins", judging="attack.name"):  # else the failed plug-in may be what registers it
                add("attack.name", str(error))
        except ValueError as error:
            add("attack", str(error))
    # each guard names a skipped check only where it would have judged something: an
    # attack that reads the task, methods whose options passed, a synthetic task's size
    fits = None if attack is None else (
        "attack.name" if "data" in attack.needs else "attack (its forged losses)" if attack.forges_losses else None)
    if attack is not None and not skipped("task", judging=fits):
        _check_attack_fits(config, attack, chosen, add)
    if not skipped("task", "byzantine", judging="methods (their options against N)" if chosen else None):
        _check_client_count(config, chosen, add)
    synthetic = isinstance(config.task, SyntheticTaskConfig)
    if not skipped("task", "byzantine", "dtype", judging="task (its memory)" if synthetic else None):
        _check_size(config, add)
    if not skipped("theory") and config.theory is not None and "momentum" in config.theory.estimate:
        silent = [f"methods[{i}] = {config.methods[i].name!r}" for i in _named_methods(config, skipped)
                  if not defenses.REGISTRY[config.methods[i].name].sends_momenta]
        if silent:
            senders = sorted(name for name, cls in defenses.REGISTRY.items() if cls.sends_momenta)
            add("theory.estimate", f"'momentum' reads the momenta a method's clients send, and "
                f"{', '.join(silent)} sends none (methods that do: {senders})")
    labels = [m.display for i, m in enumerate(config.methods) if not skipped(f"methods[{i}]")]
    if len(set(labels)) != len(labels):
        add("methods", f"labels must be unique, got {labels} (set 'label')")
    sizes = None if skipped("task") else _model_size(  # an image task deals every seed's clients
        config, add, placement=not skipped(
            "seeds", "byzantine", judging=None if synthetic else "byzantine (its placement in each seed's deal)"))
    backdoor = isinstance(attack, BackdoorAttack)
    if attack is not None and not skipped("task", judging="attack (its target and trigger)" if backdoor else None):
        _check_backdoor(config, attack, add)
    device = config.device
    if not skipped("device"):
        try:  # "auto" becomes the device it picks, so a grid cell's key names the device it ran on
            device = str(resolve_device(config.device))
        except ValueError as error:
            add("device", str(error))
    if problems or unchecked or sizes is None:
        return config, problems
    for text in shortfalls:  # warned only for a config that runs
        warnings.warn(text, UserWarning, stacklevel=3)
    model_dim, samples = sizes
    config = config if device == config.device else config.model_copy(update={"device": device})
    params = tuple(chosen[i] for i in range(len(config.methods)))
    seconds = costs.warn_if_long(config, list(params), client_count(config), model_dim, samples, source)
    per_round = costs.round_seconds(config, list(params), client_count(config), model_dim, samples)
    config._built = Built(attack, params, torch.device(device), seconds, per_round)
    return config, problems


def _model_size(config: ExperimentConfig, add: Add, placement: bool = True) -> tuple[int, int] | None:
    """``(d, training samples per client)`` of the config's task, or None after a
    problem (given to ``add``).  An image task's data are loaded here, so missing or
    corrupt data and sizes the data cannot give fail now, before any work;
    ``placement``: check the Byzantine placement against the data for every seed (not
    where ``seeds`` or ``byzantine`` were refused)."""
    task = config.task
    if not isinstance(task, ImageTaskConfig):
        return task.dim, task.samples_per_client
    try:
        data = _dataset(task.dataset, task.data_dir)
    except DatasetError as error:
        add("task.data_dir", str(error))
        return None
    try:
        for seed in config.seeds if placement else ():
            _checked_deal(task, config.byzantine.placement(), seed, data)
    except TooManyByzantine as error:
        add("byzantine", str(error))
        return None
    except ValueError as error:
        add("", f"task.{error}")
        return None
    model_dim = make_network(task.model, data.image_shape, data.num_classes).dim
    return model_dim, task.train_per_client or max(1, data.train_images.shape[0] // client_count(config))


#: Outcomes of :func:`_checked_deal`, by the task, placement and seed written out: a
#: benchmark validates thousands of configs that differ only in method and attack.
_DEALS_CHECKED: dict[tuple[str, str, int, int], Exception | None] = {}  # (task, placement, seed, data)
_DEALS_KEPT = 4096


def _checked_deal(task: ImageTaskConfig, placement: Any, seed: int, data: Any) -> None:
    """``task.builder().check(seed, placement, data)``, its outcome remembered for the
    same task, placement, seed and data set (the check deals every client's indices)."""
    labels = (data.train_labels.numpy().tobytes(), data.test_labels.numpy().tobytes())
    key = (repr(task), repr(placement), seed, hash((tuple(data.train_images.shape), data.num_classes, labels)))
    if key not in _DEALS_CHECKED:
        if len(_DEALS_CHECKED) >= _DEALS_KEPT:
            _DEALS_CHECKED.clear()
        try:
            task.builder().check(seed, placement, data)
            _DEALS_CHECKED[key] = None
        except (TooManyByzantine, ValueError) as error:
            _DEALS_CHECKED[key] = error
    error = _DEALS_CHECKED[key]
    if error is not None:
        raise error.with_traceback(None)


def client_count(config: ExperimentConfig) -> int:
    """N, honest plus Byzantine, that the config's task will have."""
    return config.task.clusters * config.task.clients_per_cluster + byzantine_count(config)


def byzantine_count(config: ExperimentConfig) -> int:
    """How many Byzantine clients the config's task will have."""
    return config.byzantine.placement().total_count(config.task.clusters, config.task.clients_per_cluster)


def _with_run_budgets(config: ExperimentConfig, cls: type[defenses.Algorithm], params: defenses.AlgorithmParams,
                      where: str, source: str | None) -> tuple[defenses.AlgorithmParams, list[str]]:
    """``params`` with unset Byzantine budgets set to the run's Byzantine count
    (:meth:`defenses.Algorithm.with_run_budgets`), and a warning naming its field for
    each budget given below the count (kept; warned by :func:`validate` once the whole
    config is valid)."""
    params, shortfalls = cls.with_run_budgets(params, byzantine_count(config), client_count(config))
    return params, [f"{source or 'config'}: {where}.{field}: {message}" for field, message in shortfalls]


def _checked_methods(config: ExperimentConfig, source: str | None, add: Add,
                     skipped: Callable[..., bool]) -> tuple[dict[int, defenses.AlgorithmParams], list[str]]:
    """Each method's parameters, built and checked (its name, its options against its
    class, a classification task where it needs one, a learning rate the dtype holds),
    by index for the methods that pass, and the budget warnings
    (:func:`_with_run_budgets`); every problem of every method given to ``add``.
    ``skipped(*parts)``: whether an earlier stage refused one of ``parts``."""
    chosen: dict[int, defenses.AlgorithmParams] = {}
    shortfalls: list[str] = []
    for index, method in enumerate(config.methods):
        where = f"methods[{index}]"
        if skipped(where):
            continue
        if method.name not in defenses.REGISTRY:
            if not skipped("plugins", judging=f"{where}.name"):  # else the failed plug-in may be what registers it
                add(f"{where}.name", unknown_method(method.name))
            continue
        cls = defenses.REGISTRY[method.name]
        try:
            params = cls.Params(**method.options())
        except ValidationError as error:
            for problem in validation_problems(error, cls.Params, (where,), list(MethodConfig.model_fields)):
                add(*problem)
            continue
        if cls.requires_classification and not skipped("task", judging=f"{where}.name") and not isinstance(
                config.task, ImageTaskConfig):
            add(f"{where}.name", f"{method.name!r} needs a classification task (task.name = 'image'), "
                f"not {config.task.name!r}")
            continue
        if not skipped("task", "byzantine"):
            params, short = _with_run_budgets(config, cls, params, where, source)
            shortfalls += short
        largest = torch.finfo(DTYPES[config.dtype]).max
        # not named when skipped: only an lr above float16's 65504 could fail it, on every method
        if not skipped("dtype") and params.lr > largest:  # the optimiser's step could not hold it
            add(f"{where}.lr", f"must be a number {config.dtype} holds (<= {largest:.3g}), got {params.lr!r}")
            continue
        chosen[index] = params
    return chosen, shortfalls


def _named_methods(config: ExperimentConfig, skipped: Callable[..., bool]) -> list[int]:
    """The indices of the methods whose name is registered and not refused."""
    return [index for index, method in enumerate(config.methods)
            if not skipped(f"methods[{index}]") and method.name in defenses.REGISTRY]


def _check_attack_fits(config: ExperimentConfig, attack: AttackBase,
                       chosen: Mapping[int, defenses.AlgorithmParams], add: Add) -> None:
    """An attack that poisons labels needs a classification task, and one that forges
    reported losses must be able to for every checked method (``chosen``)."""
    if "data" in attack.needs and not isinstance(config.task, ImageTaskConfig):
        add("attack.name", f"{config.attack.name!r} poisons labels and needs a classification task "
            f"(task.name = 'image'), not {config.task.name!r}")
    if not attack.forges_losses:
        return
    for index, params in chosen.items():
        name = config.methods[index].name
        models = defenses.REGISTRY[name].reported_loss_models(params, config.task.clusters)
        try:
            if models is not None:
                attack.check_reported_models(models)
        except ValueError as error:
            add("attack", f"{error} (methods[{index}] = {name!r})")


def _check_size(config: ExperimentConfig, add: Add) -> None:
    """A synthetic task whose clients' models, optimiser buffers and data could not fit
    in this machine's memory is refused now, not by the allocator after loading: at
    least ``N * (8 d + samples * (d + 1))`` numbers (models, gradients, deliveries,
    momenta and their scratch copies; every client's samples)."""
    task = config.task
    if not isinstance(task, SyntheticTaskConfig):
        return  # an image task's sizes are bounded by its data, checked against them
    samples = task.samples_per_client + task.validation_samples + task.test_samples
    numbers = client_count(config) * (8 * task.dim + samples * (task.dim + 1))
    needed = numbers * torch.finfo(DTYPES[config.dtype]).bits // 8
    memory = _physical_memory()
    if memory is not None and needed > memory:
        add("task", f"N = {client_count(config)} clients of dimension dim = {task.dim} need at least "
            f"{needed / 2**30:.3g} GiB, more than this machine's {memory / 2**30:.3g} GiB; lower "
            "task.clients_per_cluster, task.clusters or task.dim")


def _physical_memory() -> int | None:
    """This machine's physical memory in bytes, where the OS says."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _check_client_count(config: ExperimentConfig, chosen: Mapping[int, defenses.AlgorithmParams], add: Add) -> None:
    """Methods whose options depend on N (e.g. ``krum`` needs n > 2f + 2) are checked
    against the config's client count now, not when the run reaches them (the methods
    in ``chosen``, those whose own options passed)."""
    n = client_count(config)
    for index, params in chosen.items():
        for field, message in defenses.REGISTRY[config.methods[index].name].client_count_problems(params, n):
            add(f"methods[{index}].{field}", f"{message} (the config has N = {n} clients)")


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
    parts = built(config)
    attack = parts.attack
    return Federation(
        objective=task.objective,
        train=task.train,
        cluster_ids=task.cluster_ids,
        byzantine=task.byzantine,
        seed=seed,
        batch_size=config.batch_size,
        attack=attack,
        device=parts.device,
        num_classes=task.num_classes,
        pixel_stats=_pixel_stats(config, attack),
    )


# -- backdoor attacks (attacks.backdoor): the trigger's normalisation and the ASR ------------
def _pixel_stats(config: ExperimentConfig, attack: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(mean, std)`` of an image task's normalisation when the attack stamps a
    pixel-space trigger (a backdoor, with ``stamp_trigger``); else ``None``."""
    if not isinstance(attack, BackdoorAttack) or not isinstance(config.task, ImageTaskConfig):
        return None
    builder = config.task.builder()
    return _normalization(builder.dataset, builder.data_dir, builder.normalization)


@functools.lru_cache(maxsize=4)
def _normalization(dataset: str, data_dir: str | None, normalization: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The data set's normalisation statistics, computed once per process (a
    ``per_channel`` CIFAR pass reads every training image), as :func:`_dataset` loads
    the data once."""
    return normalization_stats(normalization, _dataset(dataset, data_dir).train_images)


def _check_backdoor(config: ExperimentConfig, attack: Any, add: Add) -> None:
    """A backdoor's ``target`` must be a class of the data set and its trigger must fit
    in the images (checked at load, not when the federation is built)."""
    if not isinstance(attack, BackdoorAttack) or not isinstance(config.task, ImageTaskConfig):
        return
    try:
        data = _dataset(config.task.dataset, config.task.data_dir)
    except DatasetError:
        return  # reported at task.data_dir (_model_size); no data, nothing to check against
    try:
        attack.check_target(data.num_classes)
        attack.part_masks(*data.image_shape[-2:])
    except ValueError as error:
        add("attack", str(error))


def backdoor_success(task: Task, algorithm: defenses.Algorithm, models: torch.Tensor) -> dict[str, float]:
    """``{"attack_success_rate": ...}`` when the run's attack is a backdoor: the
    honest clients' mean of :func:`~robust_pfl.engine.metrics.attack_success_rate` on their
    test images with the full trigger stamped (clients without a non-target test
    image are left out); ``{}`` for any other attack."""
    federation = algorithm.federation
    attack = federation.attack
    if not isinstance(attack, BackdoorAttack) or task.num_classes is None:
        return {}
    attack.check_target(task.num_classes)
    inputs = attack.stamp_trigger(task.test.inputs, federation.pixel_stats)
    log_probs = task.log_probs(models, Batch(inputs, task.test.targets), algorithm.predict_log_proba)
    rates = attack_success_rate(log_probs, task.test.targets, attack.target)
    honest = ~task.byzantine.to(rates.device)
    return {"attack_success_rate": float(rates[honest].double().nanmean())}


def honest_means(task: Task, algorithm: defenses.Algorithm, record: RoundRecord | None = None) -> dict[str, float]:
    """Honest-client averages of the task's per-client metrics for the algorithm's
    personalised models (or its own predictor, e.g. KNN-Per's mixture), the fraction
    of honest models that are not finite (must stay 0 under any attack), and for
    algorithms that form clusters the adjusted Rand index of the honest clients'
    assignment against the true clusters (and, for those with a re-seed rule,
    ``reseeds``: how many rounds re-seeded the centres so far); under a backdoor attack also its
    ``attack_success_rate`` (:func:`backdoor_success`).  A classification task also
    gets ``worst_cluster_test_accuracy``: the lowest of the true clusters' honest
    mean test accuracies (a defense that sacrifices one cluster shows it there)."""
    models = algorithm.client_models()
    honest = ~task.byzantine.to(models.device)
    per_client = task.evaluate(models, algorithm.predict_log_proba)
    # the honest rows found once, every mean taken on the device and read back in one
    # transfer: on a GPU each host read waits for the device (issue 45)
    rows = honest.nonzero().squeeze(-1)
    means = [values.index_select(0, rows).double().mean() for values in per_client.values()]
    means.append((~torch.isfinite(models.index_select(0, rows)).all(-1)).double().mean())
    out = dict(zip([*per_client, "nonfinite_models"], torch.stack(means).tolist()))
    if "test_accuracy" in per_client:
        out["worst_cluster_test_accuracy"] = worst_cluster_mean(per_client["test_accuracy"], task.cluster_ids, honest)
    out.update(backdoor_success(task, algorithm, models))
    if record is not None and record.assignment is not None:
        truth = task.cluster_ids.to(models.device)[honest]
        out["ari"] = adjusted_rand_index(truth, record.assignment[honest])
    if record is not None and record.reseeds is not None:
        out["reseeds"] = float(record.reseeds)
    if record is not None and record.extras.get("balls") is not None:
        out.update(ball_metrics(record.extras["balls"]))
    return out


def worst_cluster_mean(values: torch.Tensor, cluster_ids: torch.Tensor, honest: torch.Tensor) -> float:
    """The lowest per-cluster mean of ``values[N]`` over the honest clients of each
    true cluster (clusters without an honest client left out)."""
    ids = cluster_ids.to(values.device)[honest]
    kept = values[honest].double()
    sums = torch.zeros(int(cluster_ids.max()) + 1, dtype=torch.float64, device=values.device).index_add_(0, ids, kept)
    counts = torch.bincount(ids, minlength=sums.shape[0]).to(torch.float64)
    return float((sums / counts)[counts > 0].min())


def measured(table: ResultTable) -> int:
    """How many ``[theory]`` measurements ``table`` holds (rounds with estimates): a
    resumed run counts them from its rows."""
    return len({row["round"] for row in table.rows if str(row["metric"]).startswith("theory_")})


def run_method(
    method: MethodConfig,
    config: ExperimentConfig,
    seed: int,
    on_round: Callable[[], None] | None = None,
    task: Task | None = None,
    checkpoint: Path | None = None,
    report: Callable[[str], None] | None = None,
    finished: Callable[[defenses.Algorithm], None] | None = None,
) -> ResultTable:
    """Train one method for ``config.rounds`` rounds; metrics every ``eval_every``;
    ``finished`` receives the trained algorithm (its client models) at the end.

    With ``checkpoint`` and ``config.checkpoint_every``: resume from the checkpoint
    file if it exists (it must come from this config, method and seed, else
    :class:`~robust_pfl.engine.pickling.CheckpointError`), save the run's full state there
    atomically every ``checkpoint_every`` rounds and after the last, and give the
    same rows and models as a run without interruption (see :mod:`robust_pfl.engine.pickling`).
    A finished checkpoint returns its rows without stepping.  ``report`` receives a
    line when the run resumes and at every checkpoint it saves."""
    parts = RunParts.build(config, seed, task)
    every = config.checkpoint_every if checkpoint is not None else None
    key = fingerprint(config, method, seed) if every is not None else ""
    if every is not None and Path(checkpoint).exists():
        saved = parts.restore(Path(checkpoint), key)
        params = method_params(config, method)
        _check_saved_params(saved, params, Path(checkpoint))
        # equal to the checkpoint's, with any field added since at its default: the
        # complete object, so the resumed algorithm reads every field it declares
        saved.algorithm.params = params
        _check_saved_attack(saved, built(config).attack, Path(checkpoint))
        restore_global_random_state(saved.random_state)
        done, algorithm, table = saved.done, saved.algorithm, saved.table
        if report is not None:
            report(f"resumed at round {done} of {config.rounds}")
    else:
        algorithm = defenses.build(method.name, parts.federation, params=method_params(config, method))
        done, table = 0, ResultTable()
        algorithm.snapshot_records = False  # each record is read within its round only
        table.add(method.display, seed, 0, honest_means(parts.evaluation, algorithm))
        if parts.tracker is not None:
            table.add(method.display, seed, 0, parts.tracker.measure(algorithm.client_models(), round_index=0))
    federation, tracker = algorithm.federation, parts.tracker
    measurements = measured(table)

    def before(round_index: int) -> None:
        if parts.redealer is not None:
            parts.redealer.before_round(federation, round_index)

    def after(done: int, record: RoundRecord) -> None:
        nonlocal measurements
        if on_round is not None:
            on_round()
        if done % config.eval_every == 0 or done == config.rounds:
            table.add(method.display, seed, done, honest_means(parts.evaluation, algorithm, record))
        if tracker is not None and tracker.due(done, config.rounds, federation.sample_gradients, measurements):
            table.add(method.display, seed, done,
                      tracker.measure(algorithm.client_models(), record, federation.train, round_index=done))
            measurements += 1
        if every is not None and (done % every == 0 or done == config.rounds):
            state = {"algorithm": algorithm, "rows": table.rows, "random": global_random_state()}
            save_checkpoint(Path(checkpoint), done, key, state, parts.shared(federation))
            if report is not None:
                report(f"round {done} of {config.rounds} checkpointed")

    run_rounds(algorithm, config.rounds, start=done, before=before, after=after)
    if finished is not None:
        finished(algorithm)
    return table


@dataclass(frozen=True)
class SavedRun:
    """What a checkpoint restores: rounds done, the algorithm (with its federation),
    the rows so far, and the process's global random states at that point."""

    done: int
    algorithm: defenses.Algorithm
    table: ResultTable
    random_state: dict[str, Any]


@dataclass
class RunParts:
    """What a run of ``config`` for ``seed`` builds before its algorithm: the task, a
    federation, the task on the run's device, the theory tracker and the epoch
    re-dealer.  Rebuilt alike by every process, so a checkpoint refers to them by
    name (:meth:`shared`) instead of storing them."""

    task: Task
    federation: Federation
    evaluation: Task
    tracker: TheoryTracker | None
    redealer: EpochRedealer | None

    @classmethod
    def build(cls, config: ExperimentConfig, seed: int, task: Task | None = None) -> RunParts:
        task = task or build_task(config, seed)
        federation = build_federation(task, config, seed)
        evaluation = task.to(federation.device)
        return cls(task, federation, evaluation, theory_tracker(config, evaluation, seed),
                   EpochRedealer.of(config, task, seed))

    def shared(self, federation: Federation) -> dict[str, Any]:
        """The objects a checkpoint names, with ``federation``'s current train data."""
        roots = {"task": self.task, "evaluation": self.evaluation, "train": federation.train, "tracker": self.tracker}
        return shared_objects(roots)

    def restore(self, checkpoint: Path, key: str) -> SavedRun:
        """The run saved in ``checkpoint`` (whose fingerprint must be ``key``)."""

        def rebuilt(done: int) -> dict[str, Any]:
            if self.redealer is not None:
                self.redealer.catch_up(self.federation, done)
            return self.shared(self.federation)

        done, state = load_checkpoint(checkpoint, key, rebuilt)
        return SavedRun(done, state["algorithm"], ResultTable(state["rows"]), state["random"])


def _check_saved_params(saved: SavedRun, params: defenses.AlgorithmParams, checkpoint: Path) -> None:
    """A checkpoint whose algorithm was built with other parameters than ``config``
    builds now (its config is the same, but a default that follows the run changed,
    e.g. an unset Byzantine budget that meant f = 1 before it followed the run's
    count) is refused: resuming it would mix two runs."""
    written = saved.algorithm.params
    try:  # an older version kept specs (an aggregator's table) where this one keeps the built object
        # a field added since takes its default, or the value the params class names
        # as reproducing the older runs
        kept = {name: getattr(written, name) for name in type(params).model_fields if hasattr(written, name)}
        written = type(params).model_validate({**type(params).values_before_the_field_existed, **kept})
    except (ValidationError, AttributeError):
        pass
    if written != params:
        raise CheckpointError(
            f"{checkpoint} was written with parameters {written!r}, but this version builds "
            f"{params!r} from the same config (an unset default now follows the run); "
            "run again without resuming, or set the old value in the config"
        )


def _check_saved_attack(saved: SavedRun, attack: AttackBase | None, checkpoint: Path) -> None:
    """A checkpoint whose attack differs from the one ``config`` builds now (a default
    of the attack changed: the optimised search's grid and evaluations) is refused, as
    :func:`_check_saved_params` refuses changed method parameters."""
    written = saved.algorithm.federation.attack
    try:
        same = bool(written == attack)
    except (RuntimeError, ValueError):  # fields that compare elementwise (tensors)
        same = repr(written) == repr(attack)
    if not same:
        raise CheckpointError(
            f"{checkpoint} was written with the attack {written!r}, but this version builds {attack!r} from the "
            "same config (a default of the attack changed); run again without resuming, or set the old values"
        )


def load_run(method: MethodConfig, config: ExperimentConfig, seed: int, checkpoint: Path) -> SavedRun:
    """The run of ``method`` and ``seed`` saved in ``checkpoint`` by :func:`run_method`
    (e.g. a finished run's final models: ``load_run(...).algorithm.client_models()``)."""
    return RunParts.build(config, seed).restore(Path(checkpoint), fingerprint(config, method, seed))


def theory_tracker(config: ExperimentConfig, task: Task, seed: int) -> TheoryTracker | None:
    """The ``[theory]`` table's tracker for ``task`` (``None`` without the table)."""
    if config.theory is None:
        return None
    from theory_checks.tracking import CPU_BUDGET_MB, TheoryTracker  # only runs that ask for estimates load them

    theory = config.theory
    return TheoryTracker(
        task,
        theory.estimate,
        every=theory.every,
        batch_size=config.batch_size,
        clients=theory.clients,
        lanczos_steps=theory.lanczos_steps,
        budget=theory.budget,
        seed=seed,
        memory_budget_mb=theory.memory_budget_mb or memory_budget_mb(built(config).device, CPU_BUDGET_MB),
    )


@dataclass(frozen=True)
class EpochRedealer:
    """With ``task.reshuffle_every_epoch``: re-deals the train split at the start of
    every epoch after the first (an epoch = ``ceil(n / batch_size)`` rounds), as the
    official code re-deals MNIST."""

    builder: ImageTask
    task: Task
    seed: int
    data: LabelledImages
    per_epoch: int
    #: the layout and the train images normalised at each turn, computed once and
    #: reused by every re-deal (without it each re-deal computes them again)
    prepared: RedealCache | None = None
    #: two train-input tensors the re-deals alternate between (with prepared images):
    #: a fresh one page-faults (benchmarks/README.md, "The epoch re-deal")
    spares: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def of(cls, config: ExperimentConfig, task: Task, seed: int) -> EpochRedealer | None:
        """The re-dealer of ``config``'s run for ``seed`` (``None`` when it keeps its deal)."""
        if not (isinstance(config.task, ImageTaskConfig) and config.task.reshuffle_every_epoch):
            return None
        builder = config.task.builder()
        samples = task.train.samples_per_client
        per_epoch = math.ceil(samples / min(config.batch_size or samples, samples))
        data = _dataset(builder.dataset, builder.data_dir)
        prepared = builder.prepared_redeal(task, seed, data)
        # written once now, so that no re-deal pays their pages' first touch
        spares = [] if prepared.images is None else [torch.zeros_like(task.train.inputs, device="cpu") for _ in range(2)]
        return cls(builder, task, seed, data, per_epoch, prepared, spares)

    #: the next epoch's deal while it is gathered into a spare, a share every round
    ahead: dict[str, Any] = field(default_factory=dict)

    def before_round(self, federation: Federation, round_index: int) -> None:
        """Re-deal before round ``round_index`` when it starts an epoch; then gather a
        share of the next epoch's deal (:meth:`_gather_ahead`)."""
        if round_index > 0 and round_index % self.per_epoch == 0:
            self.deal(federation, round_index // self.per_epoch)
        self._gather_ahead(federation, round_index)

    def _gather_ahead(self, federation: Federation, round_index: int) -> None:
        """Gather the next epoch's train inputs into a spare over this epoch's rounds,
        an equal share of the clients each round, so that the epoch's first round swaps
        them in rather than gathering them all: one round well above the others
        otherwise.  The same values as a re-deal at once (a run resumed mid-epoch
        starts the gathering where it stands)."""
        if self.prepared is None or self.prepared.images is None:
            return
        part = round_index % self.per_epoch
        if part == 0 or not self.ahead:
            spare = self._spare(federation)
            if spare is None:
                return
            epoch = round_index // self.per_epoch + 1
            index = self.builder.epoch_index(self.task, epoch, self.seed, self.data, self.prepared)
            self.ahead.clear()
            self.ahead.update(epoch=epoch, index=index, turns=self.builder.turns(self.task), inputs=spare, done=0)
        ahead = self.ahead
        clients = ahead["index"].shape[0]
        stop = ahead["done"] + math.ceil((clients - ahead["done"]) / (self.per_epoch - part))
        rows = slice(ahead["done"], stop)
        into = ahead["inputs"][rows]
        if self.prepared.images.gather(ahead["index"][rows], ahead["turns"][rows], out=into) is not into:
            ahead.clear()  # the spare does not fit the gathered rows: re-deal at once instead
            return
        ahead["done"] = stop

    def catch_up(self, federation: Federation, done: int) -> None:
        """Give a freshly built ``federation`` the deal in force after ``done`` rounds."""
        epoch = (done - 1) // self.per_epoch if done > 0 else 0
        if epoch > 0:
            self.deal(federation, epoch)

    def deal(self, federation: Federation, epoch: int) -> None:
        ahead = self.ahead
        if ahead.get("epoch") == epoch and ahead["done"] == ahead["index"].shape[0]:
            train = self.builder.gathered_split(self.task, ahead["index"], ahead["inputs"], self.data)
        else:
            train = self.builder.reshuffle(self.task, epoch, self.seed, self.data, self.prepared,
                                           self._spare(federation))
        ahead.clear()
        federation.redeal(train)

    def _spare(self, federation: Federation) -> torch.Tensor | None:
        """A train-input tensor to deal into that holds neither the federation's current
        data nor the task's first deal (``None`` without prepared images).  No engine
        keeps the train data past a round, so the deal before last is free again."""
        if self.prepared is None or self.prepared.images is None:
            return None
        held = {federation.train.inputs.data_ptr(), self.task.train.inputs.data_ptr()}
        return next((spare for spare in self.spares if spare.data_ptr() not in held), None)


def run_cell_config(
    payload: dict[str, Any],
    source: str,
    timed: bool = False,
    checkpoint: Path | None = None,
    report: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Tidy rows ``(round, metric, value)`` of a grid cell's config (one method, one
    seed), validated first; ``timed`` adds its wall time as metric ``seconds``;
    ``checkpoint`` and ``report`` go to :func:`run_method`."""
    config = parse_and_validate(payload, source)
    start = time.perf_counter()
    table = run_method(config.methods[0], config, config.seeds[0], checkpoint=checkpoint, report=report)
    rows = [{k: v for k, v in row.items() if k not in ("method", "seed")} for row in table.rows]
    if timed:
        rows.append({"round": config.rounds, "metric": "seconds", "value": time.perf_counter() - start})
    return rows


def _report(label: str, message: str) -> None:
    """``--verbose``: a run's line when a method resumes and at each checkpoint."""
    print(f"robust-pfl run: {label}: {message}", file=sys.stderr, flush=True)


def run_experiment(
    config: ExperimentConfig, out_dir: Path | None = None, progress: bool | None = None, resume: bool = False,
    validated: bool = False,
) -> dict[str, Any]:
    """Run every method for every seed (:func:`run_table`); write
    ``history.csv``/``summary.json`` when ``out_dir`` is given.  The summary holds
    ``final`` (methods in config order), ``config`` and ``provenance``
    (:func:`robust_pfl.provenance.provenance`; the wall time is this call's, so a
    resumed run's counts from its resumption).  ``validated``: ``config`` has been
    through :func:`validate` already."""
    if not validated:
        config = validate(config)
    start = time.perf_counter()
    table = run_table(config, out_dir, progress, resume, validated=True)
    seconds = time.perf_counter() - start
    extra = {"config": config.model_dump(mode="json"),
             "provenance": provenance(config.device, torch.get_num_threads(), seconds)}
    if out_dir is not None:
        return write_results(table, Path(out_dir), extra)
    return {"final": table.final(), **extra}


def run_table(
    config: ExperimentConfig, out_dir: Path | None = None, progress: bool | None = None, resume: bool = False,
    validated: bool = False,
) -> ResultTable:
    """Run every method for every seed and return the tidy rows.

    With ``config.checkpoint_every`` and ``out_dir``, each method and seed keeps its
    checkpoint in ``out_dir/checkpoints/<label>-seed<seed>.pt`` (the final one holds
    the final models).  ``resume=True`` continues from them; otherwise they are
    removed first and the run starts afresh; under ``--verbose``
    (:func:`robust_pfl.engine.progress.verbose`) each checkpoint saved writes a line to
    stderr.  ``validated``: ``config`` has been through :func:`validate` already."""
    if not validated:
        config = validate(config)
    if resume and config.checkpoint_every is None:
        raise config_error(None, [("checkpoint_every", "resuming needs checkpoints: set checkpoint_every = <rounds>")])
    if resume and out_dir is None:
        raise ValueError("resume=True needs out_dir, where the checkpoints are")
    checkpoints = None if out_dir is None else Path(out_dir) / "checkpoints"

    def checkpoint_of(method: MethodConfig, seed: int) -> Path | None:
        return None if checkpoints is None else checkpoints / checkpoint_name(method.display, seed)

    if not resume and checkpoints is not None:
        for seed in config.seeds:
            for method in config.methods:
                remove_checkpoint(checkpoints / checkpoint_name(method.display, seed))
    table = ResultTable()
    total = config.rounds * len(config.methods) * len(config.seeds)
    # the ETA weighs each method's rounds by its estimated cost: FC, first and slow, would
    # otherwise have it extrapolate FC's pace over the cheap baselines after it
    weights = [(config.rounds, seconds) for _ in config.seeds for seconds in built(config).round_seconds]
    with (deterministic_kernels_within(built(config).device),
          progress_bar(total, "robust-pfl run", progress, costs=weights) as bar):
        for seed in config.seeds:
            task = build_task(config, seed)
            for method in config.methods:
                label, started, rounds = f"{method.display} seed={seed}", time.perf_counter(), itertools.count(1)

                def advance() -> None:  # called within this iteration only
                    bar.set_postfix_str(f"{label} round {next(rounds)}/{config.rounds}", refresh=False)
                    bar.update(1)

                bar.set_postfix_str(label)
                checkpoint = checkpoint_of(method, seed)
                report = functools.partial(_report, label) if checkpoint is not None and verbose() else None
                table.extend(run_method(method, config, seed, advance, task, checkpoint, report))
                bar.item_done(f"{label} done ({time.perf_counter() - started:.1f} s)")
    return table
