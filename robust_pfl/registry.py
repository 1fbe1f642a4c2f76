"""Name -> class registries (attacks, algorithms, aggregators) and their decorator."""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T", bound=type)


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
