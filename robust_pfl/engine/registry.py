"""Name -> class registries (attacks, algorithms, aggregators), their decorator, and
the option checks shared by everything built from a user's ``{name, options}`` (the
wording of pydantic's errors for them is :mod:`robust_pfl.engine.validation`'s)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import inspect
from typing import Any, Callable, Iterable, Mapping, TypeVar

T = TypeVar("T", bound=type)

#: The default shown for a constructor parameter that has none.
REQUIRED = "required"


def registrar(registry: dict[str, T], kind: str, check: Callable[[T], None] | None = None) -> Callable[[T], T]:
    """A class decorator adding ``cls`` to ``registry`` under ``cls.name``.  A class
    without a string ``name`` and ``summary``, one that leaves an abstract method
    unimplemented, and a name registered twice are errors (``TypeError`` /
    ``ValueError``, raised where the class is defined).  ``check(cls)`` may reject a
    class too."""

    def register(cls: T) -> T:
        for attribute in ("name", "summary"):
            if not isinstance(vars_of(cls).get(attribute), str) or not vars_of(cls)[attribute]:
                raise TypeError(f"{kind} class {cls.__name__} must set the class attribute {attribute!r} (a non-empty str)")
        if inspect.isabstract(cls):
            missing = sorted(cls.__abstractmethods__)
            raise TypeError(f"{kind} {cls.name!r} ({cls.__name__}) does not implement {', '.join(missing)}")
        if cls.name in registry:
            raise ValueError(f"{kind} {cls.name!r} registered twice")
        if check is not None:
            check(cls)
        registry[cls.name] = cls
        return cls

    register.__doc__ = f"Class decorator: add a {kind} class to the registry under ``cls.name``."
    return register


def vars_of(cls: type) -> dict[str, Any]:
    """The class attributes ``cls`` sees, its own and inherited (the nearest wins)."""
    seen: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        seen.update(vars(klass))
    return seen


def display_key(key: object) -> str:
    """``key`` as an error shows it: a plain word as is, anything else (``"\\x1e"``,
    ``"a b"``, ``""``) quoted as TOML writes it, so that every error stays one line."""
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_.\[\]-]+", text) else json.dumps(text)  # dots, brackets: a path (methods[0])


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word`` (difflib's ratio at
    least 0.6), else the empty string."""
    close = difflib.get_close_matches(str(word), [str(choice) for choice in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def init_parameters(cls: type) -> dict[str, Any]:
    """``{name: default}`` of a dataclass's constructor parameters, in field order;
    :data:`REQUIRED` for one without a default.  Fields with ``init=False`` (state the
    class sets itself) are not parameters."""
    parameters: dict[str, Any] = {}
    for item in dataclasses.fields(cls):
        if not item.init:
            continue
        if item.default is not dataclasses.MISSING:
            parameters[item.name] = item.default
        elif item.default_factory is not dataclasses.MISSING:
            parameters[item.name] = item.default_factory()
        else:
            parameters[item.name] = REQUIRED
    return parameters


def check_options(where: str, owner: str, options: Iterable[str], parameters: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` for the first key of ``options`` that is not one of
    ``parameters`` (``{name: default}``), ``<where>.<key> is not an option (did you mean
    ...?); <owner> accepts the fields: p (default v), ...``, or for a missing required
    one.  ``owner`` names what was asked for, e.g. ``"attack 'bit_flip'"``."""
    problem = options_problem(where, owner, options, parameters)
    if problem is not None:
        raise ValueError(problem)


def options_problem(where: str, owner: str, options: Iterable[str], parameters: Mapping[str, Any]) -> str | None:
    """:func:`check_options`'s message, or ``None`` when ``options`` are fine."""
    options = list(options)
    unknown = [key for key in options if key not in parameters]
    missing = [key for key, value in parameters.items() if value is REQUIRED and key not in options]
    if not unknown and not missing:
        return None
    listed = ", ".join(
        f"{key} (required)" if value is REQUIRED else f"{key} (default {value!r})" for key, value in parameters.items()
    )
    if unknown:
        problem = f"{where}.{display_key(unknown[0])} is not an option{did_you_mean(unknown[0], parameters)}"
    else:
        problem = f"{where}: the required field {missing[0]!r} is missing"
    return f"{problem}; {owner} accepts the fields: {listed or 'none'}"


def named_spec(spec: Any, registry: Mapping[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    """``(name, options)`` of a config's spec of a registered thing: a name, or a
    mapping with ``name`` and options.  Anything else, or a name ``registry`` lacks,
    raises ``ValueError`` naming ``where`` and the allowed names."""
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("name", None)
    else:
        raise ValueError(f"{where} must be a name or a mapping with 'name', got {spec!r}; names: {sorted(registry)}")
    if not isinstance(name, str) or name not in registry:
        hint = did_you_mean(name, registry) if isinstance(name, str) else ""
        raise ValueError(f"{where}.name must be one of {sorted(registry)}, got {name!r}{hint}")
    return name, options
