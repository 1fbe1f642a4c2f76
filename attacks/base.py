"""Attack registry."""

from __future__ import annotations

from typing import Any, Mapping

from robust_pfl.types import Attack

REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: add an attack class to :data:`REGISTRY` under ``cls.name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"attack {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def build(name: str, options: Mapping[str, Any] | None = None) -> Attack:
    """Construct a registered attack from plain options (validated by the class)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown attack {name!r}; registered: {sorted(REGISTRY)}")
    try:
        return REGISTRY[name](**dict(options or {}))
    except TypeError as error:
        raise ValueError(f"attack {name!r}: {error}") from None
