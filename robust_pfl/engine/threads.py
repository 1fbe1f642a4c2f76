"""The command line's torch thread policy: ``--threads N``, or by default (``auto``) the
CPU cores that other processes leave free, decided when the work starts and checked
again every few seconds while it runs (on each progress update), never fewer than one.

Why not a fixed count: a torch thread that shares its core with another job makes every
parallel op wait for it.  On a 2-core VM the quick start took 1.5x longer on two threads
than on one next to a single busy process, and 4-8x longer with several, while on an
idle machine two threads were 1.6x faster than one (``benchmarks/README.md``, "Thread
defaults").  The engine's runs are bit-identical at one and two threads
(tests/test_threads_progress.py), so a change of count during a run changes no number
there; torch does not promise it for every kernel and count.

Other processes' load is read from ``/proc/stat`` (busy time of all CPUs, steal
included) less this process's own CPU time; where ``/proc/stat`` is missing the policy
keeps one thread.  Grid cells are not governed here: each runs on its grid's
``[resources] cpus`` (default 1), ``jobs`` of them at once.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import torch

#: Seconds between two checks while work runs.
CHECK_EVERY = 5.0
#: The first decision looks at the load over at least this many seconds.
FIRST_WINDOW = 0.2
#: torch's own default, the most threads ``auto`` uses (physical cores; OMP_NUM_THREADS).
TORCH_DEFAULT = torch.get_num_threads()


def available_cores() -> int:
    """The cores this process may run on, at most torch's default."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, TORCH_DEFAULT))


def _proc_stat_busy() -> float | None:
    """Seconds all CPUs have been busy since boot (steal included), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:9]] + [0] * max(0, 9 - len(fields))
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


class LoadClock:
    """Cores kept busy by other processes since the last reading."""

    def __init__(self, busy: Callable[[], float | None] = _proc_stat_busy, own: Callable[[], float] = _own_cpu,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.busy, self.own, self.clock = busy, own, clock
        self.last = self._read()

    def _read(self) -> tuple[float | None, float, float]:
        return self.busy(), self.own(), self.clock()

    def since(self) -> float:
        """Seconds since the last reading."""
        return self.clock() - self.last[2]

    def others(self) -> float | None:
        """Busy cores less this process's, averaged since the last reading (None: unknown)."""
        now, before = self._read(), self.last
        self.last = now
        wall = now[2] - before[2]
        if now[0] is None or before[0] is None or wall <= 0:
            return None
        return max(0.0, (now[0] - before[0] - (now[1] - before[1])) / wall)


def free_threads(cores: int, others: float) -> int:
    """Threads for ``cores`` cores of which ``others`` are busy elsewhere: the free cores
    (a core at least half busy counts as taken), at least one."""
    return max(1, min(cores, cores - math.floor(others + 0.5)))


class AutoThreads:
    """Sets torch's thread count to the free cores on :meth:`check`: the first call
    decides (from the load since the policy was made, waiting up to ``FIRST_WINDOW``),
    later ones at most every ``every`` seconds."""

    def __init__(self, cores: int | None = None, every: float = CHECK_EVERY, clock: LoadClock | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cores = available_cores() if cores is None else cores
        self.every, self.sleep = every, sleep
        self.clock = clock or LoadClock()
        self.decided = False

    def check(self) -> None:
        if self.decided and self.clock.since() < self.every:
            return
        if not self.decided:
            self.sleep(max(0.0, FIRST_WINDOW - self.clock.since()))
            self.decided = True
        others = self.clock.others()
        if others is None:  # no /proc/stat: one thread, the count that never oversubscribes
            return
        threads = free_threads(self.cores, others)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)


#: The policy in force (set by the command line for one command), else None.
_POLICY: AutoThreads | None = None


def use(policy: AutoThreads | None) -> AutoThreads | None:
    """Put ``policy`` in force (None: leave torch's count alone); return the one before."""
    global _POLICY
    before, _POLICY = _POLICY, policy
    return before


def check() -> None:
    """Let the policy in force, if any, adjust torch's thread count (cheap between checks)."""
    if _POLICY is not None:
        _POLICY.check()


def in_force() -> tuple[int, bool]:
    """torch's thread count and whether a policy is in force: what a worker process this
    one starts takes over (:func:`adopt`)."""
    return torch.get_num_threads(), _POLICY is not None


def adopt(threads: int, auto: bool) -> None:
    """In a worker process: the settings :func:`in_force` read in the process that
    started it (``auto``: a fresh :class:`AutoThreads`, which counts sibling workers as
    other processes' load)."""
    torch.set_num_threads(threads)
    use(AutoThreads() if auto else None)
