"""Plug-ins: a user's modules that register attacks, aggregators or algorithms (with
``attacks.register``, ``defenses.register``, ``defenses.register_aggregator``) so that
run and grid files can name them without any edit to the package.

Two ways in, both imported before a config is validated:

* ``plugins = ["my_attacks", "path/to/my_defense.py"]`` in a run or grid file: a
  dotted module name importable from here, or the path of a ``.py`` file (relative to
  the config file's directory, or to the working directory for a dict);
* an installed package's entry points in the group :data:`ENTRY_POINT_GROUP`
  (``[project.entry-points."robust_pfl.plugins"] my = "my_package.attacks"``), loaded
  once per process.

A file is imported under its stem as module name, so every process (a grid's worker
imports the config's plug-ins again) gives its classes the same name.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Sequence

from robust_pfl.config import ConfigError

ENTRY_POINT_GROUP = "robust_pfl.plugins"


def resolved(entries: Sequence[str], base_dir: Path | None = None) -> list[str]:
    """``entries`` with every ``.py`` path made absolute (against ``base_dir``, else the
    working directory); module names unchanged."""
    out = []
    for entry in entries:
        if entry.endswith(".py"):
            path = Path(entry)
            out.append(str(path if path.is_absolute() else (base_dir or Path.cwd()) / path))
        else:
            out.append(entry)
    return out


def with_resolved_paths(data: dict[str, Any], base_dir: Path | None = None) -> dict[str, Any]:
    """A config mapping whose ``plugins`` (when a list of strings) have their ``.py``
    paths made absolute (:func:`resolved`); anything else is left for validation."""
    entries = data.get("plugins")
    if isinstance(entries, list) and all(isinstance(entry, str) for entry in entries):
        return {**data, "plugins": resolved(entries, base_dir)}
    return data


def load_plugins(entries: Any, source: str | None = None) -> None:
    """Import the installed entry points (once) and every entry of ``entries`` (a
    config's ``plugins``).  Raises :class:`ConfigError` naming ``plugins[i]`` for an
    entry that is not a string or fails to import, with the reason."""
    load_entry_points()
    if entries is None:
        return
    where = "invalid config" + (f" {source}" if source else "") + ":"
    if not isinstance(entries, list):
        raise ConfigError(f"{where}\n  plugins: must be a list of module names or .py paths, got {entries!r}")
    for index, entry in enumerate(entries):
        if not isinstance(entry, str) or not entry:
            raise ConfigError(f"{where}\n  plugins[{index}]: must be a module name or a .py path, got {entry!r}")
        try:
            _import(entry)
        except Exception as error:  # noqa: BLE001 - any failure of the user's module is a config error
            reason = f"{type(error).__name__}: {error}"
            raise ConfigError(f"{where}\n  plugins[{index}]: cannot import {entry!r} ({reason})") from None


def _import(entry: str) -> None:
    if not entry.endswith(".py"):
        importlib.import_module(entry)
        return
    path = Path(entry)
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
        return  # imported already (a plug-in registers its classes once)
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


@functools.lru_cache(maxsize=1)
def load_entry_points() -> tuple[str, ...]:
    """Import every module of the :data:`ENTRY_POINT_GROUP` entry points (once per
    process); returns their names."""
    names = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        point.load()
        names.append(point.name)
    return tuple(names)
