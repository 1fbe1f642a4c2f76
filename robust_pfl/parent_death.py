"""Pool workers that die with the grid process that started them, from their first
lines of Python on.

A grid's ``--jobs N`` workers are fresh ("spawn") processes that import torch for
seconds before running anything of ours that could watch their parent.  The grid marks
the processes it starts (:func:`spawning_workers` sets :data:`WORKER_OF` to its pid
while it starts them); the first thing the package does on import, before torch, is
:func:`arm_from_environment`: a marked process whose parent is alive asks the Linux
kernel to kill it when that parent dies (``PR_SET_PDEATHSIG``), and one whose parent is
already gone exits.  The mark is removed on reading, so nothing the worker starts
inherits it.  This module imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Iterator

#: Environment variable naming the pid of the grid process a worker belongs to.
WORKER_OF = "ROBUST_PFL_WORKER_OF"

_PR_SET_PDEATHSIG = 1


def kill_me_with_parent() -> bool:
    """Ask the Linux kernel to SIGKILL this process when its parent dies; False where
    that is not available.  (The kernel's "parent" is the thread that started this
    process: pools are started by the thread that runs the grid, which outlives its
    cells.)"""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def arm_from_environment() -> None:
    """In a process marked by :func:`spawning_workers`: die with the grid process (exit
    now if it is already gone).  Elsewhere: nothing."""
    marked = os.environ.pop(WORKER_OF, None)
    if not marked or not marked.isdigit():
        return
    parent = int(marked)
    kill_me_with_parent()
    if os.getppid() != parent:  # the grid died before (or while) this process started
        os._exit(1)


@contextlib.contextmanager
def spawning_workers() -> Iterator[None]:
    """Mark the processes started inside the block as this process's workers."""
    previous = os.environ.get(WORKER_OF)
    os.environ[WORKER_OF] = str(os.getpid())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(WORKER_OF, None)
        else:
            os.environ[WORKER_OF] = previous
