"""Where a data set's files are: explicit directory, else ``$ROBUST_PFL_DATA``.

The package never hard-codes a path to real data; the user names the directory with
``--data-dir`` (``data_dir=`` in Python) or the environment variable
:data:`DATA_ENV_VAR`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from robust_pfl.engine.datasets.base import DatasetError

DATA_ENV_VAR = "ROBUST_PFL_DATA"


def how_to_provide(dataset: str) -> str:
    """The sentence every "files not found" error ends with."""
    return (
        f"Name the directory with data_dir = \"DIR\" in the config's [task] table (or "
        f"`reproduce table1|fig6 --data-dir DIR`), or set {DATA_ENV_VAR} to a directory "
        f"holding a '{dataset}' subdirectory (or the files themselves)."
    )


def missing_files_error(
    directory: Path,
    expected: Sequence[str],
    dataset: str,
    missing: Sequence[str] = (),
    note: str = "",
) -> DatasetError:
    """The error for a directory that does not exist or lacks some ``expected`` files.

    ``missing`` names the absent ones when only some are; ``note`` is appended to the
    list of expected files (e.g. an accepted subdirectory).
    """
    if not directory.is_dir():
        where = "does not exist"
    elif missing and len(missing) < len(expected):
        where = f"lacks {', '.join(missing)}"
    else:
        where = "lacks the expected files"
    return DatasetError(
        f"{dataset}: data directory {directory} {where}; expected files: "
        f"{', '.join(expected)}{note}. {how_to_provide(dataset)}"
    )


def holds_any(directory: Path, markers: Sequence[str]) -> bool:
    """Whether ``directory`` exists and holds at least one of ``markers`` (any if empty)."""
    if not directory.is_dir():
        return False
    return not markers or any((directory / marker).exists() for marker in markers)


def resolve_data_dir(
    explicit: str | Path | None, dataset: str, *, markers: Sequence[str] = ()
) -> Path:
    """The directory holding ``dataset``'s files.

    Order: ``explicit`` if given (or its ``<explicit>/<dataset>`` subdirectory when only
    that one holds the files); else ``$ROBUST_PFL_DATA/<dataset>``, or
    ``$ROBUST_PFL_DATA`` itself when it directly holds the files.

    Args:
        explicit: the directory the user named (``--data-dir``), or ``None``.
        dataset: the data set's name, also the subdirectory looked for.
        markers: file or subdirectory names, any one of which shows that a directory
            holds the data set (used to choose between candidates and in errors).

    Raises:
        DatasetError: neither an explicit directory nor the environment variable is
            given, or the environment variable's directory holds no such data.
    """
    if explicit is not None:
        root = Path(explicit).expanduser()
        nested = root / dataset
        if not holds_any(root, markers) and holds_any(nested, markers):
            return nested
        return root  # the loader reports what is missing in it
    env = os.environ.get(DATA_ENV_VAR)
    looked_for = f" (files looked for: {', '.join(markers)})" if markers else ""
    if not env:
        raise DatasetError(
            f"{dataset}: no data directory given and {DATA_ENV_VAR} is not set{looked_for}. "
            f"{how_to_provide(dataset)}"
        )
    root = Path(env).expanduser()
    for candidate in (root / dataset, root):
        if holds_any(candidate, markers):
            return candidate
    raise DatasetError(
        f"{dataset}: {DATA_ENV_VAR}={env} but neither {root / dataset} nor {root} holds "
        f"the data set{looked_for}. {how_to_provide(dataset)}"
    )


def first_existing(directory: Path, names: Sequence[str]) -> Path | None:
    """The first of ``directory / name`` that is a file, or ``None``."""
    for name in names:
        path = directory / name
        if path.is_file():
            return path
    return None
