"""Tidy results: one row per (run, round, metric), written atomically.

``history.csv`` columns: ``method, seed, round, metric, value`` (honest-client means).
``summary.json``: the final metrics per method (mean and per-seed values; methods in
config order, every other key sorted), plus what the caller adds (``robust-pfl run``:
its ``config`` and ``provenance``).

Every file is written through a temporary file in its directory and ``os.replace``,
so a killed run never leaves a half-written file.  A command's outputs (history,
tables, figures) are written together by :func:`write_outputs`, which keeps one
invariant: **summary.json is the completion mark**.  Every output is first staged
(computed and written to its temporary file); the old ``summary.json`` is then
removed, the outputs are moved into place, and the new ``summary.json`` comes last.
So wherever a ``summary.json`` exists, every output beside it is from the same
finished call; a kill part-way leaves the previous call's complete set (staging) or
outputs without a ``summary.json`` (moving), never outputs next to a stale summary.
"""

from __future__ import annotations

import csv
import io
import json
import math
import glob
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any, Callable, Iterable, Mapping, Union


@dataclass
class ResultTable:
    """Accumulates tidy rows."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, method: str, seed: int, round_index: int, metrics: dict[str, float]) -> None:
        for metric, value in metrics.items():
            self.rows.append(
                {"method": method, "seed": seed, "round": round_index, "metric": metric, "value": value}
            )

    def extend(self, other: "ResultTable") -> None:
        self.rows.extend(other.rows)

    def final(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{method: {metric: {"mean": m, "per_seed": {seed: v}}}}`` at each run's
        last recorded round; methods in the order their rows first appear (a run's
        config order), kept in ``summary.json`` (:class:`KeptOrder`)."""
        last: dict[tuple[str, int, str], tuple[int, float]] = {}
        for row in self.rows:
            key = (row["method"], row["seed"], row["metric"])
            if key not in last or row["round"] >= last[key][0]:
                last[key] = (row["round"], row["value"])
        position = {method: index for index, method in enumerate(dict.fromkeys(row["method"] for row in self.rows))}
        summary: dict[str, dict[str, dict[str, Any]]] = KeptOrder()
        for (method, seed, metric), (_, value) in sorted(last.items(), key=lambda item: (position[item[0][0]], item[0])):
            entry = summary.setdefault(method, {}).setdefault(metric, {"per_seed": {}})
            entry["per_seed"][str(seed)] = value
        for metrics in summary.values():
            for entry in metrics.values():
                entry["mean"] = mean(entry["per_seed"].values())
        return summary


class KeptOrder(dict):
    """A dict whose keys ``summary.json`` keeps in insertion order (a run's methods in
    config order); the keys of every other dict in a summary are written sorted."""


#: What a file may be written from: its text, or a function that writes it to a path.
Content = Union[str, Callable[[Path], None]]

SUMMARY = "summary.json"


def staged_file(path: Path, content: Content) -> Path:
    """Write ``content`` to a new temporary file beside ``path`` (same suffix, so that
    writers that infer the format from it work) and return the temporary path.
    Temporaries of ``path`` that a killed write left behind are removed first (a file
    has one writer at a time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    temporary = Path(name)
    try:
        if callable(content):
            os.close(fd)
            content(temporary)
        else:
            with os.fdopen(fd, "w", newline="") as handle:
                handle.write(content)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp creates 0600; results are ordinary files
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporaries of ``path`` (:func:`staged_file`'s ``.<name>.*`` files
    beside it) that a killed write left behind."""
    for stale in path.parent.glob(f"{glob.escape(f'.{path.name}.')}*"):
        stale.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory."""
    os.replace(staged_file(path, text), path)


def save_png(figure: Any, target: Path, **options: Any) -> None:
    """Save a matplotlib figure as ``target`` via a temporary file (``options`` go to
    ``savefig``; default ``dpi=110``)."""
    os.replace(staged_file(target, png_writer(figure, **options)), target)


def png_writer(figure: Any, **options: Any) -> Callable[[Path], None]:
    """The :data:`Content` of a matplotlib figure saved as PNG (``options`` go to
    ``savefig``; default ``dpi=110``)."""
    return lambda path: figure.savefig(path, format="png", **{"dpi": 110, **options})


def close_figure(figure: Any) -> None:
    """Release a matplotlib figure made through pyplot (after it has been written)."""
    import matplotlib.pyplot as plt

    plt.close(figure)


def write_outputs(out_dir: Path, summary: dict[str, Any], files: Mapping[str, Content]) -> None:
    """Write ``files`` (name -> content) and ``summary.json`` into ``out_dir``, keeping
    the module's invariant: all staged first, then the old summary removed, the files
    moved into place in order, and the summary last."""
    if SUMMARY in files:
        raise ValueError(f"{SUMMARY} is written from the summary, not from files")
    staged: dict[str, Path] = {}
    try:
        for name, content in [*files.items(), (SUMMARY, summary_text(summary))]:
            staged[name] = staged_file(out_dir / name, content)
        (out_dir / SUMMARY).unlink(missing_ok=True)
        for name in list(staged):
            os.replace(staged[name], out_dir / name)
            del staged[name]
    finally:
        for temporary in staged.values():
            temporary.unlink(missing_ok=True)


def write_files(out_dir: Path, files: Mapping[str, Content]) -> None:
    """Write ``files`` (name -> content) into ``out_dir`` without a summary: every file
    staged before any is moved into place, so a failure while computing one (a figure
    that cannot be drawn) leaves the previous set untouched."""
    staged: dict[str, Path] = {}
    try:
        for name, content in files.items():
            staged[name] = staged_file(out_dir / name, content)
        for name in list(staged):
            os.replace(staged.pop(name), out_dir / name)
    finally:
        for temporary in staged.values():
            temporary.unlink(missing_ok=True)


BASE_COLUMNS = ["method", "seed", "round", "metric", "value"]


def history_text(rows: Iterable[dict[str, Any]]) -> str:
    """Tidy CSV; extra keys (e.g. a recipe's ``setting``) become leading columns."""
    rows = list(rows)
    extra = sorted({key for row in rows for key in row} - set(BASE_COLUMNS))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*extra, *BASE_COLUMNS])
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_history(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """:func:`history_text` of ``rows``, written atomically to ``path``."""
    atomic_write_text(path, history_text(rows))


def json_safe(value: Any) -> Any:
    """Standard JSON has no Infinity/NaN: write them as the strings "inf", "-inf",
    "nan" (a diverged baseline legitimately reports an infinite loss)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        safe = {key: json_safe(item) for key, item in value.items()}
        return KeptOrder(safe) if isinstance(value, KeptOrder) else safe
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def _key_sorted(value: Any) -> Any:
    """``value`` with the keys of its dicts sorted, except a :class:`KeptOrder`'s."""
    if isinstance(value, dict):
        items = value.items() if isinstance(value, KeptOrder) else sorted(value.items(), key=lambda item: item[0])
        return {key: _key_sorted(item) for key, item in items}
    if isinstance(value, (list, tuple)):
        return [_key_sorted(item) for item in value]
    return value


def summary_text(summary: dict[str, Any]) -> str:
    """``summary.json``'s text: strict JSON (non-finite numbers as strings), keys
    sorted except a :class:`KeptOrder`'s (``final``: methods in config order)."""
    return json.dumps(_key_sorted(json_safe(summary)), indent=2, allow_nan=False) + "\n"


def write_summary(summary: dict[str, Any], path: Path) -> None:
    """:func:`summary_text` of ``summary``, written atomically to ``path``."""
    atomic_write_text(path, summary_text(summary))


def write_results(table: ResultTable, out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``history.csv`` and ``summary.json`` into ``out_dir`` (:func:`write_outputs`);
    return the summary."""
    summary = {"final": table.final(), **(extra or {})}
    write_outputs(out_dir, summary, {"history.csv": history_text(table.rows)})
    return summary
