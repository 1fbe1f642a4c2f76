"""Where a benchmark cell's time goes: one defense of a benchmark file under each of
the given attacks (its own values, the file's first heterogeneity level, Byzantine
fraction 0.2, one seed, ``--rounds`` rounds, metrics at the first and last round
only), run as a grid cell runs it (robust_pfl.cells.execute_cell, one thread) under
cProfile after one warm-up round.  Per cell: the seconds a round, and the share spent
in the defense's gradients, in the delivery (the attack writing its rows), in the
clustering (Threshold-Clustering, Alg. 3) and in the evaluations.

    python benchmarks/profile_benchmark_cells.py --config configs/benchmark_mnist.toml --data-dir DIR \\
        --defense FC --attacks gaussian_noise,alie,ball_edge [--rounds 10] [--out benchmarks/benchmark_cell_profile.json]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from robust_pfl.cells import CellTask, execute_cell  # noqa: E402
from robust_pfl.provenance import machine_text  # noqa: E402
from benchmarks.attacked_cells import attacked_cells  # noqa: E402
from robust_pfl.worst_case.loading import load_benchmark  # noqa: E402

#: The parts of a round, each the cumulative time of one function (file, name).
PARTS = {
    "gradients": [("robust_pfl/engine/federation.py", "cross_gradients"),
                  ("robust_pfl/engine/federation.py", "gradients")],
    "delivery (attack)": [("robust_pfl/engine/federation.py", "deliver")],
    "clustering": [("defenses/threshold_clustering.py", "threshold_clustering")],
    "evaluation": [("robust_pfl/experiments.py", "honest_means")],
}


def part_seconds(stats: pstats.Stats) -> dict[str, float]:
    """The cumulative seconds of each part (:data:`PARTS`) in ``stats``."""
    found = {name: 0.0 for name in PARTS}
    for (path, _, function), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        for name, places in PARTS.items():
            if any(path.endswith(file) and function == wanted for file, wanted in places):
                found[name] += cumulative
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "benchmark_digits.toml"))
    parser.add_argument("--data-dir", default=None, help="the dataset's directory (sets ROBUST_PFL_DATA)")
    parser.add_argument("--defense", default="FC", help="the defense's label in the file")
    parser.add_argument("--attacks", default="gaussian_noise,alie,ball_edge")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "benchmark_cell_profile.json"))
    args = parser.parse_args()
    if args.data_dir is not None:
        os.environ["ROBUST_PFL_DATA"] = str(Path(args.data_dir).resolve())
    spec = load_benchmark(args.config, tune=False)
    rows = []
    for key, config in attacked_cells(spec, {args.defense}, args.attacks.split(","), args.rounds):
        execute_cell(CellTask("warm-up", {**config, "rounds": 1, "eval_every": 1}, "warm-up", None, 1))
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        outcome = execute_cell(CellTask("profile", config, "profile", None, 1))
        profile.disable()
        seconds = time.perf_counter() - start
        if outcome.error:
            raise RuntimeError(outcome.error)
        parts = part_seconds(pstats.Stats(profile))
        rows.append({"defense": key[0], "attack": key[4], "rounds": args.rounds, "seconds": seconds,
                     "per_round_ms": 1000 * seconds / args.rounds,
                     "shares": {name: value / seconds for name, value in parts.items()}})
        shares = ", ".join(f"{name} {100 * value / seconds:.0f}%" for name, value in parts.items())
        print(f"{key[0]:8s} {key[4]:26s} {rows[-1]['per_round_ms']:8.1f} ms a round (profiled): {shares}", flush=True)
    Path(args.out).write_text(json.dumps({"machine": machine_text(), "threads": 1, "config": Path(args.config).name,
                                          "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
