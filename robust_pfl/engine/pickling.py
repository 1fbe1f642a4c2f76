"""Checkpoint files: a run's full state, written atomically, read back bit-identically.

A checkpoint is the pickled object graph of a run's state (see
:func:`robust_pfl.experiments.run_method`): the algorithm and, through it, the
federation, so every model, optimiser and momentum buffer, clustering centre and
random stream (``torch.Generator`` pickles its state) the run will read, and the
scratch buffers an algorithm does not leave out (``__getstate__``); the result rows
so far; the round; and the process's global random states.  Objects
that a run rebuilt from its config recreates identically (the task with its data, the
objective, the federation's current training data, the theory tracker) are *shared*:
they are written as references by name, and on loading each name is bound to the
rebuilt run's object of that name, so a checkpoint holds no data set.

The file is written by ``torch.save`` (tensors that share storage stay shared) to a
temporary file in the checkpoint's directory, flushed, ``fsync``-ed and moved into
place with ``os.replace``: a kill at any moment leaves the previous checkpoint or the
new one, never part of one.  Its first object is a header with the format version,
the run's fingerprint (:func:`robust_pfl.checkpoint.fingerprint`) and the round; it is checked before anything else is
read, and a checkpoint of another run is a :class:`CheckpointError` naming the file.

Checkpoints are pickles: load only checkpoints you wrote.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import types
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

import numpy as np
import torch

from robust_pfl.engine.errors import ConfigError
from robust_pfl.engine.objectives import Objective
from robust_pfl.engine.results import remove_stale_temporaries, staged_file

#: Bumped whenever what a checkpoint holds changes; older checkpoints are then refused.
FORMAT_VERSION = 1

#: Classes a checkpoint may name by a module they have since left: ``(module, name)``
#: as pickled -> where it lives now, so that a checkpoint written before a move loads.
MOVED_CLASSES: dict[tuple[str, str], tuple[str, str]] = {
    ("defenses.base", "HeavyBall"): ("defenses.optimiser", "HeavyBall"),
    ("defenses.base", "RoundBuffers"): ("defenses.round_buffers", "RoundBuffers"),
    ("defenses.base", "LocalStart"): ("defenses.round_buffers", "LocalStart"),
}

#: Modules a checkpoint may name that have since moved, as pickled -> where their
#: classes live now (a package that re-exports them), so that a checkpoint written
#: before a move loads.  :data:`MOVED_CLASSES` names single classes.
MOVED_MODULES: dict[str, str] = {
    **{f"robust_pfl.{name}": f"robust_pfl.engine.{name}" for name in (
        "types", "federation", "objectives", "data", "graphs", "registry", "validation", "seeding",
        "devices", "networks", "metrics", "placement", "conformance", "results")},
    "robust_pfl.linkage": "robust_pfl.engine.rows",
    "robust_pfl.tasks": "robust_pfl.engine.tasks",
    "robust_pfl.tasks.base": "robust_pfl.engine.tasks.base",
    "robust_pfl.tasks.images": "robust_pfl.engine.tasks.images",
    "robust_pfl.tasks.synthetic": "robust_pfl.engine.tasks.synthetic",
    "robust_pfl.tasks.partition": "robust_pfl.engine.tasks.partition",
    "robust_pfl.tasks.transforms": "robust_pfl.engine.tasks.transforms",
    "robust_pfl.datasets.base": "robust_pfl.engine.datasets.base",
    "defenses.robust_aggregators": "defenses.aggregators",
    "defenses.preaggregators": "defenses.aggregators",
    "defenses.byzfl_aggregators": "defenses.aggregators",
    "defenses.filtering_aggregators": "defenses.aggregators",
}

#: The modules this one's own stand-ins (the header check, shared names) were pickled
#: from: this one, and the one it was split from.
_OWN_MODULES = (__name__, "robust_pfl.checkpoint")


class CheckpointError(ConfigError):
    """A checkpoint that does not belong to the run resuming from it, or cannot be read."""


def shared_objects(roots: Mapping[str, Any]) -> dict[str, Any]:
    """Names for ``roots`` and, recursively, for the tensors, objectives and dataclasses
    in their dataclass fields (``task``, ``task.train``, ``task.train.inputs``, ...):
    the objects a checkpoint refers to by name instead of storing.  ``None`` roots are
    left out."""
    named: dict[str, Any] = {}

    def visit(name: str, value: Any) -> None:
        named[name] = value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                part = getattr(value, field.name, None)
                if isinstance(part, (torch.Tensor, Objective)) or (
                    dataclasses.is_dataclass(part) and not isinstance(part, type)
                ):
                    visit(f"{name}.{field.name}", part)

    for name, root in roots.items():
        if root is not None:
            visit(name, root)
    return named


def global_random_state() -> dict[str, Any]:
    """The process-wide random states (torch's CPU generator, numpy's and Python's
    legacy global ones), for code that draws from them."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_global_random_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`global_random_state` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_checkpoint(
    path: Path, round_index: int, fingerprint: str, state: Any, shared: Mapping[str, Any]
) -> None:
    """Write ``state`` after ``round_index`` rounds atomically to ``path``; the objects
    of ``shared`` (name -> object, see :func:`shared_objects`) are written as their
    names."""
    names = {id(value): name for name, value in reversed(list(shared.items()))}  # first name wins

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            name = names.get(id(obj))
            return NotImplemented if name is None else (_shared, (name,))

    header = _Header(FORMAT_VERSION, fingerprint, round_index)
    _write_atomically(Path(path), lambda handle: torch.save((header, state), handle, pickle_module=_module(Pickler)))


def load_checkpoint(
    path: Path, fingerprint: str, shared: Callable[[int], Mapping[str, Any]]
) -> tuple[int, Any]:
    """``(round, state)`` from the checkpoint at ``path``.  ``shared(round)`` gives the
    objects to bind the checkpoint's names to, as they are after ``round`` rounds; it
    is called once, after the header matched.

    Raises:
        CheckpointError: the header's format or fingerprint differs (another config,
            method or seed), the file is not a checkpoint, or a name has no object.
    """
    path = Path(path)
    expected = fingerprint

    class Unpickler(pickle.Unpickler):
        round_index: int | None = None
        objects: Mapping[str, Any] | None = None

        def find_class(self, module: str, name: str) -> Any:
            if module in _OWN_MODULES and name == "_checked_header":
                return self.check
            if module in _OWN_MODULES and name == "_shared":
                return self.resolve
            module, name = MOVED_CLASSES.get((module, name), (MOVED_MODULES.get(module, module), name))
            return super().find_class(module, name)

        def check(self, format_version: int, fingerprint: str, round_index: int) -> int:
            if format_version != FORMAT_VERSION:
                raise CheckpointError(
                    f"checkpoint {path} has format {format_version}, this version reads format "
                    f"{FORMAT_VERSION}; remove it to start the run afresh"
                )
            if fingerprint != expected:
                raise CheckpointError(
                    f"checkpoint {path} was written by another run (its config, method or seed "
                    "differ); remove it, or run without --resume to start afresh"
                )
            self.round_index = round_index
            return round_index

        def resolve(self, name: str) -> Any:
            if self.round_index is None:
                raise CheckpointError(f"checkpoint {path}: no header before its state")
            if self.objects is None:
                self.objects = shared(self.round_index)
            if name not in self.objects:
                raise CheckpointError(
                    f"checkpoint {path} refers to {name!r}, which this run does not have "
                    f"(it has {sorted(self.objects)})"
                )
            return self.objects[name]

    try:
        round_index, state = torch.load(path, pickle_module=_module(unpickler=Unpickler), weights_only=False)
    except (CheckpointError, FileNotFoundError):
        raise
    except Exception as error:  # a damaged or foreign file
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(error).__name__}: {error}); remove it to start afresh"
        ) from error
    return round_index, state


def remove_checkpoint(path: Path) -> None:
    """Remove the checkpoint at ``path`` and any temporary file a killed save left."""
    path = Path(path)
    path.unlink(missing_ok=True)
    remove_stale_temporaries(path)


class _Header:
    """The first object of a checkpoint; unpickled as a call of the loader's check."""

    def __init__(self, format_version: int, fingerprint: str, round_index: int) -> None:
        self.values = (format_version, fingerprint, round_index)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _checked_header, self.values


def _checked_header(format_version: int, fingerprint: str, round_index: int) -> int:
    """Stands for the header check of :func:`load_checkpoint` (which binds it)."""
    raise CheckpointError("a checkpoint is read with robust_pfl.engine.pickling.load_checkpoint")


def _shared(name: str) -> Any:
    """Stands for a shared object's name in a checkpoint (bound by :func:`load_checkpoint`)."""
    raise CheckpointError("a checkpoint is read with robust_pfl.engine.pickling.load_checkpoint")


def _module(pickler: type | None = None, unpickler: type | None = None) -> types.ModuleType:
    """A ``pickle_module`` for ``torch.save`` / ``torch.load`` with these classes."""
    module = types.ModuleType("robust_pfl_checkpoint_pickle")
    module.__dict__.update({key: value for key, value in vars(pickle).items() if not key.startswith("_")})
    module.Pickler = pickler or pickle.Pickler
    module.Unpickler = unpickler or pickle.Unpickler
    return module


def _write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """``write`` into a temporary file beside ``path``, fsync it, move it into place,
    fsync the directory (so the move itself survives a crash)."""

    def synced(target: Path) -> None:
        with open(target, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())

    os.replace(staged_file(path, synced), path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


