"""Name -> class registries (attacks, algorithms, aggregators), their decorator, and
the option checks shared by everything built from a user's ``{name, options}``."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Iterable, Mapping, TypeVar

T = TypeVar("T", bound=type)

#: The default shown for a constructor parameter that has none.
REQUIRED = "required"


def registrar(registry: dict[str, T], kind: str, check: Callable[[T], None] | None = None) -> Callable[[T], T]:
    """A class decorator adding ``cls`` to ``registry`` under ``cls.name``; a name
    registered twice is an error.  ``check(cls)`` may reject a class (ValueError)."""

    def register(cls: T) -> T:
        if cls.name in registry:
            raise ValueError(f"{kind} {cls.name!r} registered twice")
        if check is not None:
            check(cls)
        registry[cls.name] = cls
        return cls

    register.__doc__ = f"Class decorator: add a {kind} class to the registry under ``cls.name``."
    return register


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
    options = list(options)
    unknown = [key for key in options if key not in parameters]
    missing = [key for key, value in parameters.items() if value is REQUIRED and key not in options]
    if not unknown and not missing:
        return
    listed = ", ".join(
        f"{key} (required)" if value is REQUIRED else f"{key} (default {value!r})" for key, value in parameters.items()
    )
    if unknown:
        problem = f"{where}.{unknown[0]} is not an option{did_you_mean(unknown[0], parameters)}"
    else:
        problem = f"{where}: the required field {missing[0]!r} is missing"
    raise ValueError(f"{problem}; {owner} accepts the fields: {listed or 'none'}")
