"""Ray backend for grids: each cell is one Ray task running :func:`execute_cell`.

``RayBackend()`` starts a private local Ray instance (no dashboard, worker logs kept
out of the terminal) and shuts it down on :meth:`RayBackend.close`.  With an address
(``"auto"``, ``"host:port"`` of a ``ray start --head`` node, or ``"ray://host:10001"``
through Ray Client, which needs ``ray[client]``) it joins that cluster and only
disconnects on close; the cluster keeps running.  A driver that already called
``ray.init`` itself is reused and left connected.

Each task reserves the grid's per-cell ``[resources]`` (``num_cpus``, ``num_gpus``);
Ray starts a task when a node has them free.  Cells are pure functions of their config,
so results equal the local backend's.  A task whose worker dies (segfault, out of
memory, a lost node) is not retried: it becomes a :class:`CellOutcome` with the Ray
error, the other cells go on, and a rerun of the grid runs it again.

What a cluster needs:

- ``robust-pfl`` (and its torch) installed on every node, at the driver's version;
- nothing for the grid's ``plugins``: each task carries the source text of its ``.py``
  plug-ins (and of single-file plug-in modules) as the driver imported them, and the
  worker imports that before it builds the cell
  (:func:`robust_pfl.plugins.shipped_sources`, which says why this rather than a
  ``runtime_env``); a plug-in that is a package must be installed on every node;
- every path in the grid (data directories, the output directory, which holds the
  cells' checkpoints) valid on every node: a shared filesystem, or absolute paths that
  exist on each node.  On a local instance, workers share the driver's working
  directory, so relative paths work as they do with the local backend;
- with Ray's token authentication (on by default for clusters Ray starts), the
  driver's environment needs ``RAY_AUTH_MODE=token`` and the cluster's token
  (``RAY_AUTH_TOKEN``, or ``~/.ray/auth_token`` on the same machine).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator, Sequence

import ray
from ray.exceptions import RayError, RayTaskError

from robust_pfl.cells import CellOutcome, CellTask, execute_cell
from robust_pfl.config import ConfigError
from robust_pfl.grid_file import Resources


class RayBackend:
    """Runs cells as Ray tasks; :meth:`map_unordered` yields outcomes as they finish.

    ``jobs`` caps the number of cells submitted at once (``None``: all of them; Ray
    then runs as many as the cluster's free resources allow).
    """

    name = "ray"
    #: The function each Ray task runs (top-level, so workers import it by name).
    cell_function: Callable[[CellTask], CellOutcome] = staticmethod(execute_cell)

    def __init__(self, address: str | None = None, resources: Resources = Resources(), jobs: int | None = None) -> None:
        if jobs is not None and jobs < 1:
            raise ConfigError(f"jobs must be at least 1, got {jobs}")
        self.address = address
        self.resources = Resources(resources.cpus, resources.gpus or 0.0)  # gpus unsaid: none
        self.jobs = jobs
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            self._connect()
        if address is None:
            self._check_local_capacity()

    def _connect(self) -> None:
        quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
        if self.address is None:
            # "local" starts a new instance even when RAY_ADDRESS or `ray start` names one.
            ray.init(address="local", include_dashboard=False, **quiet)
            return
        _check_reachable(self.address)
        try:
            ray.init(address=self.address, **quiet)
        except (ConnectionError, ValueError, RuntimeError) as error:
            raise ConfigError(f"Ray address {self.address!r} (--address): cannot connect: {error}") from error

    def _check_local_capacity(self) -> None:
        """A cell that asks more than the local machine has would wait forever."""
        available = ray.cluster_resources()
        for field, key in (("cpus", "CPU"), ("gpus", "GPU")):
            wanted = getattr(self.resources, field)
            if wanted > available.get(key, 0.0):
                self.close()
                raise ConfigError(
                    f"resources.{field} = {wanted:g} per cell, but the local Ray instance has "
                    f"{available.get(key, 0.0):g} {key}s; lower it or give --address of a larger cluster"
                )

    def map_unordered(self, tasks: Sequence[CellTask]) -> Iterator[CellOutcome]:
        """Run every task, yielding each cell's outcome as soon as it finishes; tasks
        still pending when the caller stops iterating are cancelled."""
        remote = ray.remote(type(self).cell_function).options(
            num_cpus=self.resources.cpus, num_gpus=self.resources.gpus, max_retries=0
        )
        limit = self.jobs if self.jobs is not None else max(len(tasks), 1)
        pending: dict[ray.ObjectRef, tuple[CellTask, float]] = {}
        submitted = 0
        try:
            while submitted < len(tasks) or pending:
                while submitted < len(tasks) and len(pending) < limit:
                    task = tasks[submitted]
                    pending[remote.remote(task)] = (task, time.perf_counter())
                    submitted += 1
                (ready,), _ = ray.wait(list(pending), num_returns=1)
                task, started = pending.pop(ready)
                yield _outcome(ready, task, started)
        finally:
            if pending and ray.is_initialized():
                for ref in pending:
                    ray.cancel(ref, force=True)

    def close(self) -> None:
        """Shut down the local instance this backend started (or disconnect from the
        cluster it joined); a connection the caller opened is left alone."""
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._owns_connection = False

    def __enter__(self) -> RayBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a ``host:port`` nobody listens on: Ray itself retries for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray reports on itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        raise ConfigError(f"Ray address {address!r} (--address): cannot reach {host}:{port}: {error}") from None


def _outcome(ref: ray.ObjectRef, task: CellTask, started: float) -> CellOutcome:
    """The task's outcome, or an errored outcome when Ray could not deliver one."""
    try:
        return ray.get(ref)
    except RayError as error:
        return CellOutcome(cell=task.cell, rows=[], error=describe_ray_error(error), seconds=time.perf_counter() - started)


def describe_ray_error(error: RayError) -> str:
    """``"ExceptionType: first line of its message"``: the task's own exception when Ray
    wrapped one (e.g. ``ModuleNotFoundError`` on a node without the package), else Ray's
    error (e.g. ``WorkerCrashedError``)."""
    cause = error.cause if isinstance(error, RayTaskError) else None
    shown = cause if isinstance(cause, BaseException) else error
    # Ray names wrapped classes "RayTaskError(ValueError)"; keep the plain name.
    name = type(shown).__name__.split("(")[0]
    first_line = next((line.strip() for line in str(shown).splitlines() if line.strip()), "")
    return f"{name}: {first_line}" if first_line else name
