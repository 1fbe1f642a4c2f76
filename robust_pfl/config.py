"""Experiment configuration (TOML), validated before any work is done.

Every field is checked at load time; an invalid config raises :class:`ConfigError`
whose message names each bad field (dotted path) and the allowed values, every stage's
at once (:func:`check_config`).  Method and attack options are validated against the
registered classes by the composition root (:func:`robust_pfl.experiments.validate`;
:func:`robust_pfl.experiments.parse_and_validate` reports both in one error).
"""

from __future__ import annotations

import re
import tomllib
from copy import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, Mapping, Sequence, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails

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


class FlowerOptions(_Strict):
    """The ``[flower]`` table: how ``robust-pfl flower`` runs the config as a Flower
    simulation (:mod:`robust_pfl.flower`).  It lives in the run config's schema so that
    one file serves ``robust-pfl run`` (which validates the table and ignores it) and
    ``robust-pfl flower``; checking it needs no flwr."""

    nodes: int | None = Field(None, ge=1, description="supernodes; must equal the run's clients (default: them)")
    cpus_per_node: float = Field(1.0, gt=0, description="CPUs each ClientApp actor reserves (Ray backend)")
    timeout_s: float = Field(600.0, gt=0, description="how long the strategy waits for one exchange's replies")


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
    flower: FlowerOptions | None = Field(
        None, exclude=True,
        description="robust-pfl flower's options; `run` ignores them (left out of dumps, cell keys and checkpoint "
        "fingerprints: they never change a result)",
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
    def _cross_checks(self, info: ValidationInfo) -> "ExperimentConfig":
        """Every check across tables (:data:`CROSS_CHECKS`) at once, each failure at its
        field, so that one report names them all; a check reading a part the context's
        :data:`UNCHECKED` names is skipped (that part was refused and replaced by its
        default, which the check would judge instead of what the file says)."""
        unchecked = (info.context or {}).get(UNCHECKED, frozenset())
        errors = [
            InitErrorDetails(type="value_error", loc=loc, input=None, ctx={"error": ValueError(message)})
            for reads, _, check in CROSS_CHECKS if not reads & unchecked for loc, message in check(self)
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(DEVICE_PATTERN, value):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {value!r}")
        return value


#: The key of pydantic's validation context (``model_validate(data, context=...)``)
#: holding the parts of a config already refused and replaced (:func:`check_config`):
#: top-level keys, ``methods[i]``, and ``plugins`` when a plug-in failed to import.
UNCHECKED = "unchecked"

CrossProblem = tuple[tuple[str, ...], str]  # (pydantic location, message)


def _byzantine_clusters_exist(config: ExperimentConfig) -> list[CrossProblem]:
    chosen = config.byzantine.clusters or []
    if any(not 0 <= k < config.task.clusters for k in chosen):
        return [(("byzantine", "clusters"), f"must be cluster indices in [0, {config.task.clusters}), got {chosen}")]
    return []


def _separation_needs_clusters(config: ExperimentConfig) -> list[CrossProblem]:
    wanted = set(config.theory.estimate) if config.theory else set()
    if wanted & {"Delta", "momentum"} and config.task.clusters < 2:
        return [(("theory", "estimate"), "'Delta' and 'momentum' compare clusters and need task.clusters >= 2, "
                 f"got {config.task.clusters}")]
    if "momentum" in wanted and config.task.clients_per_cluster < 2:
        return [(("theory", "estimate"), "'momentum' measures the momenta's spread within clusters and needs "
                 f"task.clients_per_cluster >= 2, got {config.task.clients_per_cluster}")]
    return []


#: The schema's checks across tables, each with the top-level keys it reads and the
#: field it judges: run after every field is valid, skipped where a key it reads was
#: refused (:data:`UNCHECKED`; the report then names the field, :func:`skipped_checks`).
CROSS_CHECKS: tuple[tuple[frozenset[str], str, Callable[[ExperimentConfig], list[CrossProblem]]], ...] = (
    (frozenset({"byzantine", "task"}), "byzantine.clusters", _byzantine_clusters_exist),
    (frozenset({"theory", "task"}), "theory.estimate", _separation_needs_clusters),
)


def _why_unread(part: str) -> str:
    """Why a check reading the refused ``part`` did not run: the failed plug-ins may be
    what registers a name; a refused part was replaced by its default, which the check
    would judge instead of the file."""
    return "the plug-ins did not load" if part == "plugins" else f"{part} is invalid"


#: A skipped check, ``field`` or ``field (what of it)``, -> the refused parts it reads.
Skips = dict[str, list[str]]


def note_skip(skips: Skips | None, check: str, parts: Iterable[str]) -> None:
    """Record in ``skips`` that ``check`` (its field first: ``attack.name``, ``task (its
    memory)``) was not run because ``parts`` were refused (nothing where ``skips`` is
    None: the caller does not report them)."""
    if skips is not None:
        known = skips.setdefault(check, [])
        known += [part for part in parts if part not in known]


def skipped_checks(skips: Mapping[str, Sequence[str]], reported: Iterable[Problem]) -> list[Problem]:
    """One line per check not run because a part it reads was refused:
    ``attack.name not checked: the plug-ins did not load``, so that one report says
    what the next run will check as well as what is wrong.  A field the report
    already names, or one inside or around it (``attack`` for ``attack.name``), gets
    no line: its own problem comes first.  The lines have no field of their own
    (:func:`config_error` prints them as they are, after the problems)."""
    named = {where for where, _ in reported if where}

    def related(field: str, other: str) -> bool:
        short, long = sorted((field, other), key=len)
        return long == short or long.startswith((f"{short}.", f"{short}["))

    return [("", f"{check} not checked: {'; '.join(_why_unread(part) for part in parts)}")
            for check, parts in skips.items()
            if parts and not any(related(check.split(" ", 1)[0], other) for other in named)]


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


Problem = tuple[str, str]  # (field path, message); "" where the message names its field


@dataclass(frozen=True)
class ConfigCheck:
    """What :func:`check_config` found: each stage's problems, in stage order, and the
    config the next stage (:func:`robust_pfl.experiments.validate`) runs on."""

    stages: tuple[tuple[Problem, ...], ...]
    #: The valid config, or (after problems) the config with each refused part
    #: replaced by its default; None where no replacement makes a config.
    config: ExperimentConfig | None
    #: The refused parts (top-level keys, ``methods[i]``; ``plugins`` when an import
    #: failed): a later check reading one of them is skipped.
    unchecked: frozenset[str]

    @property
    def problems(self) -> list[Problem]:
        """Every stage's problems, each field named once (:func:`merged_problems`)."""
        return merged_problems(*self.stages)

    def skipped(self) -> Skips:
        """The checks across tables (:data:`CROSS_CHECKS`) not run because a part they
        read was refused: the field each judges -> those parts.  Empty where no config
        came out (then no later check ran at all, and the problems say why)."""
        skips: Skips = {}
        if self.config is not None:
            for reads, field, _ in CROSS_CHECKS:
                if reads & self.unchecked and _given(self.config, field):
                    note_skip(skips, field, sorted(reads & self.unchecked))
        return skips


def _given(config: BaseModel, field: str) -> bool:
    """Whether the dotted ``field`` of ``config`` holds a value (a check of a field left
    unset judges nothing, so its skipping is not worth a line)."""
    value: Any = config
    for part in field.split("."):
        value = getattr(value, part, None)
    return value not in (None, [], ())


def check_config(data: Mapping[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> ConfigCheck:
    """Check a plain mapping in stages, each reporting every problem it finds, so that
    one report names every bad field: the ``plugins``' imports (:mod:`robust_pfl.plugins`;
    ``.py`` paths relative to ``base_dir``, else the working directory; first, so the
    names they register validate), the schema's fields (every table at once), then its
    checks across tables (:data:`CROSS_CHECKS`, which pydantic runs only on valid
    fields).

    A stage runs on what the stages before left: each part they refused (a top-level
    key, one of the ``methods``) is replaced by its default and named in
    :attr:`ConfigCheck.unchecked`, so a check reading it is skipped (it would judge the
    default, not the file) while the checks of the other parts still run.  A nesting
    too deep to copy is the one problem raised at once (:func:`check_nesting`)."""
    from robust_pfl.plugins import plugin_problems, with_resolved_paths

    check_nesting(data, f"config {source}")
    data = with_resolved_paths(dict(data), base_dir)
    imports = plugin_problems(data.get("plugins"))
    stages: list[tuple[Problem, ...]] = [tuple(imports)]
    replaced: set[str] = set()
    unchecked = {"plugins"} if imports else set()
    for _ in range(3):  # the fields; the cross-checks, once the fields are valid; a last try
        try:
            config = ExperimentConfig.model_validate(data, context={UNCHECKED: frozenset(unchecked)})
        except ValidationError as error:
            stages.append(tuple(validation_problems(error, ExperimentConfig)))
            refused = {_refused_part(item["loc"]) for item in error.errors()}
            if "" in refused or refused <= replaced:  # nothing left to replace: no config to go on with
                break
            replaced |= refused
            unchecked |= refused
            data = _with_defaults(data, refused)
        else:
            return ConfigCheck(tuple(stages), config, frozenset(unchecked))
    return ConfigCheck(tuple(stages), None, frozenset(unchecked))


def _refused_part(loc: Sequence[str | int]) -> str:
    """The part of a config a pydantic location lies in: ``methods[i]`` for one
    method, else the top-level key ("" for the whole config)."""
    if not loc:
        return ""
    if loc[0] == "methods" and len(loc) > 1 and isinstance(loc[1], int):
        return f"methods[{loc[1]}]"
    return str(loc[0])


def _with_defaults(data: dict[str, Any], parts: Iterable[str]) -> dict[str, Any]:
    """``data`` with each part replaced by its default: a top-level key dropped, a
    method (or all of ``methods``, which has no default) by a nameless placeholder that
    the later checks skip."""
    data = dict(data)
    placeholder = {"name": ""}
    for part in parts:
        if part == "methods":
            data["methods"] = [placeholder]
        elif part.startswith("methods[") and "methods" not in parts:
            methods = data["methods"] = list(data["methods"])
            methods[int(part[len("methods["):-1])] = placeholder
        elif not part.startswith("methods["):
            data.pop(part, None)
    return data


def merged_problems(*stages: Iterable[Problem]) -> list[Problem]:
    """The problems of checks run in stages (earliest first), each field named once: a
    field an earlier stage named is not named again (a later stage reaching it judges
    the same mistake, or one it caused), and a stage's messages about one field share
    its line, joined by ``"; "``.  A problem without a field appears once."""
    merged: dict[str, Problem] = {}
    for stage in stages:
        earlier = set(merged)
        for where, message in stage:
            key = where or f"\n{message}"  # a message naming its own field is its own key
            if key in earlier:
                continue
            if key not in merged:
                merged[key] = (where, message)
            elif message not in merged[key][1].split("; "):
                merged[key] = (where, f"{merged[key][1]}; {message}")
    return list(merged.values())


def parse_config(data: dict[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> ExperimentConfig:
    """Validate a plain mapping (:func:`check_config`: the plug-ins' imports, the
    schema's fields, its checks across tables); raise :class:`ConfigError` naming every
    bad field these stages find.  Method and attack names and options are checked
    later, against the registries (:func:`robust_pfl.experiments.validate`;
    :func:`robust_pfl.experiments.parse_and_validate` reports both stages at once)."""
    checked = check_config(data, source, base_dir)
    problems = checked.problems
    if problems or checked.config is None:
        raise config_error(source, problems + skipped_checks(checked.skipped(), problems))
    return checked.config


def load_config(path: str | Path, device: str | None = None) -> ExperimentConfig:
    """Read and validate a TOML config file (:func:`parse_config`); ``device`` (a
    command's ``--device``) replaces the file's ``device``.
    :func:`robust_pfl.experiments.load_and_validate` also checks it against the
    registries, in the same report.

    Raises:
        ConfigError: a missing, unreadable or non-TOML file (one line naming it), or
            invalid fields (one line per field, every stage's at once).
    """
    path = Path(path)
    return parse_config(read_config(path, device), str(path), base_dir=path.parent)


def read_config(path: str | Path, device: str | None = None) -> dict[str, Any]:
    """The parsed TOML of a config file (:func:`read_toml_file`), its ``device``
    replaced by ``device`` where given."""
    data = read_toml_file(path, "config")
    if device is not None:
        data["device"] = device
    return data
