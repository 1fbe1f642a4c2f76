"""Running a grid into its results store, resumably.

``OUT/results.csv`` is one tidy table that ``pandas.read_csv`` reads in one call:
``cell``, the grid's axis columns, ``n_clients``, ``n_byzantine``, ``status`` ("ok" or
"error"), ``error``, ``round``, ``metric``, ``value``, ``final`` (True on each metric's
rows at its last recorded round).  Each finished cell is appended as one block in a
single write, flushed and fsynced; the block's last row is the metric
``cell_seconds`` (the cell's wall time), which marks the cell finished.  A cell that
raised is one ``cell_seconds`` row with status "error" and its error.

So a grid killed at any point resumes by rerunning it: on open, the store drops what a
kill can leave (a cut last line, a block without its ``cell_seconds`` row) and the
errored cells that are about to run again, by an atomic rewrite; finished cells are
skipped.  No finished cell is lost, none is stored twice.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Iterable, Iterator, Sequence

from robust_pfl.backends import Backend, LocalBackend
from robust_pfl.cells import CellOutcome, CellTask
from robust_pfl.config import ConfigError
from robust_pfl.grid_file import Grid, GridCell
from robust_pfl.plugins import PluginSource, shipped_sources
from robust_pfl.provenance import provenance
from robust_pfl.engine.progress import progress_bar, verbose
from robust_pfl.engine.results import json_safe, atomic_write_text, write_outputs

if TYPE_CHECKING:
    import pandas

STORE = "results.csv"
GRID_JSON = "grid.json"
CHECKPOINTS = "checkpoints"
#: The metric whose row ends a cell's block.
FINISHED = "cell_seconds"
TAIL = ["n_clients", "n_byzantine", "status", "error", "round", "metric", "value", "final"]


class ResultsStore:
    """``results.csv`` of a grid whose axis columns are ``axes``.

    Opening it creates the file (header only), or cleans an existing one: incomplete
    blocks and the errored blocks of ``rerun`` cells are dropped, lines that are no
    record are dropped with one warning naming them, and a header lacking some of
    ``axes`` is widened (old rows get empty values); all by one atomic rewrite.
    """

    def __init__(self, path: Path, axes: Sequence[str], rerun: Collection[str] = ()) -> None:
        self.path = Path(path)
        self.finished: dict[str, str] = {}  # {cell: status} of the cells stored
        if not self.path.exists():
            self.columns = ["cell", *axes, *TAIL]
            atomic_write_text(self.path, _csv_line(self.columns))
            return
        text = _store_text(self.path)
        header, blocks, foreign = _scan(text, self.path)
        if foreign:
            warnings.warn(
                f"{self.path}: dropped line{'s' if len(foreign) > 1 else ''} {', '.join(map(str, foreign))}, "
                f"not rows of {len(header)} fields (cut by a kill, or written by something else); "
                "a cell such a line held runs again",
                RuntimeWarning,
                stacklevel=2,
            )
        blocks = [b for b in blocks if not (b[-1]["status"] == "error" and b[-1]["cell"] in rerun)]
        self.finished = {block[-1]["cell"]: block[-1]["status"] for block in blocks}
        old_axes = header[1 : -len(TAIL)]
        self.columns = ["cell", *old_axes, *[a for a in axes if a not in old_axes], *TAIL]
        clean = _table_text(self.columns, blocks)
        if clean != text:
            atomic_write_text(self.path, clean)

    def append(self, cell: GridCell, outcome: CellOutcome) -> None:
        """Add ``cell``'s block durably: one write, flush, fsync."""
        text = "".join(_csv_line([row.get(c, "") for c in self.columns]) for row in block_rows(cell, outcome))
        data = text.encode("utf-8")
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            while data:
                data = data[os.write(descriptor, data):]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        self.finished[cell.cell] = "ok" if outcome.error is None else "error"


def block_rows(cell: GridCell, outcome: CellOutcome) -> list[dict[str, Any]]:
    """The store rows of a finished cell, its ``cell_seconds`` row last."""
    common = {"cell": cell.cell, **cell.axes, "n_clients": cell.n_clients, "n_byzantine": cell.n_byzantine}
    if outcome.error is not None:
        return [{**common, "status": "error", "error": outcome.error, "round": 0, "metric": FINISHED,
                 "value": outcome.seconds, "final": True}]
    last: dict[str, int] = {}
    for row in outcome.rows:
        last[row["metric"]] = max(last.get(row["metric"], row["round"]), row["round"])
    rows = [{**common, "status": "ok", "error": "", **row, "final": row["round"] == last[row["metric"]]}
            for row in outcome.rows]
    end = max(last.values(), default=0)
    rows.append({**common, "status": "ok", "error": "", "round": end, "metric": FINISHED,
                 "value": outcome.seconds, "final": True})
    return rows


def _csv_line(values: Iterable[Any]) -> str:
    """One CSV record on one physical line (line breaks inside a value become spaces,
    so a record is never split across lines and a cut is always a cut last line)."""
    buffer = io.StringIO()
    flat = [" ".join(v.split()) if isinstance(v, str) and ("\n" in v or "\r" in v) else v for v in values]
    csv.writer(buffer, lineterminator="\n").writerow(flat)
    return buffer.getvalue()


def _fields(line: str) -> list[str] | None:
    try:
        return next(csv.reader([line]), None)
    except csv.Error:
        return None


def _store_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path} is not a grid results store (not UTF-8 text: {error.reason})") from None


def _scan(text: str, path: Path) -> tuple[list[str], list[list[dict[str, str]]], list[int]]:
    """The header, the complete blocks (the first one of a cell, if a cell has two),
    and the numbers of the lines that are no row of the store."""
    lines = text.split("\n")
    header = _fields(lines[0])
    if header is None or header[:1] != ["cell"] or header[-len(TAIL):] != TAIL:
        raise ConfigError(f"{path} is not a grid results store (its header is {lines[0][:200]!r})")
    blocks: list[list[dict[str, str]]] = []
    seen: set[str] = set()
    foreign: list[int] = []
    block: list[dict[str, str]] = []
    # the text after the last newline is a line a kill cut, or nothing
    for number, line in enumerate(lines[1:-1], start=2):
        fields = _fields(line)
        if fields is None or len(fields) != len(header):
            foreign.append(number)
            continue
        row = dict(zip(header, fields))
        if block and block[0]["cell"] != row["cell"]:
            block = []  # a block a kill cut: its cell runs again
        block.append(row)
        if row["metric"] == FINISHED:
            if row["cell"] not in seen:
                seen.add(row["cell"])
                blocks.append(block)
            block = []
    if lines[-1]:
        foreign.append(len(lines))
    return header, blocks, foreign


def _table_text(columns: Sequence[str], blocks: Iterable[list[dict[str, str]]]) -> str:
    rows = (row for block in blocks for row in block)
    return _csv_line(columns) + "".join(_csv_line([row.get(c, "") for c in columns]) for row in rows)


def run_grid(grid: Grid, out: Path, backend: Backend | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Run every cell of ``grid`` not finished in ``out``'s store; return the summary
    (also ``out/summary.json``, written last, with its ``provenance``: the torch
    threads there are each cell's).

    Finished cells are skipped, errored ones run again; each outcome is appended as it
    arrives; ``grid.json`` records every cell's axes and config.  Without ``backend``
    the cells run one by one in this process.  ``progress``: a bar with ETA (default:
    on a terminal).
    """
    keys = [cell.cell for cell in grid.cells]
    if len(set(keys)) != len(keys):
        raise ValueError("grid cells must have distinct keys")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with _exclusive(out):
        (out / "summary.json").unlink(missing_ok=True)  # the summary marks a finished call
        store = ResultsStore(out / STORE, grid.columns, rerun=set(keys))
        _record_cells(out / GRID_JSON, grid.cells)
        todo = [cell for cell in grid.cells if store.finished.get(cell.cell) != "ok"]
        by_key = {cell.cell: cell for cell in todo}
        owned = backend is None
        backend = LocalBackend() if backend is None else backend
        errors: dict[str, str] = {}
        try:
            # cells cost very different amounts (a recipe's 30-step and 3000-step cells): the
            # ETA weighs each by its estimate, counted as it finishes, in whatever order
            weights = [(1, cell.seconds) for cell in todo]
            with progress_bar(len(todo), f"grid {Path(grid.source).name}", progress, costs=weights) as bar:
                for count, outcome in enumerate(backend.map_unordered(_tasks(grid, todo, out)), start=1):
                    cell = by_key[outcome.cell]
                    store.append(cell, outcome)
                    if outcome.error is None:
                        _remove_checkpoint(out, cell)
                    else:
                        errors[cell.cell] = outcome.error
                        bar.set_postfix_str(f"{len(errors)} errored")
                    finished = "errored" if outcome.error is not None else "done"
                    bar.item_done(f"cell {count}/{len(todo)} {finished}: {cell.describe()} ({outcome.seconds:.1f} s)",
                                  advance=1, cost=cell.seconds)
        finally:
            if owned:
                backend.close()
        summary = {
            "source": grid.source,
            "backend": backend.name,
            "cells": len(grid.cells),
            "ran": len(todo),
            "skipped": len(grid.cells) - len(todo),
            "errors": len(errors),
            "errored": errors,
            "results": str(out / STORE),
            "seconds": time.perf_counter() - start,
        }
        devices = sorted({str(cell.config.get("device")) for cell in grid.cells})
        summary["provenance"] = provenance(devices[0] if len(devices) == 1 else devices, grid.resources.threads,
                                           summary["seconds"])
        write_outputs(out, summary, {})
    return summary


def _tasks(grid: Grid, cells: Sequence[GridCell], out: Path) -> list[CellTask]:
    """The cells' tasks, each carrying its plug-ins' source (read once per grid run, so
    every cell runs the code the grid was validated against)."""
    shipped: dict[tuple[str, ...], tuple[PluginSource, ...]] = {}
    tasks = []
    for cell in cells:
        entries = list(cell.config.get("plugins") or [])
        if tuple(entries) not in shipped:
            shipped[tuple(entries)] = shipped_sources(entries)
        tasks.append(_task(grid, cell, out, shipped[tuple(entries)]))
    return tasks


def _task(grid: Grid, cell: GridCell, out: Path, plugins: tuple[PluginSource, ...] = ()) -> CellTask:
    checkpoint = None
    if cell.config.get("checkpoint_every"):
        (out / CHECKPOINTS).mkdir(exist_ok=True)
        checkpoint = str(out / CHECKPOINTS / f"{cell.cell}.pt")
    source = f"{grid.source} cell {cell.cell} ({cell.describe()})"
    # read here, in the grid's process: a worker (a spawned process, a Ray task) may not
    # share its environment
    return CellTask(cell.cell, cell.config, source, checkpoint, grid.resources.threads, plugins, verbose())


def _remove_checkpoint(out: Path, cell: GridCell) -> None:
    (out / CHECKPOINTS / f"{cell.cell}.pt").unlink(missing_ok=True)


def _record_cells(path: Path, cells: Sequence[GridCell]) -> None:
    """Merge the cells' axes and configs into ``grid.json`` (written atomically), and
    its ``order``: the cell keys of the latest grid in grid order (its methods in
    config order), then the other cells recorded before."""
    recorded: dict[str, Any] = {}
    order: list[str] = []
    if path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            recorded = dict(data.get("cells", {}))
            order = [str(key) for key in data.get("order", [])]
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
            recorded, order = {}, []
    for cell in cells:
        recorded[cell.cell] = {"axes": cell.axes, "config": cell.config}
    order = list(dict.fromkeys([*(cell.cell for cell in cells), *order, *recorded]))
    text = json.dumps(json_safe({"cells": recorded, "order": order}), indent=1, sort_keys=True, allow_nan=False)
    atomic_write_text(path, text + "\n")


@contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out`` (the OS releases it if the process is killed)."""
    with open(out / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{out} is in use by another grid run") from None
        yield


def read_results(path: Path, **read_csv: Any) -> "pandas.DataFrame":
    """The store at ``path`` (an OUT directory or its ``results.csv``) as a DataFrame:
    complete blocks only, so a store that a kill left mid-write reads cleanly too.
    ``read_csv``: options for :func:`pandas.read_csv` (``dtype=str``)."""
    import pandas

    path = Path(path)
    if path.is_dir():
        path = path / STORE
    if not path.exists():
        raise FileNotFoundError(f"no grid results store at {path}")
    header, blocks, _ = _scan(_store_text(path), path)
    return pandas.read_csv(io.StringIO(_table_text(header, blocks)), **read_csv)


def grid_results(out: Path, grid: Grid) -> "pandas.DataFrame":
    """The finished rows of ``grid``'s cells in ``out``'s store (a store may also hold
    other grids' cells, and errored ones)."""
    frame = read_results(out)
    keys = {cell.cell for cell in grid.cells}
    return frame[frame["cell"].isin(keys) & (frame["status"] == "ok")]
