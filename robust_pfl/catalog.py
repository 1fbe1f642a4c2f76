"""What is registered, for ``robust-pfl attacks`` and ``robust-pfl defenses``: one line
per entry (name, tags, summary) and its parameters with defaults.

Reads any registered class: attack and aggregator dataclasses (each option's
description from its pydantic ``Field``, or a plain dataclass field's
``metadata["description"]``), and algorithms whose parameters are a pydantic model
(``cls.Params``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from robust_pfl.registry import REQUIRED, init_parameters
from robust_pfl.validation import descriptions


@dataclasses.dataclass(frozen=True)
class Entry:
    """One registered class as shown to a user."""

    name: str
    summary: str
    tags: tuple[str, ...] = ()
    parameters: tuple[tuple[str, str], ...] = ()  # (name, "default  description")


def parameters_of(cls: type) -> tuple[tuple[str, str], ...]:
    """``(name, text)`` for every constructor parameter of a dataclass (fields with
    ``init=False`` are the class's own state, not options) or of a pydantic ``Params``
    model (the class itself or ``cls.Params``); ``text`` is the default and the
    option's one-line description where it has one."""
    model = getattr(cls, "Params", cls)
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
    shown = REQUIRED if default is REQUIRED else f"default {default!r}"
    return f"{shown}  {description}" if description else shown


def entries(registry: Mapping[str, type]) -> list[Entry]:
    """Entries of a registry, sorted by name."""
    out = []
    for name in sorted(registry):
        cls = registry[name]
        tags = tuple(sorted(getattr(cls, "needs", ()) or ()))
        if getattr(cls, "forms_clusters", False):
            tags += ("forms clusters",)
        summary = getattr(cls, "summary", "") or (cls.__doc__ or "").strip().splitlines()[0]
        reference = getattr(cls, "reference", "")
        if reference:
            summary = f"{summary} [{reference}]"
        out.append(Entry(name, summary, tags, parameters_of(cls)))
    return out


def render(title: str, items: Iterable[Entry], verbose: bool = True) -> str:
    """Plain-text listing: ``name  [tags]  summary`` then indented parameters."""
    lines = [title]
    for entry in items:
        tags = f"  [{', '.join(entry.tags)}]" if entry.tags else ""
        lines.append(f"  {entry.name}{tags}: {entry.summary}")
        if verbose:
            lines.extend(f"      {name}: {text}" for name, text in entry.parameters)
    return "\n".join(lines)
