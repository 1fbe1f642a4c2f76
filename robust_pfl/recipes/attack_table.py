"""Attack x defense table on synthetic data: which defenses hold, which break.

One honest cluster (so every defense targets the same optimum ``x*`` and a single
robust average is the right answer): 20 honest clients of the synthetic linear
regression task (Werner et al. Sec. 4.1; d = 10, 9 samples each, ``x*`` in {0, 100}^10) plus
5 Byzantine clients (20 %), full-batch gradients, heavy-ball SGD (lr 0.01, momentum
0.9).  Defenses: FedAvg with each classic robust aggregator, Federated-Clustering
(Werner et al. Alg. 2), Momentum-Clustering (Alg. 4) and the oracle GroundTruth
(knows who is Byzantine).  Attacks: every registered gradient attack (data attacks
need a classification task and are left out here).

A cell is the honest clients' final ``||x_i - x*||^2`` relative to the initial error
(mean over seeds); a defense **breaks** when that is above 1e-2 (it failed to remove
99 % of the initial error) or not finite.  The grid is resumable: finished cells are
kept in ``cells.jsonl`` and a rerun skips them.

Quick mode (100 rounds, 1 seed) is a smoke run, and its output and ``attack_table.md``
say so: at 100 rounds a slow defense can still be above the threshold without any
attack, so its ✗ marks are not the table's verdicts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import attacks
from robust_pfl.experiments import progress_bar, run_cell_config
from robust_pfl.grid import Cell, CellStore, run_grid
from robust_pfl.results import history_text, write_outputs

BREAK_THRESHOLD = 1e-2
HONEST = 20
BYZANTINE = 5
OPTIMISER = {"lr": 0.01, "heavy_ball": 0.9}

DEFENSES: dict[str, dict[str, Any]] = {
    "mean": {"name": "global", "aggregator": "mean"},
    "median": {"name": "global", "aggregator": "median"},
    "trimmed_mean": {"name": "global", "aggregator": {"name": "trimmed_mean", "f": BYZANTINE}},
    "krum": {"name": "global", "aggregator": {"name": "krum", "f": BYZANTINE}},
    "multi_krum": {"name": "global", "aggregator": {"name": "multi_krum", "f": BYZANTINE}},
    "geometric_median": {"name": "global", "aggregator": "geometric_median"},
    "centered_clipping": {"name": "global", "aggregator": {"name": "centered_clipping", "tau": 100.0}},
    "bucketing+median": {"name": "global", "aggregator": {"name": "bucketing", "inner": "median", "s": 2}},
    "FC": {"name": "fc", "radius": {"policy": "quantile", "q": 0.5}},
    "MC": {"name": "mc", "radius": {"policy": "quantile", "q": 0.5}, "clusters": 1},
    "GT (oracle)": {"name": "ground_truth"},
}

ATTACKS: dict[str, dict[str, Any]] = {
    "none": {"name": "none"},
    "large_gradient": {"name": "large_gradient"},
    "nan": {"name": "constant", "value": math.nan},
    "1e38": {"name": "constant", "value": 1e38},
    "bit_flip": {"name": "bit_flip"},
    "gaussian_noise": {"name": "gaussian_noise"},
    "alie": {"name": "alie"},
    "ipm": {"name": "ipm", "eps": 0.1},
    "mimic": {"name": "mimic"},
    "min_max": {"name": "min_max"},
    "min_sum": {"name": "min_sum"},
    "ball_edge": {"name": "ball_edge"},
    "optimised(alie)": {"name": "optimised", "base": {"name": "alie"}},
}


@dataclass(frozen=True)
class Mode:
    rounds: int
    seeds: int


FULL = Mode(rounds=300, seeds=3)
QUICK = Mode(rounds=100, seeds=1)


def cell_config(attack: dict[str, Any], defense: dict[str, Any], seed: int, mode: Mode) -> dict[str, Any]:
    """The run config of one cell (validated when built)."""
    return {
        "seeds": [seed],
        "rounds": mode.rounds,
        "eval_every": mode.rounds,
        "dtype": "float64",
        "task": {"clusters": 1, "clients_per_cluster": HONEST},
        "byzantine": {"total": BYZANTINE},
        "attack": attack,
        "methods": [{**defense, **OPTIMISER}],
    }


def gradient_attacks() -> dict[str, dict[str, Any]]:
    """The table's attacks that are registered and do not poison data."""
    return {
        label: spec
        for label, spec in ATTACKS.items()
        if spec["name"] == "none"
        or (spec["name"] in attacks.REGISTRY and "data" not in getattr(attacks.REGISTRY[spec["name"]], "needs", ()))
    }


def cells(mode: Mode) -> list[Cell]:
    out = []
    for attack_label, attack in gradient_attacks().items():
        for defense_label, defense in DEFENSES.items():
            for seed in range(mode.seeds):
                key = (("attack", attack_label), ("defense", defense_label), ("seed", seed))
                out.append(Cell(key, cell_config(attack, defense, seed, mode)))
    return out


def run_cell(cell: Cell) -> list[dict[str, Any]]:
    return run_cell_config(cell.payload, f"attack table cell {cell.key_text}")


def relative_errors(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """``{(attack, defense): mean over seeds of final/initial param_error}``."""
    errors: dict[tuple[str, str, int], dict[int, float]] = {}
    for row in rows:
        if row["metric"] == "param_error":
            errors.setdefault((row["attack"], row["defense"], row["seed"]), {})[row["round"]] = float(row["value"])
    per_cell: dict[tuple[str, str], list[float]] = {}
    for (attack, defense, _), by_round in errors.items():
        ratio = by_round[max(by_round)] / by_round[0]
        per_cell.setdefault((attack, defense), []).append(ratio if math.isfinite(ratio) else math.inf)
    return {key: mean(values) for key, values in per_cell.items()}


def holds(value: float) -> bool:
    return math.isfinite(value) and value <= BREAK_THRESHOLD


def markdown(errors: dict[tuple[str, str], float]) -> str:
    attack_labels = list(dict.fromkeys(a for a, _ in errors))
    defense_labels = [d for d in DEFENSES if any((a, d) in errors for a in attack_labels)]
    lines = [
        "| attack \\ defense | " + " | ".join(defense_labels) + " |",
        "|---|" + "---|" * len(defense_labels),
    ]
    for attack in attack_labels:
        cells_text = []
        for defense in defense_labels:
            value = errors[(attack, defense)]
            cells_text.append(f"{value:.1e}" + ("" if holds(value) else " ✗"))
        lines.append(f"| {attack} | " + " | ".join(cells_text) + " |")
    return "\n".join(lines)


def quick_note(errors: dict[tuple[str, str], float], mode: Mode) -> str:
    """What a quick table is: a smoke run whose ✗ can mean "still converging"."""
    slow = [d for d in DEFENSES if ("none", d) in errors and not holds(errors[("none", d)])]
    shown = f" (marked ✗ here without any attack: {', '.join(slow)})" if slow else ""
    return (
        f"Quick mode ({mode.rounds} rounds, {mode.seeds} seed(s)): a smoke run, not the attack table. A ✗ here "
        f"can mean a defense is still converging{shown}; the full run ({FULL.rounds} rounds, {FULL.seeds} "
        f"seeds) decides which defenses break."
    )


def main(out: Path, quick: bool = False, seeds: int | None = None) -> dict[str, Any]:
    mode = QUICK if quick else FULL
    if seeds is not None:
        mode = Mode(mode.rounds, seeds)
    start = time.perf_counter()
    grid = cells(mode)
    store = CellStore(out / "cells.jsonl")
    with progress_bar(len(grid), "attack table") as bar:
        rows = run_grid(grid, run_cell, store, on_cell=lambda cell, skipped: bar.update(1))
    errors = relative_errors(rows)
    table = markdown(errors)
    seconds = time.perf_counter() - start
    header = (
        f"Relative honest error ||x - x*||^2 / initial after {mode.rounds} rounds, mean of "
        f"{mode.seeds} seed(s); ✗ = breaks (> {BREAK_THRESHOLD:g} or not finite). "
        f"{HONEST} honest + {BYZANTINE} Byzantine clients, one cluster. {seconds:.0f} s."
    )
    if quick:
        header = quick_note(errors, mode) + "\n\n" + header
    summary = {
        "mode": "quick" if quick else "full",
        "relative_error": {f"{a} | {d}": v for (a, d), v in errors.items()},
        "breaks": sorted(f"{a} | {d}" for (a, d), v in errors.items() if not holds(v)),
        "rounds": mode.rounds,
        "seeds": mode.seeds,
        "seconds": seconds,
    }
    write_outputs(out, summary, {"attack_table.md": header + "\n\n" + table + "\n", "history.csv": history_text(rows)})
    print(header)
    print(table)
    print(f"wrote {out / 'attack_table.md'}, {out / 'history.csv'}, {out / 'summary.json'}")
    return summary
