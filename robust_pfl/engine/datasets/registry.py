"""Data sets by name: ``load_dataset("mnist", data_dir)``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robust_pfl.engine.datasets.base import DatasetError, LabelledImages
from robust_pfl.engine.datasets.cifar import load_cifar10, load_cifar100
from robust_pfl.engine.datasets.digits import load_digits
from robust_pfl.engine.datasets.idx import load_fashion_mnist, load_mnist

Loader = Callable[..., LabelledImages]


def _digits(data_dir: str | Path | None = None, **options: Any) -> LabelledImages:
    """:func:`load_digits`, ignoring ``data_dir`` (the data ship with scikit-learn)."""
    return load_digits(**options)


#: name -> ``loader(data_dir, **options)``.
DATASETS: dict[str, Loader] = {
    "mnist": load_mnist,
    "fashion_mnist": load_fashion_mnist,
    "digits": _digits,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
}


def load_dataset(name: str, data_dir: str | Path | None = None, **options: Any) -> LabelledImages:
    """Load the data set ``name`` (a key of :data:`DATASETS`; ``-`` reads as ``_``).

    Args:
        name: e.g. ``"digits"`` (no files needed), ``"mnist"``, ``"cifar100"``.
        data_dir: the directory of its files; ``None`` uses ``$ROBUST_PFL_DATA``.
            Ignored by ``"digits"``.
        **options: passed to the loader (``test_fraction``/``seed`` for digits,
            ``label_kind`` for cifar100).

    Raises:
        DatasetError: unknown name, or a loader's error.
    """
    key = name.strip().lower().replace("-", "_")
    if key not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; allowed: {', '.join(sorted(DATASETS))}")
    identity = (key, _files_signature(key, data_dir), repr(sorted(options.items())))
    if identity not in _LOADED:
        if len(_LOADED) >= _KEPT:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[identity] = DATASETS[key](data_dir, **options)
    return _LOADED[identity]


#: The data sets loaded in this process, by name, files and options (a grid's worker
#: runs many cells of one data set: MNIST's files are decoded once, not once a cell).
_LOADED: dict[tuple[str, tuple[Any, ...], str], LabelledImages] = {}
_KEPT = 2


def _files_signature(key: str, data_dir: str | Path | None) -> tuple[Any, ...]:
    """What identifies the files a loader would read: the directory it would look in
    (``data_dir``, else ``$ROBUST_PFL_DATA``) and every file under it with its size and
    modification time (a file replaced is read again); ``()`` for the embedded digits."""
    if key == "digits":
        return ()
    root = Path(data_dir if data_dir is not None else os.environ.get("ROBUST_PFL_DATA", "")).expanduser()
    if not root.is_dir():
        return (str(root),)
    files = sorted((str(path), path.stat().st_size, path.stat().st_mtime_ns)
                   for path in root.rglob("*") if path.is_file())
    return (str(root.resolve()), *files)
