"""Progress that shows everywhere: a tqdm bar on a terminal or in Jupyter, and lines
on stderr elsewhere (nohup, CI, a pipe).  Every long command (a run, a recipe, a grid,
the theory report) reports through :func:`progress_bar`, and each update lets the
command's thread policy (:mod:`robust_pfl.engine.threads`) re-read the free cores."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from robust_pfl.engine import threads as thread_policy

#: Seconds between two progress lines when stderr is not a terminal (environment
#: ``ROBUST_PFL_PROGRESS_INTERVAL`` overrides it); ``ROBUST_PFL_QUIET=1`` (``--quiet``)
#: silences progress.
PROGRESS_INTERVAL = 10.0


def progress_bar(total: int, description: str, enabled: bool | None = None, interval: float | None = None):
    """Progress that shows everywhere: a tqdm bar on a terminal, a bar in a Jupyter
    kernel (a widget where ipywidgets is installed), and elsewhere (nohup, CI, a pipe)
    one line on stderr at most every ``interval`` seconds (default
    :data:`PROGRESS_INTERVAL`) and one per finished item (:meth:`ProgressLines.item_done`).
    ``enabled``: ``False`` silences it, ``True`` shows it even under ``ROBUST_PFL_QUIET``,
    ``None`` (default): shown unless ``ROBUST_PFL_QUIET`` is set.

    The object returned has tqdm's ``update``, ``set_postfix_str`` and ``close``, and
    ``item_done(text, advance=0)``: ``update(advance)`` and a line on stderr when not on
    a terminal (a bar shows it)."""
    thread_policy.check()  # the work starts: the command's thread policy decides (robust_pfl.engine.threads)
    if enabled is None:
        enabled = os.environ.get("ROBUST_PFL_QUIET", "") in ("", "0")
    if enabled and not sys.stderr.isatty() and "ipykernel" not in sys.modules:
        if interval is None:
            interval = float(os.environ.get("ROBUST_PFL_PROGRESS_INTERVAL", PROGRESS_INTERVAL))
        return ProgressLines(total, description, interval)
    from tqdm.auto import tqdm

    return _Bar(tqdm(total=total, desc=description, disable=not enabled, leave=False))


class _Bar:
    """A tqdm bar with :meth:`item_done` (the bar shows the item; no line)."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        thread_policy.check()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.bar.set_postfix_str(text, refresh=refresh)

    def close(self) -> None:
        self.bar.close()

    def item_done(self, text: str, advance: int = 0) -> None:
        self.update(advance)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProgressLines:
    """Progress as lines on stderr, for logs: ``DESCRIPTION: N/TOTAL (P%), POSTFIX,
    ELAPSED elapsed, ETA ...`` at most every ``interval`` seconds while work goes on,
    a line per :meth:`item_done`, and one when it closes."""

    def __init__(self, total: int, description: str, interval: float = PROGRESS_INTERVAL) -> None:
        self.total, self.description, self.interval = total, description, interval
        self.n, self.postfix = 0, ""
        self.start = self.last = time.monotonic()
        self.closed, self.written = False, 0  # written: n at the last line

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last >= self.interval and self.n < self.total:
            self._write(self.postfix)
        thread_policy.check()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def item_done(self, text: str, advance: int = 0) -> None:
        """A line for a finished item, after ``advance`` more units of work."""
        self.n += advance
        self._write(text, first=True)
        thread_policy.check()

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
        if 0 < self.n < self.total:
            parts.append(f"ETA {_duration(elapsed / self.n * (self.total - self.n))}")
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
