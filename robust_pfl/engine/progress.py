"""Progress that shows everywhere: a tqdm bar on a terminal or in Jupyter, and lines
on stderr elsewhere (nohup, CI, a pipe).  Every long command (a run, a recipe, a grid,
the theory report) reports through :func:`progress_bar`, and each update lets the
command's thread policy (:mod:`robust_pfl.engine.threads`) re-read the free cores."""

from __future__ import annotations

import os
import sys
import time
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from robust_pfl.engine import threads as thread_policy

#: Seconds between two progress lines when stderr is not a terminal (environment
#: ``ROBUST_PFL_PROGRESS_INTERVAL`` overrides it); ``ROBUST_PFL_QUIET=1`` (``--quiet``)
#: silences progress; ``ROBUST_PFL_VERBOSE=1`` (``--verbose``) adds the lines of
#: :func:`verbose` (a line per checkpoint saved).
PROGRESS_INTERVAL = 10.0


def verbose() -> bool:
    """Whether ``--verbose`` (``ROBUST_PFL_VERBOSE=1``) asks for the lines a log needs
    only to follow a run closely (each checkpoint saved): without it a long checkpointed
    recipe's log is mostly such lines (230 of the 261 of ``reproduce fig6 --quick``)."""
    return os.environ.get("ROBUST_PFL_VERBOSE", "") not in ("", "0")


def progress_bar(total: int, description: str, enabled: bool | None = None, interval: float | None = None,
                 costs: Sequence[tuple[int, float]] | None = None):
    """Progress that shows everywhere: a tqdm bar on a terminal, a bar in a Jupyter
    kernel (a widget where ipywidgets is installed), and elsewhere (nohup, CI, a pipe)
    one line on stderr at most every ``interval`` seconds (default
    :data:`PROGRESS_INTERVAL`) and one per finished item (:meth:`ProgressLines.item_done`).
    ``enabled``: ``False`` silences it, ``True`` shows it even under ``ROBUST_PFL_QUIET``,
    ``None`` (default): shown unless ``ROBUST_PFL_QUIET`` is set.

    ``costs``: the estimated cost of the ``total`` units, in the order they are done, as
    ``(units, cost of each)`` segments (a run's methods: ``(rounds, seconds a round)``
    each).  The ETA then scales the elapsed time by the cost still to do over the cost
    done, so a slow first item (FC before the cheaper baselines) does not inflate it
    for the cheap ones; without ``costs`` every unit costs the same.

    The object returned has tqdm's ``update``, ``set_postfix_str`` and ``close``, and
    ``item_done(text, advance=0)``: ``update(advance)`` and a line on stderr when not on
    a terminal (a bar shows it).  ``update`` and ``item_done`` take ``cost``: the
    estimated cost of the units they count, for units done out of order (a grid's
    cells finishing as they do); without it, the next units' cost in ``costs``."""
    thread_policy.check()  # the work starts: the command's thread policy decides (robust_pfl.engine.threads)
    if enabled is None:
        enabled = os.environ.get("ROBUST_PFL_QUIET", "") in ("", "0")
    schedule = None if costs is None else WorkCosts(costs, total)
    if schedule is not None and not schedule.total_cost > 0:  # no estimate (every cost 0): count units
        schedule = None
    if enabled and not sys.stderr.isatty() and "ipykernel" not in sys.modules:
        if interval is None:
            interval = float(os.environ.get("ROBUST_PFL_PROGRESS_INTERVAL", PROGRESS_INTERVAL))
        return ProgressLines(total, description, interval, schedule)
    from tqdm.auto import tqdm

    if schedule is None:
        return _Bar(tqdm(total=total, desc=description, disable=not enabled, leave=False))
    # the bar counts cost (scaled to ``total``), so tqdm's rate and ETA are the cost model's;
    # the fractional count is left out (the postfix names the item and round)
    bar = tqdm(total=total, desc=description, disable=not enabled, leave=False, smoothing=0,
               bar_format="{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]")
    return _Bar(bar, schedule)


class WorkCosts:
    """The estimated cost of units of work done in order: ``segments`` of ``(units,
    cost of each)``, padded with units of the mean cost (or cut) to ``total`` units.
    :meth:`between` is the cost of units ``start .. stop - 1``."""

    def __init__(self, segments: Sequence[tuple[int, float]], total: int) -> None:
        pairs = [(int(units), max(float(cost), 0.0)) for units, cost in segments if units > 0]
        counted = sum(units for units, _ in pairs)
        mean = sum(units * cost for units, cost in pairs) / counted if counted else 1.0
        if counted < total:
            pairs.append((total - counted, mean))
        self.ends = list(accumulate(units for units, _ in pairs))  # units done after each segment
        self.costs = [cost for _, cost in pairs]
        self.spent = list(accumulate(units * cost for units, cost in pairs))  # cost done after each segment
        self.total = total
        self.total_cost = self.done(total)

    def done(self, n: float) -> float:
        """The cost of the first ``n`` units."""
        n = min(max(n, 0), self.ends[-1] if self.ends else 0)
        index = bisect_right(self.ends, n)  # segments finished
        before = self.spent[index - 1] if index else 0.0
        start = self.ends[index - 1] if index else 0
        return before + ((n - start) * self.costs[index] if index < len(self.costs) else 0.0)

    def between(self, start: float, stop: float) -> float:
        return self.done(stop) - self.done(start)


class _Bar:
    """A tqdm bar with :meth:`item_done` (the bar shows the item; no line); with
    ``costs``, the bar advances by each unit's share of the estimated cost."""

    def __init__(self, bar: Any, costs: WorkCosts | None = None) -> None:
        self.bar, self.costs, self.n = bar, costs, 0

    def update(self, n: int = 1, cost: float | None = None) -> None:
        if self.costs is None:
            self.bar.update(n)
        else:
            cost = self.costs.between(self.n, self.n + n) if cost is None else cost
            self.bar.update(cost / self.costs.total_cost * self.costs.total)
        self.n += n
        thread_policy.check()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.bar.set_postfix_str(text, refresh=refresh)

    def close(self) -> None:
        self.bar.close()

    def item_done(self, text: str, advance: int = 0, cost: float | None = None) -> None:
        self.update(advance, cost)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProgressLines:
    """Progress as lines on stderr, for logs: ``DESCRIPTION: N/TOTAL (P%), POSTFIX,
    ELAPSED elapsed, ETA ...`` at most every ``interval`` seconds while work goes on,
    a line per :meth:`item_done`, and one when it closes.  The ETA is the elapsed time
    times the work left over the work done, in units, or in estimated cost with
    ``costs`` (:func:`progress_bar`)."""

    def __init__(self, total: int, description: str, interval: float = PROGRESS_INTERVAL,
                 costs: WorkCosts | None = None) -> None:
        self.total, self.description, self.interval = total, description, interval
        self.n, self.postfix = 0, ""
        self.costs, self.cost_done = costs, 0.0
        self.start = self.last = time.monotonic()
        self.closed, self.written = False, 0  # written: n at the last line

    def _advance(self, n: int, cost: float | None) -> None:
        if self.costs is not None:
            self.cost_done += self.costs.between(self.n, self.n + n) if cost is None else cost
        self.n += n

    def update(self, n: int = 1, cost: float | None = None) -> None:
        self._advance(n, cost)
        if time.monotonic() - self.last >= self.interval and self.n < self.total:
            self._write(self.postfix)
        thread_policy.check()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def item_done(self, text: str, advance: int = 0, cost: float | None = None) -> None:
        """A line for a finished item, after ``advance`` more units of work (of
        estimated ``cost``, by default the next units' in ``costs``)."""
        self._advance(advance, cost)
        self._write(text, first=True)
        thread_policy.check()

    def remaining(self, elapsed: float) -> float | None:
        """Seconds left by the cost model (by units without one); ``None`` before any
        work is done or after all of it."""
        if not 0 < self.n < self.total:
            return None
        if self.costs is None or self.cost_done <= 0:
            return elapsed / self.n * (self.total - self.n)
        return elapsed / self.cost_done * max(self.costs.total_cost - self.cost_done, 0.0)

    def close(self) -> None:
        if not self.closed and self.n > 0 and self.n != self.written:  # unless the last line said it
            self._write("finished" if self.n >= self.total else "stopped")
        self.closed = True

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, text: str, first: bool = False) -> None:
        """``DESCRIPTION: N/TOTAL (P%), TEXT, ELAPSED, ETA``, or with ``first``
        ``DESCRIPTION: TEXT; N/TOTAL (P%), ELAPSED, ETA``."""
        now = time.monotonic()
        self.last, self.written = now, self.n
        elapsed = now - self.start
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        parts = [f"{self.n}/{self.total}{share}", *([text] if text and not first else []),
                 f"{_duration(elapsed)} elapsed"]
        left = self.remaining(elapsed)
        if left is not None:
            parts.append(f"ETA {_duration(left)}")
        lead = f"{text}; " if text and first else ""
        print(f"{self.description}: {lead}" + ", ".join(parts), file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    """``4.2 s``, ``42 s``, ``3 min 05 s``, ``2 h 04 min``."""
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
