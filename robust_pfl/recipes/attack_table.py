"""Attack x defense tables: which defenses hold, which break.

Each table is a grid file in ``configs/`` (``robust-pfl grid`` runs them too); this
recipe runs them (resumable, into ``OUT/<table>/``) and writes ``attack_table.md``:

* **synthetic** (``configs/attack_table.toml``): one honest cluster of the synthetic
  linear regression task, so a robust average is the right answer.  A cell is the
  honest clients' final ``||x_i - x*||^2`` relative to the initial error (mean over
  seeds); a defense **breaks** when that is above ``BREAK_THRESHOLD`` (it failed to
  remove 99 % of the initial error) or not finite.
* **digits** (``configs/attack_table_digits.toml``): the embedded digits, private
  label, K = 4, gradient attacks and label flipping.  A cell is the honest clients'
  final test accuracy (%, mean over seeds); a defense **breaks** when that is more
  than ``ACCURACY_DROP`` points below its own accuracy without attack, or not finite.
* **systems** (``configs/pfl_systems_digits.toml``): the same task and measure for
  every clustered-PFL system (CLoVE, CGPFL, FedSPD, PDL-TC, CFL, HypCluster, IFCA,
  the threshold-clustering family ...) without attack and under large gradients, bit
  flip and label flipping; one row per system.
* **backdoor** (``configs/backdoor_table_digits.toml``): digits by rotation, K = 4;
  FC, MC, CLoVE and Global with every robust aggregator under BadNets, DBA and model
  replacement.  A cell is the final honest test accuracy and attack success rate
  (%, mean over seeds); a defense **breaks** when the attack success rate is above
  ``BACKDOOR_ASR`` or the accuracy falls as in the digits table; one row per defense.

Quick mode (fewer rounds, 1 seed) overrides the files' ``rounds`` and ``seeds``: a
smoke run, and its output says so (a slow defense can still be converging).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from robust_pfl.backends import Backend
from robust_pfl.grid import grid_results, run_grid
from robust_pfl.pages import grid_cells
from robust_pfl.grid_file import Grid, expand_grid, on_device, read_grid_file
from robust_pfl.recipes import quick_sentence
from robust_pfl.engine.results import history_text, write_outputs

#: The grid files, found in the source checkout (``pip install -e .``).
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
BREAK_THRESHOLD = 1e-2
ACCURACY_DROP = 10.0  # points
BACKDOOR_ASR = 50.0  # %: the backdoor fires on most triggered images


@dataclass(frozen=True)
class Mode:
    rounds: int
    seeds: int


@dataclass(frozen=True)
class Table:
    """One attack x defense table: its grid file, quick mode and verdict."""

    file: str
    quick: Mode
    measure: str  # "relative_error", "accuracy" or "backdoor" (accuracy and attack success rate)
    defense_rows: bool = False  # one row per defense (many defenses), else per attack


TABLES: dict[str, Table] = {
    "synthetic": Table("attack_table.toml", Mode(rounds=100, seeds=1), "relative_error"),
    "digits": Table("attack_table_digits.toml", Mode(rounds=40, seeds=1), "accuracy"),
    "systems": Table("pfl_systems_digits.toml", Mode(rounds=40, seeds=1), "accuracy", defense_rows=True),
    "backdoor": Table("backdoor_table_digits.toml", Mode(rounds=30, seeds=1), "backdoor", defense_rows=True),
}


def load(name: str, quick: bool = False, seeds: int | None = None, device: str | None = None) -> tuple[Grid, Mode]:
    """Table ``name``'s grid, with quick mode's rounds and seeds, or ``seeds`` seeds,
    on ``device`` (default: the file's); and the full mode the file describes."""
    table = TABLES[name]
    path = CONFIGS / table.file
    data = on_device(read_grid_file(path), device, str(path))
    full = Mode(rounds=data.get("rounds", 100), seeds=len(data.get("seeds", [0])))
    if quick:
        data.update(rounds=table.quick.rounds, seeds=list(range(table.quick.seeds)))
    if seeds is not None:
        data["seeds"] = list(range(seeds))
    return expand_grid(data, str(path)), full


def relative_errors(rows: pd.DataFrame) -> dict[tuple[str, str], float]:
    """``{(attack, defense): mean over seeds of final / initial param_error}``."""
    error = rows[rows["metric"] == "param_error"]
    first = error.loc[error.groupby("cell")["round"].idxmin()].set_index("cell")
    last = error[error["final"]].set_index("cell")
    ratio = (last["value"] / first["value"]).where(lambda r: r.map(math.isfinite), math.inf)
    per_cell = pd.DataFrame({"attack": last["attack"], "method": last["method"], "ratio": ratio})
    return {key: float(v) for key, v in per_cell.groupby(["attack", "method"], sort=False)["ratio"].mean().items()}


def accuracies(rows: pd.DataFrame, metric: str = "test_accuracy") -> dict[tuple[str, str], float]:
    """``{(attack, defense): mean over seeds of the final honest ``metric``, %}`` (test
    accuracy, or the attack success rate of a backdoor run)."""
    final = rows[(rows["metric"] == metric) & rows["final"]]
    mean = final.groupby(["attack", "method"], sort=False)["value"].mean()
    return {key: 100 * float(v) for key, v in mean.items()}


def breaks(values: dict[tuple[str, str], float], measure: str,
           success: dict[tuple[str, str], float] | None = None) -> set[tuple[str, str]]:
    """The (attack, defense) pairs where the defense breaks (see the module doc);
    ``success`` the attack success rates of a backdoor table."""
    out = {key for key, value in values.items() if not math.isfinite(value)}
    for (attack, defense), value in values.items():
        if measure == "relative_error" and value > BREAK_THRESHOLD:
            out.add((attack, defense))
        clean = values.get(("none", defense))
        if measure != "relative_error" and clean is not None and value < clean - ACCURACY_DROP:
            out.add((attack, defense))
    for key, rate in (success or {}).items():
        if not math.isfinite(rate) or rate > BACKDOOR_ASR:
            out.add(key)
    return out


def labels(grid: Grid, column: str) -> list[str]:
    """The values of an axis column in grid order."""
    return list(dict.fromkeys(cell.axes[column] for cell in grid.cells))


def markdown(
    values: dict[tuple[str, str], float], broken: set[tuple[str, str]], grid: Grid, measure: str,
    defense_rows: bool = False, success: dict[tuple[str, str], float] | None = None,
) -> str:
    """The table: a row per attack and a column per defense, or the transpose; with
    ``success`` (a backdoor table) each cell is ``accuracy / attack success rate``."""
    attack_labels = [a for a in labels(grid, "attack") if any(k[0] == a for k in values)]
    defense_labels = [d for d in labels(grid, "method") if any(k[1] == d for k in values)]
    rows, columns = (defense_labels, attack_labels) if defense_rows else (attack_labels, defense_labels)
    corner = "defense \\ attack" if defense_rows else "attack \\ defense"
    lines = [f"| {corner} | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in rows:
        shown = []
        for column in columns:
            key = (column, row) if defense_rows else (row, column)
            value = values.get(key)
            text = "–" if value is None else (f"{value:.1e}" if measure == "relative_error" else f"{value:.1f}")
            if success is not None and value is not None:
                rate = success.get(key)
                text += " / –" if rate is None else f" / {rate:.1f}"
            shown.append(text + (" ✗" if key in broken else ""))
        lines.append(f"| {row} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def describe(name: str, grid: Grid, mode: Mode, measure: str) -> str:
    """The table's heading: what it ran and what a cell and a ✗ mean."""
    cell = grid.cells[0]
    task = cell.config["task"]
    if measure == "relative_error":
        what = (f"Relative honest error ||x - x*||^2 / initial; ✗ = breaks (> {BREAK_THRESHOLD:g} or not finite). "
                f"{cell.n_clients - cell.n_byzantine} honest + {cell.n_byzantine} Byzantine clients, "
                f"{task['clusters']} cluster(s).")
    elif measure == "backdoor":
        what = (f"Final honest test accuracy / attack success rate (%); ✗ = attack success rate above "
                f"{BACKDOOR_ASR:g}% or accuracy more than {ACCURACY_DROP:g} points below the same defense without "
                f"attack. {task['dataset']} {task['kind']}, K = {task['clusters']}, "
                f"{cell.n_clients - cell.n_byzantine} honest + {cell.n_byzantine} Byzantine clients.")
    else:
        what = (f"Final honest test accuracy (%); ✗ = more than {ACCURACY_DROP:g} points below the same defense "
                f"without attack. {task['dataset']} {task['kind']}, K = {task['clusters']}, "
                f"{cell.n_clients - cell.n_byzantine} honest + {cell.n_byzantine} Byzantine clients.")
    return f"**{name}** ({Path(grid.source).name}): {mode.rounds} rounds, mean of {mode.seeds} seed(s). {what}"


#: What every quick table run says instead of a verdict (the rule of robust_pfl.recipes).
QUICK_TABLE_SENTENCE = quick_sentence("decide which defenses break")


def quick_note(mode: Mode, full: Mode, slow: list[str]) -> str:
    """What a quick table is: a smoke run whose ✗ can mean "still converging" (``slow``:
    the defenses marked ✗ without any attack)."""
    shown = f" (marked ✗ here without any attack: {', '.join(slow)})" if slow else ""
    return (
        f"Quick mode ({mode.rounds} rounds, {mode.seeds} seed(s)): a smoke run, not the attack table. A ✗ here "
        f"can mean a defense is still converging{shown}; the full run ({full.rounds} rounds, {full.seeds} "
        f"seeds) decides which defenses break."
    )


def main(out: Path, quick: bool = False, seeds: int | None = None, tables: str = "all",
         backend: Backend | None = None, device: str | None = None) -> dict[str, Any]:
    """Run (or resume) the tables (``tables``: ``all`` or comma-separated names of
    :data:`TABLES`), write ``attack_table.md``, ``history.csv`` and ``summary.json``
    into ``out``; return the summary."""
    names = list(TABLES) if tables == "all" else [name.strip() for name in tables.split(",")]
    start = time.perf_counter()
    sections, histories, summary_tables = [], [], {}
    errored: dict[str, str] = {}
    calls: list[dict[str, Any]] = []
    for name in names:
        grid, full = load(name, quick, seeds, device)
        measure = TABLES[name].measure
        mode = Mode(grid.cells[0].config["rounds"], len(labels(grid, "seed")))
        calls.append(run_grid(grid, out / name, backend))
        errored.update(calls[-1]["errored"])
        rows = grid_results(out / name, grid)
        values = relative_errors(rows) if measure == "relative_error" else accuracies(rows)
        success = accuracies(rows, "attack_success_rate") if measure == "backdoor" else None
        broken = breaks(values, measure, success)
        text = describe(name, grid, mode, measure)
        if quick:
            slow = [d for d in labels(grid, "method") if ("none", d) in broken]
            text = quick_note(mode, full, slow) + "\n\n" + text
        sections.append(text + "\n\n" + markdown(values, broken, grid, measure, TABLES[name].defense_rows, success))
        history = rows[rows["metric"] != "cell_seconds"][["attack", "method", "seed", "round", "metric", "value"]]
        histories.append(history.assign(table=name))
        summary_tables[name] = {
            "measure": measure,
            "values": {f"{a} | {d}": v for (a, d), v in values.items()},
            **({"attack_success_rate": {f"{a} | {d}": v for (a, d), v in success.items()}} if success else {}),
            "breaks": sorted(f"{a} | {d}" for a, d in broken),
            "rounds": mode.rounds,
            "seeds": mode.seeds,
            "store": str(out / name / "results.csv"),
        }
    seconds = time.perf_counter() - start
    summary = {"mode": "quick" if quick else "full", "tables": summary_tables, "seconds": seconds, "errored": errored,
               "cells": grid_cells(calls)}
    document = "\n\n".join(sections) + f"\n\n{seconds:.0f} s in this call.\n"
    if errored:
        cells = "; ".join(f"{k}: {v}" for k, v in errored.items())
        document += f"\nErrored cells (rerun to retry them): {cells}\n"
    if quick:
        document += f"\n{QUICK_TABLE_SENTENCE}.\n"
    history_rows = pd.concat(histories).to_dict("records")
    write_outputs(out, summary, {"attack_table.md": document, "history.csv": history_text(history_rows)})
    print(document)
    print(f"wrote {out / 'attack_table.md'}, {out / 'history.csv'}, {out / 'summary.json'}")
    return summary
