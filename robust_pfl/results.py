"""Tidy results: one row per (run, round, metric), written atomically.

``history.csv`` columns: ``method, seed, round, metric, value`` (honest-client means).
``summary.json``: the final metrics per method (mean and per-seed values).
Both are written through a temporary file and ``os.replace`` so a killed run never
leaves a half-written file.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any, Iterable


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
        last recorded round."""
        last: dict[tuple[str, int, str], tuple[int, float]] = {}
        for row in self.rows:
            key = (row["method"], row["seed"], row["metric"])
            if key not in last or row["round"] >= last[key][0]:
                last[key] = (row["round"], row["value"])
        summary: dict[str, dict[str, dict[str, Any]]] = {}
        for (method, seed, metric), (_, value) in sorted(last.items()):
            entry = summary.setdefault(method, {}).setdefault(metric, {"per_seed": {}})
            entry["per_seed"][str(seed)] = value
        for metrics in summary.values():
            for entry in metrics.values():
                entry["mean"] = mean(entry["per_seed"].values())
        return summary


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; results are ordinary files
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


BASE_COLUMNS = ["method", "seed", "round", "metric", "value"]


def write_history(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """Tidy CSV; extra keys (e.g. a recipe's ``setting``) become leading columns."""
    import io

    rows = list(rows)
    extra = sorted({key for row in rows for key in row} - set(BASE_COLUMNS))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*extra, *BASE_COLUMNS])
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def _json_safe(value: Any) -> Any:
    """Standard JSON has no Infinity/NaN: write them as the strings "inf", "-inf",
    "nan" (a diverged baseline legitimately reports an infinite loss)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def write_summary(summary: dict[str, Any], path: Path) -> None:
    """``summary.json``, strict JSON (non-finite numbers as strings)."""
    text = json.dumps(_json_safe(summary), indent=2, sort_keys=True, allow_nan=False)
    atomic_write_text(path, text + "\n")


def write_results(table: ResultTable, out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``history.csv`` and ``summary.json`` into ``out_dir``; return the summary."""
    summary = {"final": table.final(), **(extra or {})}
    write_history(table.rows, out_dir / "history.csv")
    write_summary(summary, out_dir / "summary.json")
    return summary
