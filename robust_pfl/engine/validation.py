"""One validation style for everything a user configures by name and options.

Attacks, aggregators and radius policies are frozen pydantic dataclasses made by
:func:`options` (strict types, unknown options refused, one ``Field`` per option with
its constraints and a one-line ``description``); algorithm parameters are pydantic
models (:class:`defenses.base.AlgorithmParams`).  Whatever pydantic refuses is told
the same way, by :func:`explain` (one line per field, joined by ``"; "``):

* ``<where>.<field> must be <allowed>, got <value>``, ``<allowed>`` read from the
  field's type and constraints (``an integer >= 0 or None``, ``a number in [0, 0.5)``,
  ``a finite number > 0``, ``one of ['own', 'mean']``), with ``(did you mean 'x'?)``
  for a misspelled choice;
* ``<where>.<key> is not an option (did you mean ...?); <kind> '<name>' accepts the
  fields: ...`` for an unknown option, ``<where>: the required field 'q' is missing``
  for a missing one (:func:`robust_pfl.engine.registry.check_options`'s wording);
* a validator's own message as written where it names its fields (the cross-field
  rules of ``__post_init__``), and after ``<where>.<field>`` where a field validator
  raised it (``bucketing.inner: aggregator.name must be one of ...``).

A user's class may stay a plain ``@dataclasses.dataclass(frozen=True)`` validating in
``__post_init__``: registries build both alike (:func:`robust_pfl.engine.registry.check_options`
first, then the class).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Mapping as AbcMapping
from collections.abc import Sequence as AbcSequence
from typing import Annotated, Any, Callable, Iterable, Literal, Mapping, TypeVar, Union, get_args, get_origin

import pydantic.dataclasses
from pydantic import ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from robust_pfl.engine.registry import REQUIRED, did_you_mean, init_parameters, options_problem

T = TypeVar("T", bound=type)

#: The pydantic configuration of every option class: TOML types are exact (``true`` is
#: not 1, ``"0.2"`` not 0.2), unknown options are refused, and a number must be finite
#: unless its field says ``allow_inf_nan=True``.
OPTIONS_CONFIG = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

_UNKNOWN = frozenset({"unexpected_keyword_argument", "extra_forbidden"})
_MISSING = frozenset(
    {"missing_argument", "missing", "missing_keyword_only_argument", "missing_positional_only_argument"}
)
_RAISED = frozenset({"value_error", "assertion_error"})
_CALL = frozenset({"multiple_argument_values", "unexpected_positional_argument"})


def options(kind: str, where: str | None = None) -> Callable[[T], T]:
    """Class decorator: ``cls`` as a frozen pydantic dataclass of
    :data:`OPTIONS_CONFIG` whose construction raises ``ValueError`` worded by
    :func:`explain` instead of pydantic's ``ValidationError``.

    ``kind`` names what it is (``"attack"``, ``"aggregator"``, ``"radius policy"``);
    ``where`` the prefix of its field names in messages (default: the class's
    ``name``, e.g. ``bit_flip.scale``; ``""``: none).  It stays a dataclass: ``dataclasses.fields``
    and ``replace``, equality, hashing and pickling work as for a plain one, and a
    field written ``x: Annotated[float, Field(gt=0, description=...)] = 1.0`` keeps
    its plain default.  Cross-field rules stay in ``__post_init__`` (run after the
    fields are validated), raising ``ValueError`` that names the fields."""

    def decorate(cls: T) -> T:
        cls = pydantic.dataclasses.dataclass(frozen=True, config=OPTIONS_CONFIG)(cls)
        validate = cls.__init__

        @functools.wraps(validate)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            owner = type(self)
            given = _given(owner, args, kwargs)
            try:
                if given is None:  # too many or repeated arguments: pydantic says which
                    validate(self, *args, **kwargs)
                else:  # by name, so that an error's location is the field's name
                    validate(self, **given)
            except ValidationError as error:
                name = getattr(owner, "name", owner.__name__)
                raise ValueError(
                    explain(
                        error,
                        where=name if where is None else where,
                        owner=f"{kind} {name!r}",
                        fields=owner.__pydantic_fields__,
                        given=given if given is not None else kwargs,
                        parameters=init_parameters(owner),
                        allow_inf_nan=OPTIONS_CONFIG["allow_inf_nan"],
                    )
                ) from None

        cls.__init__ = __init__
        return cls

    return decorate


def descriptions(cls: type) -> dict[str, str]:
    """``{option: description}`` of a class's options that have one: the pydantic
    ``Field`` descriptions of an :func:`options` class, or a plain dataclass field's
    ``metadata["description"]``."""
    described = {name: info.description for name, info in getattr(cls, "__pydantic_fields__", {}).items()}
    if dataclasses.is_dataclass(cls):
        for item in dataclasses.fields(cls):
            described[item.name] = described.get(item.name) or item.metadata.get("description")
    return {name: text for name, text in described.items() if text}


def _given(cls: type, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The options of a constructor call by name (positional ones by field order), or
    ``None`` for more positional arguments than fields or a field given twice."""
    names = [item.name for item in dataclasses.fields(cls) if item.init]
    if len(args) > len(names) or any(name in kwargs for name in names[: len(args)]):
        return None
    return {**dict(zip(names, args)), **kwargs}


def explain(
    error: ValidationError,
    *,
    where: str,
    owner: str,
    fields: Mapping[str, FieldInfo],
    given: Mapping[str, Any],
    parameters: Mapping[str, Any] | None = None,
    allow_inf_nan: bool = True,
) -> str:
    """The message of a pydantic ``error`` raised validating ``given`` against
    ``fields`` (see the module docstring): one problem per field, in pydantic's order.

    Args:
        where: the prefix of field names (``"bit_flip"``, ``"radius"``).
        owner: what was asked for, for unknown options (``"attack 'bit_flip'"``).
        fields: the pydantic fields (``__pydantic_fields__`` / ``model_fields``).
        given: the options as written (reported as given, whole, per field).
        parameters: ``{name: default}`` listed with an unknown option (default:
            from ``fields``).
        allow_inf_nan: the model's default for numbers without their own setting.
    """
    if parameters is None:
        parameters = {name: _default(info) for name, info in fields.items()}
    problems: list[str] = []
    done: set[Any] = set()
    for item in error.errors(include_url=False):
        loc, kind = tuple(item["loc"]), item["type"]
        if kind in _UNKNOWN or kind in _MISSING:
            key: Any = "options"
            text = options_problem(where, owner, list(given), parameters) or f"{where}: {item['msg']}"
        elif kind in _RAISED:
            key = ("raised", loc)
            message = str(item.get("ctx", {}).get("error", item["msg"]))
            text = _after(_field(where, _path(loc)), message) if loc else message
        elif kind in _CALL:
            key = ("call", loc)
            text = f"{where}: {item['msg'].lower()} ({_path(loc)})"
        elif loc and loc[0] in fields:
            key = loc[0]
            value = given[loc[0]] if loc[0] in given else item.get("input")
            text = f"{_field(where, loc[0])} {problem(fields[loc[0]], value, allow_inf_nan)}"
        else:
            key = ("other", loc, item["msg"])
            text = f"{_field(where, _path(loc))}: {item['msg']}" if loc else f"{where}: {item['msg']}"
        if key not in done:
            done.add(key)
            problems.append(text)
    return "; ".join(problems)


def problem(info: FieldInfo, value: Any, allow_inf_nan: bool = True) -> str:
    """``must be <allowed>, got <value>`` for a value ``info`` refuses, with a
    did-you-mean when ``value`` is a misspelled choice."""
    choices = literal_choices(info.annotation)
    hint = did_you_mean(value, choices) if isinstance(value, str) and choices else ""
    return f"must be {allowed(info, allow_inf_nan)}, got {value!r}{hint}"


def allowed(info: FieldInfo, allow_inf_nan: bool = True) -> str:
    """What a field accepts, in words, from its type and constraints:
    ``an integer >= 0 or None``, ``a number in [0, 1]``, ``one of ['a', 'b']`` ..."""
    return _describe(info.annotation, list(info.metadata), allow_inf_nan)


def literal_choices(annotation: Any) -> list[Any]:
    """Every ``Literal`` value inside ``annotation`` (through unions and
    ``Annotated``)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return list(get_args(annotation))
    if origin is Annotated:
        return literal_choices(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [choice for argument in get_args(annotation) for choice in literal_choices(argument)]
    return []


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()
    return REQUIRED if info.is_required() else info.default


def _field(where: str, name: str) -> str:
    """``where.name``, or ``name`` alone where the class's fields need no prefix."""
    return f"{where}.{name}" if where else name


def _after(prefix: str, message: str) -> str:
    """``prefix must be ...`` or ``prefix: message``."""
    return f"{prefix} {message}" if message.startswith("must be") else f"{prefix}: {message}"


def _path(loc: Iterable[Any]) -> str:
    """``scales[1]`` for pydantic's location ``("scales", 1)``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _constraints(metadata: Iterable[Any]) -> list[Any]:
    """``metadata`` with every nested ``FieldInfo`` opened into its own metadata."""
    flat: list[Any] = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            flat.extend(_constraints(item.metadata))
        else:
            flat.append(item)
    return flat


def _constraint(metadata: list[Any], name: str) -> Any:
    for item in metadata:
        value = getattr(item, name, None)
        if value is not None:
            return value
    return None


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _describe(annotation: Any, metadata: list[Any], allow_inf_nan: bool) -> str:
    metadata = _constraints(metadata)
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        return _describe(inner, [*metadata, *extra], allow_inf_nan)
    if origin in (Union, types.UnionType):
        arguments = get_args(annotation)
        parts = [_describe(argument, metadata, allow_inf_nan) for argument in arguments if argument is not type(None)]
        return " or ".join(parts + (["None"] if type(None) in arguments else []))
    if origin is Literal:
        return f"one of {list(get_args(annotation))}"
    if annotation is type(None) or annotation is None:
        return "None"
    if annotation is bool:
        return "true or false"
    if annotation is int:
        return "an integer" + _bounds(metadata)
    if annotation is float:
        finite = _constraint(metadata, "allow_inf_nan")
        finite = not (allow_inf_nan if finite is None else finite)
        bounds = _bounds(metadata)
        if bounds.startswith(" in "):  # an interval: finite anyway
            return "a number" + bounds
        return ("a finite number" if finite else "a number") + bounds
    if annotation is str:
        return "a string"
    if annotation in (dict, AbcMapping) or origin in (dict, AbcMapping):
        return "a table"
    if origin in (tuple, list, AbcSequence) or annotation in (tuple, list):
        items = [argument for argument in get_args(annotation) if argument is not Ellipsis]
        least = _constraint(metadata, "min_length")
        head = "a non-empty list" if least == 1 else f"a list of at least {least} items" if least else "a list"
        return head + (f", each {_describe(items[0], [], allow_inf_nan)}" if len(items) == 1 else "")
    if annotation is Any:
        return "any value"
    return f"a {getattr(annotation, '__name__', annotation)}"


def _bounds(metadata: list[Any]) -> str:
    """`` >= 0``, `` in [0, 1)`` ... from ``gt``/``ge``/``lt``/``le`` constraints."""
    gt, ge = _constraint(metadata, "gt"), _constraint(metadata, "ge")
    lt, le = _constraint(metadata, "lt"), _constraint(metadata, "le")
    low, high = (gt if gt is not None else ge), (lt if lt is not None else le)
    if low is not None and high is not None:
        return f" in {'(' if gt is not None else '['}{_number(low)}, {_number(high)}{')' if lt is not None else ']'}"
    if low is not None:
        return f" {'>' if gt is not None else '>='} {_number(low)}"
    if high is not None:
        return f" {'<' if lt is not None else '<='} {_number(high)}"
    return ""
