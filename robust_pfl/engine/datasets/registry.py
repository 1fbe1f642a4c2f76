"""Data sets by name: ``load_dataset("mnist", data_dir)``."""

from __future__ import annotations

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
    return DATASETS[key](data_dir, **options)
