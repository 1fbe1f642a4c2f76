"""Grid files: a run config whose ``[grid]`` lists expand to the Cartesian product of runs.

A grid file is everything ``robust-pfl run`` accepts plus two tables.  Under ``[grid]``
every list-valued leaf is an axis at its dotted path into the run config
(``byzantine.total = [0, 5]``, ``attack = [{name = "alie"}, ...]``,
``method.lr = [0.1, 0.01]`` for an option of each cell's method).  The base config's
``methods`` and ``seeds`` are the axes ``method`` and ``seed`` (``[grid] method`` /
``seed`` replace them), so each cell is one run: one method, one seed.
``[resources]`` gives each cell's ``cpus`` and ``gpus``.

A table value replaces the whole table at its path; its ``label`` (kept for a method,
as its label) names it in results, else its ``name``, else its compact JSON.  The
whole grid is validated before any cell runs; every problem is reported against the
grid field and element that caused it (``grid.attack[2].name: unknown attack ...``).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence, get_origin

import torch
from pydantic import BaseModel

from robust_pfl.config import ConfigError, ExperimentConfig, check_nesting, merged_problems, models_in, read_toml_file
from robust_pfl.plugins import plugin_problems, with_resolved_paths
from robust_pfl.engine.registry import did_you_mean

GRID = "grid"
RESOURCES = "resources"
#: Axes every grid has: the base config's ``methods`` and ``seeds``, one per cell.
METHOD, SEED = "method", "seed"
#: At most this many problem lines in one error (the rest are counted).
MAX_PROBLEMS = 30


@dataclass(frozen=True)
class Resources:
    """What one cell needs: Ray reserves it; the local backend runs each cell on
    ``threads`` torch threads.  ``gpus = None``: not said (a cell on CUDA then reserves
    one, see :meth:`Grid.cell_resources`; Ray reserves none otherwise)."""

    cpus: float = 1.0
    gpus: float | None = None

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus))

    def on_cuda(self, uses_cuda: bool) -> Resources:
        """What Ray reserves per cell: these resources; where they do not say ``gpus``,
        one GPU for cells on CUDA, else none (``gpus = 0.25`` shares a card between
        four cells, ``gpus = 0`` reserves none)."""
        if self.gpus is not None:
            return self
        return Resources(self.cpus, 1.0 if uses_cuda else 0.0)


@dataclass(frozen=True)
class GridCell:
    """One run of a grid.  ``cell`` is its key (a hash of the resolved config);
    ``axes`` maps each axis column to this cell's value label, in axis order;
    ``seconds`` its cost estimate (:mod:`robust_pfl.costs`), the weight of its share of
    the grid's progress ETA."""

    cell: str
    axes: dict[str, Any]
    config: dict[str, Any]
    n_clients: int
    n_byzantine: int
    seconds: float = 0.0

    def describe(self) -> str:
        return ", ".join(f"{column}={value}" for column, value in self.axes.items())


@dataclass(frozen=True)
class Grid:
    """The cells of a grid, with its axis columns in order."""

    source: str
    columns: list[str]
    cells: list[GridCell]
    resources: Resources

    @property
    def uses_cuda(self) -> bool:
        """Whether some cell runs on a CUDA device."""
        return any(torch.device(cell.config.get("device", "cpu")).type == "cuda" for cell in self.cells)

    def cell_resources(self) -> Resources:
        """What Ray reserves per cell (:meth:`Resources.on_cuda`)."""
        return self.resources.on_cuda(self.uses_cuda)


@dataclass(frozen=True)
class _Axis:
    column: str  # results column: "method", "seed", "attack", "byzantine.total"
    field: str  # where the values were written, for messages: "methods", "grid.attack"
    target: tuple[str | int, ...]  # path in the run config: ("methods", 0), ("attack",)
    values: list[Any]  # what each element sets (a table's label removed, but a method's)
    labels: list[Any]  # each element's column value


def load_grid(path: str | Path, device: str | None = None) -> Grid:
    """Read, expand and validate a grid file (:func:`expand_grid`); ``device`` (a
    command's ``--device``) replaces the file's (:func:`on_device`).

    Raises:
        ConfigError: a missing or non-TOML file, or every bad field of the grid.
    """
    data = with_resolved_paths(read_grid_file(path), Path(path).parent)
    return expand_grid(on_device(data, device, str(path)), str(path))


def on_device(data: dict[str, Any], device: str | None, source: str) -> dict[str, Any]:
    """The parsed grid file ``data`` with every cell on ``device`` (``None``: as the
    file says).  A grid that sweeps ``device`` itself cannot be overridden."""
    if device is None:
        return data
    sweeps = data.get(GRID)
    if isinstance(sweeps, dict) and "device" in sweeps:
        raise ConfigError(f"invalid grid {source}: --device {device} would replace the grid's own device axis "
                          f"(grid.device = {sweeps['device']!r}); drop one of them")
    return {**data, "device": device}


def read_grid_file(path: str | Path) -> dict[str, Any]:
    """The parsed TOML of a grid file, for callers that adjust it before
    :func:`expand_grid` (a recipe's quick mode)."""
    return read_toml_file(path, "grid")


def expand_grid(data: dict[str, Any], source: str) -> Grid:
    """The cells of the grid ``data`` (a parsed grid file), every one validated.

    Cells are the Cartesian product of the axes ``method``, ``seed`` and then the
    ``[grid]`` axes in the order written, the first axis outermost.

    Raises:
        ConfigError: ``invalid grid <source>:`` and one line per problem, naming the
            grid field and element (``grid.byzantine.total[1]: ...``) or the base field.
    """
    check_nesting(data, f"grid {source}")
    base = with_resolved_paths(copy.deepcopy(data))
    problems = _Problems()
    problems.extend(plugin_problems(base.get("plugins")))  # before any name is checked against a registry
    sweeps = base.pop(GRID, {})
    resources = _resources(base.pop(RESOURCES, {}), problems)
    if not isinstance(sweeps, dict):
        problems.append((GRID, f"must be a table of lists, got {type(sweeps).__name__}"))
        sweeps = {}
    axes = _axes(base, sweeps, problems)
    # the cells are checked with the axes that are valid (there are none without methods), so
    # that one report names the grid's own problems and every cell's; a field the grid's own
    # checks named is not named again by a cell (merged_problems)
    cell_problems = _Problems()
    cells = _cells(base, axes, source, cell_problems) if any(axis.column == METHOD for axis in axes) else []
    if problems or cell_problems:
        raise _grid_error(source, merged_problems(problems, cell_problems))
    return Grid(source, [axis.column for axis in axes], cells, resources)


def cell_key(config: ExperimentConfig) -> str:
    """The first 16 hex digits of the SHA-256 of the resolved config's sorted JSON:
    the same run gives the same key however its file wrote it (defaults explicit or
    not).  Non-finite numbers stay distinct (``NaN``, not ``null``).  ``plugins`` is
    left out: it says where names come from, not what runs (the names and options
    it registers are in the key).  ``checkpoint_every`` counts as unset: it decides
    when state is saved, never a result (a resumed run is bit-identical), so adding
    checkpoints to a grid reruns no finished cell.  The device stays in the key: a
    cell's numbers differ from one device to another."""
    resolved = config.model_dump(exclude={"plugins"})
    resolved["checkpoint_every"] = None
    text = json.dumps(resolved, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def grid_cell(config: ExperimentConfig, axes: dict[str, Any]) -> GridCell:
    """The cell running ``config`` (one method, one seed), shown in results as ``axes``."""
    from robust_pfl.experiments import built, byzantine_count, client_count

    return GridCell(cell_key(config), dict(axes), config.model_dump(), client_count(config), byzantine_count(config),
                    built(config).seconds)


# -- axes ------------------------------------------------------------------------------------
def _resources(table: Any, problems: list[tuple[str, str]]) -> Resources:
    if not isinstance(table, dict):
        problems.append((RESOURCES, f"must be a table (cpus, gpus), got {type(table).__name__}"))
        return Resources()
    values = {}
    for key, value in table.items():
        if key not in ("cpus", "gpus"):
            allowed = ["cpus", "gpus"]
            problems.append((f"{RESOURCES}.{key}", f"unknown key{did_you_mean(key, allowed)}; allowed: {allowed}"))
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            problems.append((f"{RESOURCES}.{key}", f"must be a finite number >= 0, got {value!r}"))
        else:
            values[key] = float(value)
    if values.get("cpus", 1.0) == 0:
        problems.append((f"{RESOURCES}.cpus", "must be > 0 (a cell needs a CPU to run)"))
    return Resources(**values)


def _axes(base: dict[str, Any], sweeps: dict[str, Any], problems: list[tuple[str, str]]) -> list[_Axis]:
    """The method and seed axes, then one per list-valued leaf of ``[grid]``."""
    axes = []
    if METHOD in sweeps and not isinstance(sweeps[METHOD], dict):  # a table holds method options
        methods, field = sweeps.pop(METHOD), f"{GRID}.{METHOD}"
    elif "methods" in base:
        methods, field = base["methods"], "methods"
    else:
        methods, field = None, "methods"
        problems.append(("methods", f"give the methods as [[methods]] tables or as {GRID}.{METHOD} = [...]"))
    base.pop("methods", None)
    if methods is not None and _is_axis(field, methods, problems):
        if all(isinstance(m, dict) for m in methods):
            axes.append(_axis(METHOD, field, ("methods", 0), methods, keep_label=True, problems=problems))
        else:
            problems.append((field, "must be a list of tables ({name = ..., options})"))
    seeds, field = (sweeps.pop(SEED), f"{GRID}.{SEED}") if SEED in sweeps else (base.get("seeds", [0]), "seeds")
    base.pop("seeds", None)
    if _is_axis(field, seeds, problems):
        axes.append(_axis(SEED, field, ("seeds", 0), seeds, keep_label=False, problems=problems))
    for path, values in _leaves(sweeps, ()):
        field = ".".join((GRID, *path))
        unknown = _unknown_field(path)
        if unknown is not None:
            problems.append((field, unknown))
        elif _is_axis(field, values, problems):
            target = ("methods", 0, *path[1:]) if path[0] == METHOD else path
            axes.append(_axis(".".join(path), field, target, values, keep_label=False, problems=problems))
    return axes


def _leaves(table: dict[str, Any], prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _is_axis(field: str, values: Any, problems: list[tuple[str, str]]) -> bool:
    if not isinstance(values, list):
        problems.append((field, f"must be a list of values (one per cell), got {values!r}"))
        return False
    if not values:
        problems.append((field, "empty list; give at least one value"))
        return False
    return True


def _axis(column: str, field: str, target: tuple[str | int, ...], elements: list[Any], keep_label: bool,
          problems: list[tuple[str, str]]) -> _Axis:
    values, labels = [], []
    first_index: dict[Any, int] = {}  # hashable labels; others are looked up in the list
    for index, element in enumerate(elements):
        label = _label(element)
        if isinstance(element, dict) and "label" in element and not isinstance(element["label"], str):
            problems.append((f"{field}[{index}].label", f"must be a string, got {element['label']!r}"))
        if isinstance(element, dict) and not keep_label:
            element = {key: value for key, value in element.items() if key != "label"}
        first = _first(label, labels, first_index)
        if first is not None:
            if element == values[first]:
                problems.append((f"{field}[{index}]", f"the same value as {field}[{first}]; values must differ"))
            else:
                problems.append((
                    f"{field}[{index}]",
                    f"shows as {label!r} in results, as {field}[{first}] does; give each a distinct label",
                ))
        else:
            _remember(label, index, first_index)
        values.append(element)
        labels.append(label)
    return _Axis(column, field, target, values, labels)


def _first(label: Any, labels: list[Any], first_index: dict[Any, int]) -> int | None:
    """The index of the first element shown as ``label`` so far, or None."""
    try:
        return first_index.get(label)
    except TypeError:  # an unhashable label (a table without name or label)
        return next((index for index, seen in enumerate(labels) if seen == label), None)


def _remember(label: Any, index: int, first_index: dict[Any, int]) -> None:
    try:
        first_index[label] = index
    except TypeError:
        pass  # found by _first's scan of the list


def _label(value: Any) -> Any:
    """A value's name in results: a table's ``label``, else its ``name``, else its
    compact JSON; a list's compact JSON; a scalar itself."""
    if isinstance(value, dict):
        for key in ("label", "name"):
            if isinstance(value.get(key), str):
                return value[key]
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


def _unknown_field(path: tuple[str, ...]) -> str | None:
    """Why ``path`` (under ``[grid]``) names no field of a run config, or ``None``."""
    if path[0] == METHOD:
        return None  # a method option, checked with the method in each cell
    if path[0] in ("methods", "seeds"):
        return f"unknown field; sweep {path[0][:-1]!r} ({GRID}.{path[0][:-1]} = [...], one value per cell)"
    models: list[type[BaseModel]] = [ExperimentConfig]
    for depth, part in enumerate(path):
        fields = [model.model_fields[part] for model in models if part in model.model_fields]
        if not fields:
            if any(model.model_config.get("extra") == "allow" for model in models):
                return None  # options of an attack, checked with the attack in each cell
            allowed = sorted({name for model in models for name in model.model_fields})
            if depth == 0:
                allowed = sorted({*allowed, METHOD, SEED} - {"methods", "seeds"})
            where = ".".join(path[: depth + 1])
            return f"unknown field {where!r}{did_you_mean(part, allowed)}; allowed here: {allowed}"
        inner = [model for info in fields for model in models_in(info.annotation)]
        if not inner:
            if depth + 1 < len(path) and not any(get_origin(info.annotation) is dict for info in fields):
                return f"{'.'.join(path[: depth + 1])!r} is a value, not a table"
            return None
        models = inner
    return None


# -- cells -----------------------------------------------------------------------------------
def _cells(base: dict[str, Any], axes: list[_Axis], source: str, problems: list[tuple[str, str]]) -> list[GridCell]:
    cells: list[GridCell] = []
    seen: dict[str, tuple[int, ...]] = {}
    for choice in itertools.product(*(range(len(axis.values)) for axis in axes)):
        payload = copy.deepcopy(base)
        for axis, index in zip(axes, choice):
            try:
                _set(payload, axis.target, copy.deepcopy(axis.values[index]))
            except _NotATable as error:
                _add(problems, (f"{axis.field}[{index}]", str(error)))
                break
        else:
            cell = _validated(payload, axes, choice, source, problems)
            if cell is None:
                continue
            if cell.cell in seen:
                _add(problems, _same_run(axes, seen[cell.cell], choice))
                continue
            seen[cell.cell] = choice
            cells.append(cell)
    return cells


class _NotATable(ValueError):
    pass


class _Problems(list):
    """``(field, message)`` problems in the order found, with a set beside them so that
    recording one only once stays constant-time on axes of thousands of elements."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: set[tuple[str, str]] = set()


def _add(problems: _Problems, problem: tuple[str, str]) -> None:
    """Record ``problem`` once (many cells share an element, and its problem)."""
    if problem not in problems.recorded:
        problems.recorded.add(problem)
        problems.append(problem)


def _set(payload: dict[str, Any], target: tuple[str | int, ...], value: Any) -> None:
    """Set ``value`` at ``target``, creating missing tables (``seeds``/``methods``
    become one-element lists)."""
    if target[0] in ("seeds", "methods"):
        if len(target) == 2:
            payload[target[0]] = [value]
            return
        payload, target = payload[target[0]][0], target[2:]
    for depth, part in enumerate(target[:-1]):
        inner = payload.setdefault(part, {})
        if not isinstance(inner, dict):
            where = ".".join(str(p) for p in target[: depth + 1])
            raise _NotATable(f"the base config's {where} is {inner!r}, not a table to set {target[-1]!r} in")
        payload = inner
    payload[target[-1]] = value


def _validated(payload: dict[str, Any], axes: list[_Axis], choice: tuple[int, ...], source: str,
               problems: list[tuple[str, str]]) -> GridCell | None:
    from robust_pfl.experiments import parse_and_validate

    try:
        config = parse_and_validate(payload, source)
    except ConfigError as error:
        for where, message in _parsed(error):
            _add(problems, _attributed(where, message, axes, choice))
        return None
    return grid_cell(config, {axis.column: axis.labels[index] for axis, index in zip(axes, choice)})


_PROBLEM = re.compile(r"  ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\d+\])*): (.*)")
_LEADING_PATH = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\d+\])*)")


def _parsed(error: ConfigError) -> list[tuple[str, str]]:
    """``(field, message)`` of each line of a :func:`robust_pfl.config.config_error`."""
    out = []
    for line in str(error).splitlines()[1:]:
        match = _PROBLEM.fullmatch(line)
        out.append((match[1], match[2]) if match else ("", line.strip()))
    return out


def _tokens(path: str) -> tuple[str | int, ...]:
    return tuple(int(index) if index else name for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path))


def _attributed(where: str, message: str, axes: list[_Axis], choice: tuple[int, ...]) -> tuple[str, str]:
    """Report a cell's problem at ``where`` against the axis element that set that
    field (or a table holding it): ``grid.attack[2].name``; a problem no axis touches
    is the base config's, named by its own field."""
    path = _tokens(where or (_LEADING_PATH.match(message) or [""])[0])
    best: tuple[int, str] | None = None
    for axis, index in zip(axes, choice):
        target = axis.target
        if path[: len(target)] == target:
            rest = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[len(target):])
            candidate = (len(target), f"{axis.field}[{index}]{rest}")
        elif path and target[: len(path)] == path:
            candidate = (len(path), f"{axis.field}[{index}]")
        else:
            continue
        if best is None or candidate[0] > best[0]:
            best = candidate
    return (where, message) if best is None else (best[1], message)


def _same_run(axes: list[_Axis], first: tuple[int, ...], again: tuple[int, ...]) -> tuple[str, str]:
    differ = [(axis, a, b) for axis, a, b in zip(axes, first, again) if a != b]
    axis, a, b = differ[0]
    return f"{axis.field}[{b}]", f"gives the same run as {axis.field}[{a}] (only the label differs); cells must differ"


def _grid_error(source: str, problems: Sequence[tuple[str, str]]) -> ConfigError:
    lines = [f"invalid grid {source}:"]
    lines += [f"  {where}: {message}" if where else f"  {message}" for where, message in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        lines.append(f"  ... and {len(problems) - MAX_PROBLEMS} more")
    return ConfigError("\n".join(lines))
