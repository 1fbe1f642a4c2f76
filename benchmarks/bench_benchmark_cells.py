"""Seconds of the benchmark's most expensive cells, with the adaptive attacks' full
searches every round (``search_every = 1``, the attacks' default) and warm-started
between full searches every 10 rounds (the shipped benchmark's setting), in one
process, one thread, side by side (docs/benchmark.md, "Cost").

Cells: FC, MC and PFL-TC of configs/benchmark_digits.toml (their own values and
rounds), at the K = 2 level with Byzantine fraction 0.2, under a plain attack
(gaussian_noise) and under optimal_alie, optimal_ipm and clipped_clustering_attack.
Each cell is timed as a grid cell runs it (robust_pfl.cells.execute_cell), the two
settings alternating, ``--repeats`` times; the median is reported.

    python benchmarks/bench_benchmark_cells.py [--rounds 40] [--repeats 3] [--out benchmarks/benchmark_cells.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from robust_pfl.cells import CellTask, execute_cell  # noqa: E402
from robust_pfl.provenance import machine_text  # noqa: E402
from benchmarks.attacked_cells import attacked_cells  # noqa: E402
from robust_pfl.worst_case.loading import load_benchmark  # noqa: E402

DEFENSES = ("FC", "MC", "PFL-TC")
ATTACKS = ("gaussian_noise", "optimal_alie", "optimal_ipm", "clipped_clustering_attack")


def seconds(config: dict) -> float:
    outcome = execute_cell(CellTask("bench", config, "bench", None, 1))
    if outcome.error:
        raise RuntimeError(outcome.error)
    return outcome.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "benchmark_cells.json"))
    args = parser.parse_args()
    spec = load_benchmark(ROOT / "configs" / "benchmark_digits.toml", tune=False)
    rows = []
    for key, config in attacked_cells(spec, set(DEFENSES), list(ATTACKS), args.rounds):
        settings = {"search every round": {**config, "attack": {**config["attack"], "search_every": 1}},
                    "warm start, full search every 10": config}
        if key[4] == "gaussian_noise":
            settings = {"plain attack": config}
        times: dict[str, list[float]] = {name: [] for name in settings}
        for _ in range(args.repeats):
            for name, setting in settings.items():
                times[name].append(seconds(setting))
        for name, values in times.items():
            rows.append({"defense": key[0], "attack": key[4], "setting": name, "rounds": args.rounds,
                         "seconds": statistics.median(values), "per_round_ms": 1000 * statistics.median(values)
                         / args.rounds, "runs": values})
            print(f"{key[0]:7s} {key[4]:27s} {name:34s} {rows[-1]['per_round_ms']:8.1f} ms a round", flush=True)
    Path(args.out).write_text(json.dumps({"machine": machine_text(), "threads": 1, "rows": rows}, indent=1) + "\n",
                              encoding="utf-8")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
