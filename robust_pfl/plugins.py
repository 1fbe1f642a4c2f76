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

A file is imported under its stem as module name, so every process gives its classes
the same name.

A grid's cells run in other processes (a local pool, Ray workers, perhaps on other
machines), which must register the same classes before they validate a cell's config.
Each cell's task therefore carries its plug-ins' source text (:func:`shipped_sources`)
and the worker executes it (:func:`install_sources`) before the cell is built.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import linecache
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Sequence

from robust_pfl.engine.errors import ConfigError

ENTRY_POINT_GROUP = "robust_pfl.plugins"
#: The attribute holding the source text a plug-in file was executed from.
SOURCE_ATTRIBUTE = "__robust_pfl_source__"


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
    config's ``plugins``).  Raises :class:`ConfigError` naming ``plugins[i]`` for each
    entry that is not a string or fails to import, with the reason
    (:func:`plugin_problems`)."""
    problems = plugin_problems(entries)
    if problems:
        where = "invalid config" + (f" {source}" if source else "") + ":"
        raise ConfigError("\n".join([where, *(f"  {field}: {message}" for field, message in problems)]))


def plugin_problems(entries: Any) -> list[tuple[str, str]]:
    """Import the installed entry points (once) and every entry of ``entries`` that
    imports; ``(field, message)`` for each that is not a string or fails to import.
    Every entry is tried, so that one report names every bad entry (and the config's
    other fields, :func:`robust_pfl.config.check_config`)."""
    load_entry_points()
    if entries is None:
        return []
    if not isinstance(entries, list):
        return [("plugins", f"must be a list of module names or .py paths, got {entries!r}")]
    problems = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, str) or not entry:
            problems.append((f"plugins[{index}]", f"must be a module name or a .py path, got {entry!r}"))
            continue
        try:
            _import(entry)
        except Exception as error:  # noqa: BLE001 - any failure of the user's module is a config error
            problems.append((f"plugins[{index}]", f"cannot import {entry!r} ({type(error).__name__}: {error})"))
    return problems


def _import(entry: str) -> None:
    if not entry.endswith(".py"):
        importlib.import_module(entry)
        return
    path = Path(entry)
    if _loaded(path.stem, path):
        return  # imported already (a plug-in registers its classes once)
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    _execute(path.stem, path, importlib.util.decode_source(path.read_bytes()))


def _loaded(name: str, path: Path) -> bool:
    """Whether module ``name`` is imported already, from the file ``path``."""
    loaded = sys.modules.get(name)
    return loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve()


def _execute(name: str, path: Path, text: str) -> None:
    """Import ``text`` as module ``name`` whose ``__file__`` is ``path`` (which need
    not exist here), keeping the text on the module (:data:`SOURCE_ATTRIBUTE`) and in
    :mod:`linecache`, so tracebacks show its lines on a machine without the file."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    setattr(module, SOURCE_ATTRIBUTE, text)
    linecache.cache[str(path)] = (len(text), None, text.splitlines(keepends=True), str(path))
    sys.modules[name] = module
    try:
        exec(compile(text, str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - the user's plug-in
    except BaseException:
        sys.modules.pop(name, None)
        raise


# -- plug-ins shipped with a grid's cells ------------------------------------------------------
@dataclass(frozen=True)
class PluginSource:
    """One plug-in module's source text, as the grid's process imported it."""

    index: int  # its position in the config's ``plugins``
    entry: str  # that entry: an absolute ``.py`` path, or a module name
    module: str  # the module name it is imported under
    origin: str  # the file it came from on the grid's machine (its ``__file__`` there)
    text: str


def shipped_sources(entries: Any) -> tuple[PluginSource, ...]:
    """What a grid's cell task carries so that its worker imports the same plug-ins as
    the grid's process: the source text of every ``.py`` entry (the text this process
    executed, else the file's), and of every module name that is a single-file
    top-level module (a package, or ``pkg.mod``, is not shipped: it must be importable
    on the workers, as ``robust-pfl`` itself must be installed there).  Call it after
    :func:`load_plugins` imported ``entries``.

    Why the text travels inside the task rather than by path, or by Ray's
    ``runtime_env`` (``py_modules`` / ``working_dir``):

    * a path names a file on the grid's machine; a cluster node may not have it, or
      may have another version of it.  The text is exactly what the grid validated
      its cells against, on every node and for every backend (one code path for the
      local pool and Ray);
    * a ``runtime_env`` uploads a directory (not one file) to the cluster and starts
      dedicated workers for it (seconds per worker), needs the driver to own the
      job's environment (a driver joining a cluster, or through Ray Client, may have
      its own), and would still leave the config naming the driver's path;
    * plug-ins are small (a few kB each): copying the text into each task costs
      nothing next to a cell's run.

    A plug-in file that imports sibling modules of its own needs those importable on
    the workers (installed, or on their ``PYTHONPATH``), as it needs them here.
    """
    if not isinstance(entries, list):
        return ()
    shipped = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, str) or not entry:
            continue
        if entry.endswith(".py"):
            path = Path(entry)
            shipped.append(PluginSource(index, entry, path.stem, str(path), _text_of(path.stem, path)))
            continue
        origin = _single_file_origin(entry)
        if origin is not None:
            shipped.append(PluginSource(index, entry, entry, str(origin), _text_of(entry, origin)))
    return tuple(shipped)


def _single_file_origin(name: str) -> Path | None:
    """The ``.py`` file of top-level module ``name`` when it is one (not a package)."""
    if "." in name:
        return None
    module = sys.modules.get(name)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is not None or not spec.origin:
        return None
    origin = Path(spec.origin)
    return origin if origin.suffix == ".py" and origin.is_file() else None


def _text_of(name: str, path: Path) -> str:
    """The source module ``name`` was executed from here, else ``path``'s text."""
    module = sys.modules.get(name)
    text = getattr(module, SOURCE_ATTRIBUTE, None)
    if isinstance(text, str) and _loaded(name, path):
        return text
    return importlib.util.decode_source(path.read_bytes())


def install_sources(sources: Sequence[PluginSource], source: str | None = None) -> None:
    """Import shipped plug-ins in a worker before its cell's config is parsed (whose
    :func:`load_plugins` then finds them imported).  A ``.py`` plug-in is executed
    from the shipped text, unless this process imported it already (a worker runs
    several cells; an in-process backend is the grid's own process).  A module name
    importable here is left to :func:`load_plugins`; one that is not (it lay on the
    grid machine's ``sys.path`` only) is executed from the shipped text.  Raises
    :class:`ConfigError` naming ``plugins[i]`` for a plug-in that fails."""
    for shipped in sources:
        name, origin = shipped.module, Path(shipped.origin)
        if shipped.entry.endswith(".py"):
            if _loaded(name, origin):
                continue
        elif name in sys.modules or importlib.util.find_spec(name) is not None:
            continue
        try:
            _execute(name, origin, shipped.text)
        except Exception as error:  # noqa: BLE001 - any failure of the user's module is a config error
            where = "invalid config" + (f" {source}" if source else "") + ":"
            reason = f"{type(error).__name__}: {error}"
            raise ConfigError(
                f"{where}\n  plugins[{shipped.index}]: cannot import {shipped.entry!r} "
                f"(shipped with the cell) ({reason})"
            ) from None


@functools.lru_cache(maxsize=1)
def load_entry_points() -> tuple[str, ...]:
    """Import every module of the :data:`ENTRY_POINT_GROUP` entry points (once per
    process); returns their names."""
    names = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        point.load()
        names.append(point.name)
    return tuple(names)
