"""Resumable grids of runs (attack x defense x Byzantine fraction x seed).

A grid is a list of :class:`Cell` s, each one complete run identified by a key.  Every
finished cell is appended to ``cells.jsonl`` in the output directory as one line
(written, flushed and fsynced in a single ``write``), so a grid killed midway resumes
by skipping the keys already on disk: no finished run is lost or run twice.  A line
that is not a finished cell's record (a half-written last line of a kill mid-write, or
valid JSON of another shape such as ``{}`` or ``null``) is skipped with a warning that
names it, and its cell, if it held one, runs again.

The runner is sequential; the store is the seam where a Ray backend will plug in
(cells are independent and pure functions of their config and seed).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from robust_pfl.results import _json_safe


@dataclass(frozen=True)
class Cell:
    """One run of a grid: ``key`` names it (e.g. attack, defense, seed); ``payload`` is
    whatever the run function needs (e.g. a config mapping)."""

    key: tuple[tuple[str, Any], ...]
    payload: Any = field(compare=False, hash=False)

    @property
    def key_text(self) -> str:
        """The key plus a fingerprint of the payload: a rerun whose settings changed
        (another partition, more rounds ...) does not reuse the old result."""
        payload = json.dumps(self.payload, sort_keys=True, default=repr)
        digest = hashlib.sha256(payload.encode()).hexdigest()[:16]
        return json.dumps({**dict(self.key), "config_sha256": digest}, sort_keys=True)


class CellStore:
    """Append-only JSON-lines record of finished cells."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def finished(self) -> dict[str, dict[str, Any]]:
        """``{key_text: record}`` of the finished cells' records on disk.  Other lines
        (cut by a kill, or JSON that is not such a record) are skipped, and one warning
        gives their line numbers: a cell they held runs again."""
        done: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return done
        skipped = []
        for number, line in enumerate(self.path.read_text().splitlines(), start=1):
            record = _record(line)
            if record is None:
                if line.strip():
                    skipped.append(number)
                continue
            done[record["key_text"]] = record
        if skipped:
            warnings.warn(
                f"{self.path}: skipped line{'s' if len(skipped) > 1 else ''} {', '.join(map(str, skipped))}, "
                "not a finished cell's record (cut by a kill, or not a JSON object with key_text, "
                "key and rows); a cell such a line held runs again",
                RuntimeWarning,
                stacklevel=2,
            )
        return done

    def append(self, cell: Cell, rows: list[dict[str, Any]]) -> None:
        """Record a finished cell with its tidy result rows, durably."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(
            {"key_text": cell.key_text, "key": dict(cell.key), "rows": _json_safe(rows)}, allow_nan=False
        )
        with open(self.path, "a") as handle:
            if handle.tell() > 0 and not self._ends_with_newline():
                line = "\n" + line  # a previous kill left a partial line: start afresh
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"


def run_grid(
    cells: Iterable[Cell],
    run: Callable[[Cell], list[dict[str, Any]]],
    store: CellStore,
    on_cell: Callable[[Cell, bool], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every cell not yet in ``store``; return all rows (old and new), each row
    extended with its cell's key fields.  ``on_cell(cell, skipped)`` reports progress."""
    cells = list(cells)
    texts = [cell.key_text for cell in cells]
    if len(set(texts)) != len(texts):
        raise ValueError("grid cells must have distinct keys")
    done = store.finished()
    for cell in cells:
        skipped = cell.key_text in done
        if not skipped:
            store.append(cell, run(cell))
        if on_cell is not None:
            on_cell(cell, skipped)
    done = store.finished()
    return list(_rows(done[text] for text in texts))


def _record(line: str) -> dict[str, Any] | None:
    """The cell record on ``line``, or ``None`` when the line is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    shapes = {"key_text": str, "key": dict, "rows": list}
    return record if all(isinstance(record.get(name), kind) for name, kind in shapes.items()) else None


def _rows(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for record in records:
        for row in record["rows"]:
            yield {**record["key"], **row}
