"""Experiment configuration (TOML), validated before any work is done.

Every field is checked at load time; an invalid config raises :class:`ConfigError`
whose message names the field (dotted path) and the allowed values.  Method and
attack options are validated against the registered classes by the composition root
(:func:`robust_pfl.experiments.validate`).
"""

from __future__ import annotations

import re
import tomllib
from copy import copy
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from robust_pfl.engine.devices import DEVICE_PATTERN
from robust_pfl.engine.placement import ByzantinePlacement
from robust_pfl.engine.tasks.images import ImageTask
from robust_pfl.engine.registry import did_you_mean, display_key
from robust_pfl.engine.validation import problem
from robust_pfl.engine.errors import ConfigError


class _Strict(BaseModel):
    # strict: TOML types are exact, so `rounds = true` must not be read as 1
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SyntheticTaskConfig(_Strict):
    """Werner et al. Sec. 4.1 synthetic linear regression."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # inf noise: no task

    name: Literal["synthetic_linear"] = "synthetic_linear"
    clusters: int = Field(4, ge=1)
    clients_per_cluster: int = Field(4, ge=1)
    dim: int = Field(10, ge=1)
    samples_per_client: int = Field(9, ge=1)
    validation_samples: int = Field(50, ge=1)
    test_samples: int = Field(50, ge=1)
    scale: float = Field(100.0, gt=0)
    optimum: Literal["binary", "gaussian"] = "binary"
    noise: float = Field(0.0, ge=0)


class _ImageTaskTable(_Strict):
    """What every image task table does beyond its fields: build the task (its
    cross-field rules run there)."""

    @model_validator(mode="after")
    def _builder_accepts(self) -> "_ImageTaskTable":
        try:
            self.builder()
        except ValueError as error:
            raise ValueError(str(error)) from None  # the error's location names the task
        return self

    def builder(self) -> ImageTask:
        """The :class:`~robust_pfl.engine.tasks.images.ImageTask` these fields describe."""
        return ImageTask(**self.model_dump(exclude={"name", "reshuffle_every_epoch"}))


#: The ``[task]`` table of an image task (Werner et al. Sec. 4.2, Table 1): ``name``,
#: :class:`~robust_pfl.engine.tasks.images.ImageTask`'s own fields (types, constraints,
#: defaults and descriptions declared once there) and ``reshuffle_every_epoch``.
ImageTaskConfig = create_model(
    "ImageTaskConfig",
    __base__=_ImageTaskTable,
    __module__=__name__,
    name=(Literal["image"], ...),
    **{name: (info.annotation, copy(info)) for name, info in ImageTask.__pydantic_fields__.items()},
    reshuffle_every_epoch=(bool, Field(
        False, description="re-deal the train split every epoch (the official code's MNIST runs)")),
)


def _task_name(value: Any) -> str:
    """The task kind; a table without ``name`` is the synthetic task (the default)."""
    if isinstance(value, dict):
        return value.get("name", "synthetic_linear")
    return getattr(value, "name", "synthetic_linear")


TASK_TAGS = ("synthetic_linear", "image")
TaskConfig = Annotated[
    Union[Annotated[SyntheticTaskConfig, Tag("synthetic_linear")], Annotated[ImageTaskConfig, Tag("image")]],
    Discriminator(_task_name, custom_error_type="task_name", custom_error_message="task.name must be 'synthetic_linear' or 'image'"),
]


class ByzantineConfig(_Strict):
    """Byzantine clients added to the honest ones (:class:`ByzantinePlacement`):
    ``per_cluster`` in every cluster (paper text) and/or ``total`` spread over the
    clusters (official code), or as fractions of all / each cluster's clients;
    ``clusters`` restricts which clusters receive the ``total``/``fraction`` ones."""

    total: int = Field(0, ge=0)
    per_cluster: int = Field(0, ge=0)
    fraction: float = Field(0.0, ge=0, lt=1, description="Byzantine share of all clients")
    fraction_per_cluster: float = Field(0.0, ge=0, lt=1, description="Byzantine share of every cluster")
    clusters: list[int] | None = Field(None, min_length=1, description="clusters receiving total/fraction")

    def placement(self) -> ByzantinePlacement:
        return ByzantinePlacement(
            self.total,
            self.per_cluster,
            self.fraction,
            self.fraction_per_cluster,
            None if self.clusters is None else tuple(self.clusters),
        )


class AttackConfig(BaseModel):
    """``name`` of a registered attack plus its options (checked against the class)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = "none"

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class MethodConfig(BaseModel):
    """``name`` of a registered algorithm plus its options; ``label`` names the run in
    results (default: the name)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    label: str | None = None

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @property
    def display(self) -> str:
        return self.label or self.name


THEORY_ESTIMATES = ("A", "Delta", "sigma", "L", "mu", "momentum")


class TheoryConfig(_Strict):
    """Estimates of Werner et al.'s constants recorded along a run (``[theory]``),
    with the task's oracle clusters and honest clients only (Byzantine rows never
    enter): ``A`` (Assumption 4, eq. 31), ``Delta`` (Assumption 5 with D = 0, eq. 32),
    ``sigma`` (Assumption 6, per-sample gradients), ``L`` and ``mu`` (Hessian
    extremes), ``momentum`` (Assumptions 8-9 on the momenta of methods that send
    them).  Written to ``history.csv`` as ``theory_*`` metrics every ``every`` rounds."""

    estimate: list[Literal[THEORY_ESTIMATES]] = Field(min_length=1)
    every: int = Field(10, ge=1, description="rounds between estimates (and round 0, and the last)")
    clients: int | None = Field(
        8,
        ge=1,
        description="honest clients drawn afresh for each measurement (seeded by the run's seed and the round): "
        "their models are the points of A and Delta, their data give sigma, L and mu; None: every honest client",
    )
    lanczos_steps: int = Field(12, ge=1, description="Lanczos steps on Hessian-vector products for L and mu")
    budget: float = Field(
        0.03,
        gt=0,
        description="largest share of the run's per-sample gradient evaluations the estimates may add, counted, "
        "not timed, so every machine records the same rounds: due measurements past it are skipped (round 0 "
        "and the last are always measured); inf: measure every `every` rounds",
    )
    memory_budget_mb: int | None = Field(
        None,
        ge=1,
        description="bound on the [models, clients, d] cross gradients held at once (A, Delta); default: "
        "256 on the CPU, a quarter of the free memory on CUDA",
    )

    @field_validator("estimate")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"estimate must list distinct names from {list(THEORY_ESTIMATES)}, got {value}")
        return value


class ExperimentConfig(_Strict):
    """One experiment: a task, Byzantine clients and attack, methods, seeds, and
    optionally theory estimates recorded along the run."""

    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    rounds: int = Field(100, ge=1)
    eval_every: int = Field(10, ge=1)
    batch_size: int | None = Field(None, ge=1, description="None: full local data")
    device: str = Field("cpu", description="cpu | cuda | cuda:N | mps | auto (CUDA when present, else the CPU)")
    dtype: Literal["float32", "float64"] = "float32"
    task: TaskConfig = Field(default_factory=SyntheticTaskConfig)
    byzantine: ByzantineConfig = Field(default_factory=ByzantineConfig)
    attack: AttackConfig = Field(default_factory=AttackConfig)
    methods: list[MethodConfig] = Field(min_length=1)
    plugins: list[str] = Field(
        default_factory=list,
        description="modules (dotted names or .py paths) imported before validation, which register a user's "
        "attacks, aggregators or algorithms (robust_pfl.plugins)",
    )
    theory: TheoryConfig | None = None
    checkpoint_every: int | None = Field(
        None, ge=1, description="rounds between checkpoints of a run's full state (None: no checkpoints)"
    )
    #: What validation built from this config, carried to every run of it (the attack,
    #: each method's parameters, the device): :func:`robust_pfl.experiments.built`.
    _built: Any = PrivateAttr(None)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> "ExperimentConfig":
        """A copy; with ``update`` it forgets what validation built, which belongs to the
        fields validation saw."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied._built = None
        return copied

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"seeds must be distinct, got {value}")
        return value

    @model_validator(mode="after")
    def _byzantine_clusters_exist(self) -> "ExperimentConfig":
        chosen = self.byzantine.clusters or []
        if any(not 0 <= k < self.task.clusters for k in chosen):
            raise ValueError(
                f"byzantine.clusters must be cluster indices in [0, {self.task.clusters}), got {chosen}"
            )
        return self

    @model_validator(mode="after")
    def _separation_needs_clusters(self) -> "ExperimentConfig":
        wanted = set(self.theory.estimate) if self.theory else set()
        if wanted & {"Delta", "momentum"} and self.task.clusters < 2:
            raise ValueError(
                "theory.estimate: 'Delta' and 'momentum' compare clusters and need task.clusters >= 2, "
                f"got {self.task.clusters}"
            )
        if "momentum" in wanted and self.task.clients_per_cluster < 2:
            raise ValueError(
                "theory.estimate: 'momentum' measures the momenta's spread within clusters and needs "
                f"task.clients_per_cluster >= 2, got {self.task.clients_per_cluster}"
            )
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(DEVICE_PATTERN, value):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {value!r}")
        return value


def field_path(loc: Sequence[str | int]) -> str:
    """``methods[0].radius`` for pydantic's location ``("methods", 0, "radius")``; keys
    that are not plain words quoted (:func:`robust_pfl.engine.registry.display_key`)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            continue
        key = display_key(part)
        path += f".{key}" if path else key
    return path


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside a field's annotation (through Optional, list,
    Annotated and Union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in get_args(annotation) for model in models_in(argument)]


def _walk(model: type[BaseModel], loc: Sequence[str | int]) -> tuple[list[type[BaseModel]], FieldInfo | None, bool]:
    """The models a pydantic location below ``model`` reaches, the field its last part
    names (None where that part is a list index or a tagged union's tag), and whether
    the model holding that field takes non-finite numbers."""
    models, found, inf_nan = [model], None, True
    for part in loc:
        if isinstance(part, int):
            found = None
            continue
        owners = [(parent, info) for parent in models for name, info in parent.model_fields.items()
                  if part in (name, info.alias)]
        if owners:
            found, inf_nan = owners[0][1], owners[0][0].model_config.get("allow_inf_nan", True)
            models = [inner for _, info in owners for inner in models_in(info.annotation)]
        else:  # a tagged union's tag ("image") selects the member whose ``name`` it is
            found = None
            models = [m for m in models if part in get_args(getattr(m.model_fields.get("name"), "annotation", None))]
    return models, found, inf_nan


def allowed_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys a config may write at ``loc`` (a pydantic location below ``model``,
    ending at the table that holds the key); empty where no model describes it."""
    return [info.alias or name for m in _walk(model, loc)[0] for name, info in m.model_fields.items()]


def field_at(model: type[BaseModel], loc: Sequence[str | int]) -> tuple[FieldInfo, bool] | None:
    """The field a pydantic location below ``model`` ends at, and whether its model
    takes non-finite numbers; None where it ends at a list item or no model describes
    it."""
    _, found, inf_nan = _walk(model, loc)
    return None if found is None else (found, inf_nan)


def validation_problems(
    error: ValidationError, model: type[BaseModel], prefix: Sequence[str | int] = (), also: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """``(field path, message)`` for each error of ``model``'s validation.

    Our own validators' messages appear as written (pydantic's ``Value error, `` prefix
    dropped); an unknown key gets the closest allowed key (``also``: further keys
    allowed where ``model`` is validated) as a suggestion.
    """
    problems: list[tuple[str, str]] = []
    for item in error.errors():
        loc = _without_union_labels(model, list(item["loc"]))
        if item["type"] == "value_error":
            message = str(item["ctx"]["error"])
        elif item["type"] == "extra_forbidden":
            allowed = [*allowed_keys(model, loc[:-1]), *(also if len(loc) == 1 else ())]
            message = f"unknown key{did_you_mean(loc[-1], allowed) or f'; allowed: {allowed}'}"
        elif (field := field_at(model, loc)) is not None and "input" in item:
            message = problem(field[0], item["input"], allow_inf_nan=field[1])
        else:
            message = item["msg"]
        if loc[:1] == ["task"] and loc[1:2] and loc[1] in TASK_TAGS:
            loc.pop(1)  # the union's tag, not a field the user wrote
        where = field_path([*prefix, *loc])
        if not any(seen == where for seen, _ in problems):  # one line per field, not per union member
            problems.append((where, message))
    return problems


def _without_union_labels(model: type[BaseModel], loc: list[str | int]) -> list[str | int]:
    """``loc`` cut before the first part that names no field, list item or tagged
    member: pydantic's label of an untagged union's member (``aggregator.str``,
    ``aggregator.dict[str,any]``), which the user never wrote."""
    for end in range(1, len(loc)):
        models, field, _ = _walk(model, loc[:end])
        if field is not None and not models and isinstance(loc[end], str):  # a plain field has no keys
            return loc[:end]
    return loc


def config_error(source: str | None, problems: Sequence[tuple[str, str]]) -> ConfigError:
    """A :class:`ConfigError` listing ``field: message`` lines under ``invalid config
    <source>:`` (the field is left out where a model-wide check names its own)."""
    lines = [f"invalid config {source}:" if source else "invalid config:"]
    lines += [f"  {where}: {message}" if where else f"  {message}" for where, message in problems]
    return ConfigError("\n".join(lines))


#: How deeply tables and arrays may nest in a config or grid (the deepest the package's
#: own formats go is 4: a grid axis of method options holding a radius table).
MAX_NESTING = 32


def parse_toml(text: str, what: str) -> dict[str, Any]:
    """``text`` parsed as TOML and checked by :func:`check_nesting`; ``what`` names the
    file in errors (``config run.toml``)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{what} is not valid TOML: {error}") from None
    except RecursionError:  # the parser recurses into nested arrays and inline tables
        raise ConfigError(f"{what} nests arrays or tables too deeply to parse (at most {MAX_NESTING} levels)") from None
    check_nesting(data, what)
    return data


def read_toml_file(path: str | Path, what: str) -> dict[str, Any]:
    """The TOML file at ``path`` parsed (:func:`parse_toml`), for every file a command
    reads (``what``: ``"config"``, ``"grid"``); a missing, unreadable or non-UTF-8
    file is a :class:`ConfigError` of one line naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory, not a TOML file") from None
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {error.start})") from None
    return parse_toml(text, f"{what} {path}")


def check_nesting(data: Any, what: str) -> None:
    """Refuse tables and arrays nested more than :data:`MAX_NESTING` levels deep (a
    deeper structure is no config; copying or validating it would exhaust Python's
    recursion limit).  Walked without recursion."""
    pending: list[tuple[Any, int, str]] = [(data, 0, "")]
    while pending:
        value, depth, where = pending.pop()
        if depth > MAX_NESTING:
            raise ConfigError(f"{what}: {where.lstrip('.') or 'the file'} nests more than {MAX_NESTING} levels deep")
        if isinstance(value, dict):
            pending.extend((item, depth + 1, f"{where}.{key}") for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((item, depth + 1, f"{where}[{index}]") for index, item in enumerate(value))


def parse_config(data: dict[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> ExperimentConfig:
    """Validate a plain mapping; raise :class:`ConfigError` naming bad fields.  Its
    ``plugins`` are imported first (:mod:`robust_pfl.plugins`; ``.py`` paths relative to
    ``base_dir``, else the working directory), so the names they register validate."""
    from robust_pfl.plugins import load_plugins, with_resolved_paths

    check_nesting(data, f"config {source}")
    data = with_resolved_paths(data, base_dir)
    load_plugins(data.get("plugins"), source)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as error:
        raise config_error(source, validation_problems(error, ExperimentConfig)) from None


def load_config(path: str | Path, device: str | None = None) -> ExperimentConfig:
    """Read and validate a TOML config file; ``device`` (a command's ``--device``)
    replaces the file's ``device``.

    Raises:
        ConfigError: a missing, unreadable or non-TOML file (one line naming it), or
            invalid fields (one line per field).
    """
    path = Path(path)
    data = read_toml_file(path, "config")
    if device is not None:
        data["device"] = device
    return parse_config(data, str(path), base_dir=path.parent)
