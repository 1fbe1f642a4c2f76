"""What is registered, for ``robust-pfl attacks`` and ``robust-pfl defenses`` (algorithms,
robust aggregators, pre-aggregators): one line per entry (name, tags, summary) and its
parameters with defaults, as a config file writes them, wrapped to the terminal.

Reads any registered class: attack, aggregator and pre-aggregator dataclasses (each
option's description from its pydantic ``Field``, or a plain dataclass field's
``metadata["description"]``), and algorithms whose parameters are a pydantic model
(``cls.Params``).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import textwrap
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from robust_pfl.engine.registry import REQUIRED, init_parameters
from robust_pfl.engine.types import AttackBase
from robust_pfl.engine.validation import descriptions

if TYPE_CHECKING:
    from defenses import Aggregator, Algorithm, PreAggregator

#: What a config names for no attack (``attacks.NO_ATTACK``; the core does not import
#: ``attacks``).
NO_ATTACK_NAME = "none"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One registered class as shown to a user."""

    name: str
    summary: str
    tags: tuple[str, ...] = ()
    parameters: tuple[tuple[str, str], ...] = ()  # (name, "default  description")


def parameters_of(cls: type) -> tuple[tuple[str, str], ...]:
    """``(name, text)`` for every constructor parameter of a dataclass (fields with
    ``init=False`` are the class's own state, not options) or every field of a
    pydantic model (an algorithm's ``Params``); ``text`` is the default, as a config
    file writes it, and the option's one-line description where it has one."""
    model = cls
    if isinstance(model, type) and issubclass(model, BaseModel):
        rows = []
        for name, info in model.model_fields.items():
            default = REQUIRED if info.default is PydanticUndefined and info.default_factory is None else (
                info.default_factory() if info.default is PydanticUndefined else info.default
            )
            rows.append((info.alias or name, _text(default, info.description)))
        return tuple(rows)
    if dataclasses.is_dataclass(cls):
        described = descriptions(cls)
        return tuple((name, _text(default, described.get(name))) for name, default in init_parameters(cls).items())
    return ()


def _text(default: Any, description: str | None) -> str:
    shown = REQUIRED if default is REQUIRED else f"default {toml_value(default)}"
    return f"{shown}  {description}" if description else shown


def toml_value(value: Any) -> str:
    """``value`` as a config file writes it: ``"away"``, ``true``, ``0.05``, ``nan``,
    ``[1, 2]``, ``{kind = "complete", p = 0.06}``; ``unset`` for None (TOML has no
    null: leave the key out)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple, frozenset, set)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return str(value)


def attack_entries(registry: Mapping[str, type[AttackBase]]) -> list[Entry]:
    """The ``none`` attack, then every registered attack by name, tagged with what it
    needs (omniscient, adaptive, data)."""
    none = Entry(NO_ATTACK_NAME, "no attack: the Byzantine clients send what honest ones would (no options)")
    return [none, *(Entry(name, cls.summary, tuple(sorted(cls.needs)), parameters_of(cls))
                    for name, cls in sorted(registry.items()))]


def algorithm_entries(registry: Mapping[str, type[Algorithm]]) -> list[Entry]:
    """Every registered algorithm by name, with its reference and whether it forms
    clusters."""
    return [Entry(name, _with_reference(cls.summary, cls.reference), ("forms clusters",) if cls.forms_clusters else (),
                  parameters_of(cls.Params))
            for name, cls in sorted(registry.items())]


def aggregator_entries(registry: Mapping[str, type[Aggregator] | type[PreAggregator]]) -> list[Entry]:
    """Every registered robust aggregator (or pre-aggregator: the same class
    attributes) by name, with its reference."""
    return [Entry(name, _with_reference(cls.summary, cls.reference), (), parameters_of(cls))
            for name, cls in sorted(registry.items())]


def _with_reference(summary: str, reference: str) -> str:
    return f"{summary} [{reference}]" if reference else summary


def render(title: str, items: Iterable[Entry], verbose: bool = True, width: int | None = None) -> str:
    """Plain-text listing: ``name  [tags]: summary`` then the indented parameters,
    wrapped to ``width`` columns (default: the terminal's, 100 when not a terminal)."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    lines = [title]
    for entry in items:
        tags = f"  [{', '.join(entry.tags)}]" if entry.tags else ""
        lines += textwrap.wrap(f"{entry.name}{tags}: {entry.summary}", width, initial_indent="  ",
                               subsequent_indent="    ", break_on_hyphens=False)
        if verbose:
            for name, text in entry.parameters:
                lines += textwrap.wrap(f"{name}: {text}", width, initial_indent="      ",
                                       subsequent_indent="          ", break_on_hyphens=False)
    return "\n".join(lines)
