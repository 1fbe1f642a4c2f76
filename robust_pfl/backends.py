"""Where a grid's cells run: in this process, in a local process pool, or on Ray.

A cell is a pure function of its config (:func:`robust_pfl.cells.execute_cell`), so every backend gives
the same results; a backend only decides where and how many at once.  Outcomes come
back as cells finish, and only the caller writes the results store.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
from typing import Any, Callable, Iterator, Protocol, Sequence, TypeVar

from robust_pfl.cells import CellOutcome, CellTask, execute_cell
from robust_pfl.config import ConfigError
from robust_pfl.grid_file import Resources
from robust_pfl.parent_death import kill_me_with_parent, spawning_workers

BACKENDS = ("local", "ray")


class Backend(Protocol):
    name: str

    def map_unordered(self, tasks: Sequence[CellTask]) -> Iterator[CellOutcome]:
        """Run ``tasks``; yield each outcome as its cell finishes."""
        ...

    def close(self) -> None: ...


class LocalBackend:
    """``jobs = 1``: cells run one after another in this process; ``jobs > 1``: a pool
    of that many fresh ("spawn") processes, each running one cell at a time."""

    name = "local"

    def __init__(self, jobs: int = 1) -> None:
        if jobs < 1:
            raise ConfigError(f"jobs must be >= 1, got {jobs}")
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    def map_unordered(self, tasks: Sequence[CellTask]) -> Iterator[CellOutcome]:
        if self.jobs == 1:
            for task in tasks:
                yield execute_cell(task)
            return
        if self._pool is None:
            self._pool = worker_pool(self.jobs)
        pending = submit_all(self._pool, execute_cell, tasks)
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield _outcome(future, pending.pop(future))
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def worker_pool(jobs: int, setup: Callable[..., None] | None = None,
                setup_args: tuple[Any, ...] = ()) -> ProcessPoolExecutor:
    """A pool of ``jobs`` fresh ("spawn") processes that end with this one
    (:func:`exit_with_parent`), each running ``setup(*setup_args)`` before its first
    task (a module-level function: a spawned worker imports it by name)."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(os.getpid(), setup, setup_args))


def _start_worker(parent: int, setup: Callable[..., None] | None, setup_args: tuple[Any, ...]) -> None:
    exit_with_parent(parent)
    if setup is not None:
        setup(*setup_args)


Task = TypeVar("Task")
Outcome = TypeVar("Outcome")


def submit_all(pool: ProcessPoolExecutor, function: Callable[[Task], Outcome],
               tasks: Sequence[Task]) -> dict[Future[Outcome], Task]:
    """Submit ``function(task)`` for every task; the workers the submissions start are
    marked as this process's (:func:`~robust_pfl.parent_death.spawning_workers`), so
    they die with it."""
    with spawning_workers():
        return {pool.submit(function, task): task for task in tasks}


def in_worker_processes(jobs: int, setup: Callable[..., None] | None = None, setup_args: tuple[Any, ...] = ()
                        ) -> Callable[[Callable[[Task], Outcome], Sequence[Task]], Iterator[tuple[Task, Outcome]]]:
    """A runner that maps a module-level function over tasks in a :func:`worker_pool`
    of ``jobs`` processes, yielding each task with its outcome as it finishes (a
    worker's exception is raised here).  ``theory report --jobs N`` runs its checks
    through it."""
    def run(function: Callable[[Task], Outcome], tasks: Sequence[Task]) -> Iterator[tuple[Task, Outcome]]:
        with worker_pool(jobs, setup, setup_args) as pool:
            pending = submit_all(pool, function, tasks)
            for future in as_completed(pending):
                yield pending[future], future.result()

    return run


def exit_with_parent(parent: int, interval: float = 0.5) -> None:
    """Pool worker initializer: end this worker once process ``parent`` (the grid's)
    is gone.  A killed grid process stops no worker itself; left running, a worker
    would finish its cell for nobody, then idle forever, and a rerun's worker would
    race it for the cell's checkpoint file.

    On Linux the worker was armed on its first import of the package, before torch
    (:mod:`robust_pfl.parent_death`): the kernel kills it the moment the grid dies.
    This initializer, which runs before the worker takes its first cell, arms it again
    for workers not started through :func:`~robust_pfl.parent_death.spawning_workers`
    and ends a worker whose parent is already gone.  Elsewhere a thread polls every
    ``interval`` seconds."""
    if kill_me_with_parent() and os.getppid() == parent:
        return
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _outcome(future: Future[CellOutcome], task: CellTask) -> CellOutcome:
    """The future's outcome; a worker that died (killed, out of memory) is the cell's
    error, so the cell runs again next time."""
    try:
        return future.result()
    except Exception as error:  # BrokenProcessPool and the like: the cell did not finish
        return CellOutcome(task.cell, [], f"{type(error).__name__}: {error}", 0.0)


def make_backend(name: str, jobs: int | None = 1, address: str | None = None,
                 resources: Resources = Resources()) -> Backend:
    """The backend called ``name`` ("local" or "ray").  ``jobs``: cells at once (local:
    default 1; Ray: default as many as the cluster's resources allow); ``address``: an
    existing Ray cluster (Ray only); ``resources``: what Ray reserves per cell."""
    if name == "local":
        if address is not None:
            raise ConfigError("--address applies to the ray backend only")
        return LocalBackend(1 if jobs is None else jobs)
    if name == "ray":
        if importlib.util.find_spec("ray") is None:
            raise ConfigError("backend 'ray' needs Ray: pip install 'robust-pfl[ray]'")
        from robust_pfl.ray_backend import RayBackend

        return RayBackend(address=address, resources=resources, jobs=jobs)
    raise ConfigError(f"unknown backend {name!r}; allowed: {list(BACKENDS)}")
