"""A grid's cell as every backend runs it: what a worker is handed (:class:`CellTask`),
what comes back (:class:`CellOutcome`), and the function between them
(:func:`execute_cell`), a pure function of the cell's config."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from robust_pfl.plugins import PluginSource, install_sources


@dataclass(frozen=True)
class CellTask:
    """What a worker needs to run one cell."""

    cell: str
    config: dict[str, Any]
    source: str  # for messages: "<grid file> cell <cell> (attack=..., method=..., seed=...)"
    checkpoint: str | None  # the cell's checkpoint file, or None
    threads: int  # torch intra-op threads for the cell
    #: the config's plug-ins as the grid imported them (robust_pfl.plugins.shipped_sources)
    plugins: tuple[PluginSource, ...] = ()
    #: ``--verbose``: a checkpointed cell writes a line when it resumes and at each checkpoint
    verbose: bool = False


@dataclass(frozen=True)
class CellOutcome:
    """A finished cell: its tidy rows, or the error it raised."""

    cell: str
    rows: list[dict[str, Any]]  # {"round": int, "metric": str, "value": float}
    error: str | None  # "ExceptionType: message" when the run raised
    seconds: float


def execute_cell(task: CellTask) -> CellOutcome:
    """Run one cell on ``task.threads`` torch threads with deterministic algorithms
    (restored afterwards, so an in-process run leaves the caller's settings), after
    importing the plug-ins shipped with it; an ``Exception`` becomes the outcome's
    ``error``.  With ``task.verbose``, a checkpointed (long) cell writes a line to
    stderr when it resumes and at each checkpoint, with its minutes so far; without it
    none (they were most of a long recipe's log)."""
    import torch

    from robust_pfl.experiments import run_cell_config
    from robust_pfl.engine.seeding import deterministic_kernels_within

    threads = torch.get_num_threads()
    torch.set_num_threads(task.threads)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    error = None
    try:
        install_sources(task.plugins, task.source)
        with deterministic_kernels_within(task.config.get("device", "cpu")):
            checkpoint = None if task.checkpoint is None else Path(task.checkpoint)
            report = partial(_report, task.source, start) if checkpoint is not None and task.verbose else None
            raw = run_cell_config(task.config, task.source, checkpoint=checkpoint, report=report)
        rows = [{"round": int(r["round"]), "metric": str(r["metric"]), "value": float(r["value"])} for r in raw]
    except Exception as caught:  # a failing cell is recorded; the grid goes on
        error = f"{type(caught).__name__}: {caught}"
    finally:
        torch.set_num_threads(threads)
    return CellOutcome(task.cell, rows, error, time.perf_counter() - start)


def _report(source: str, start: float, message: str) -> None:
    minutes = (time.perf_counter() - start) / 60
    print(f"{source}: {message} ({minutes:.1f} min in this run)", file=sys.stderr, flush=True)
