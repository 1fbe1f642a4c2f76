"""CIFAR-10 and CIFAR-100 from the standard python pickle batches.

CIFAR-10: ``data_batch_1`` ... ``data_batch_5`` and ``test_batch``, each a dict with
``b"data"`` (uint8 ``[n, 3072]``, channel-major 3x32x32 rows) and ``b"labels"``.
CIFAR-100: ``train`` and ``test`` with ``b"data"``, ``b"fine_labels"`` and
``b"coarse_labels"``.  The directory given may be the batch directory itself or its
parent holding the usual ``cifar-10-batches-py`` / ``cifar-100-python``.

Security: unpickling can run arbitrary code.  These loaders unpickle only the files of
the directory the user points them at (``data_dir`` or ``$ROBUST_PFL_DATA``); point them
only at data you trust.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from robust_pfl.engine.datasets.base import DatasetError, LabelledImages, check_counts, check_labels
from robust_pfl.engine.datasets.paths import missing_files_error, resolve_data_dir

CIFAR_ROW = 3 * 32 * 32
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = ("test_batch",)
CIFAR10_SUBDIR = "cifar-10-batches-py"
CIFAR100_TRAIN = ("train",)
CIFAR100_TEST = ("test",)
CIFAR100_SUBDIR = "cifar-100-python"
CIFAR100_CLASSES = {"fine": 100, "coarse": 20}


def read_batch(path: Path) -> dict[Any, Any]:
    """Unpickle one batch file (``encoding="bytes"``) into its dict.

    Raises:
        DatasetError: the file is truncated, corrupt, or not a pickled dict.
    """
    try:
        with path.open("rb") as file:
            batch = pickle.load(file, encoding="bytes")
    except Exception as error:  # unpickling corrupt data raises almost any exception type
        raise DatasetError(
            f"{path}: could not unpickle a CIFAR batch ({type(error).__name__}: {error})"
        ) from error
    if not isinstance(batch, dict):
        raise DatasetError(f"{path}: expected a pickled dict, found {type(batch).__name__}")
    return batch


def _field(batch: dict[Any, Any], key: str, path: Path) -> Any:
    """``batch[key]``, accepting bytes keys (python-2 pickles) or str keys."""
    for candidate in (key.encode(), key):
        if candidate in batch:
            return batch[candidate]
    found = ", ".join(sorted(repr(k) for k in batch))
    raise DatasetError(f"{path}: expected key b{key!r}, found keys: {found or 'none'}")


def read_labelled_batch(
    path: Path, label_key: str, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(images [n, 3, 32, 32] uint8, labels [n] int64)`` of one validated batch file."""
    batch = read_batch(path)
    data = _field(batch, "data", path)
    is_array = isinstance(data, np.ndarray)
    if not is_array or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != CIFAR_ROW:
        found = f"{data.dtype} array {list(data.shape)}" if is_array else type(data).__name__
        raise DatasetError(
            f"{path}: expected b'data' as a uint8 [n, {CIFAR_ROW}] array, found {found}"
        )
    try:
        labels = np.asarray(_field(batch, label_key, path), dtype=np.int64)
    except (TypeError, ValueError) as error:
        raise DatasetError(f"{path}: b{label_key!r} is not a list of integers ({error})") from error
    check_labels(labels, num_classes, f"{path} [{label_key}]")
    check_counts(data.shape[0], labels.shape[0], f"{path} [data]", f"{path} [{label_key}]")
    return data.reshape(-1, 3, 32, 32), labels


def _batch_dir(directory: Path, subdir: str, names: Sequence[str], dataset: str) -> Path:
    """``directory`` or ``directory / subdir``, whichever holds all ``names``."""
    for candidate in (directory, directory / subdir):
        if all((candidate / name).is_file() for name in names):
            return candidate
    nested = directory / subdir
    base = nested if nested.is_dir() else directory
    missing = [name for name in names if not (base / name).is_file()]
    raise missing_files_error(base, names, dataset, missing, f" (or all of them in {subdir}/)")


def _load(
    data_dir: str | Path | None,
    dataset: str,
    subdir: str,
    files: tuple[Sequence[str], Sequence[str]],
    label_key: str,
    num_classes: int,
    name: str,
) -> LabelledImages:
    """Shared body of the CIFAR loaders: locate, read and stack train and test batches."""
    train_names, test_names = files
    directory = resolve_data_dir(data_dir, dataset, markers=(train_names[0], subdir))
    directory = _batch_dir(directory, subdir, [*train_names, *test_names], dataset)

    def stack(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        parts = [read_labelled_batch(directory / n, label_key, num_classes) for n in names]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    return LabelledImages.from_arrays(name, num_classes, stack(train_names), stack(test_names))


def load_cifar10(data_dir: str | Path | None = None) -> LabelledImages:
    """CIFAR-10: 50000 train and 10000 test 3x32x32 colour images, 10 classes."""
    files = (CIFAR10_TRAIN, CIFAR10_TEST)
    return _load(data_dir, "cifar10", CIFAR10_SUBDIR, files, "labels", 10, "cifar10")


def load_cifar100(
    data_dir: str | Path | None = None, *, label_kind: Literal["fine", "coarse"] = "fine"
) -> LabelledImages:
    """CIFAR-100: 50000 train and 10000 test 3x32x32 colour images.

    Args:
        data_dir: the batch directory or its parent; ``None`` uses ``$ROBUST_PFL_DATA``.
        label_kind: ``"fine"`` (100 classes, name ``"cifar100"``) or ``"coarse"`` (20
            superclasses, name ``"cifar100_coarse"``).
    """
    if label_kind not in CIFAR100_CLASSES:
        raise DatasetError(f"cifar100: label_kind must be 'fine' or 'coarse', found {label_kind!r}")
    name = "cifar100" if label_kind == "fine" else "cifar100_coarse"
    return _load(
        data_dir,
        "cifar100",
        CIFAR100_SUBDIR,
        (CIFAR100_TRAIN, CIFAR100_TEST),
        f"{label_kind}_labels",
        CIFAR100_CLASSES[label_kind],
        name,
    )
