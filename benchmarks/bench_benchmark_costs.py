"""Calibrate the benchmark's cost estimate (robust_pfl/worst_case/cell_costs.json):
every method of configs/benchmark_digits.toml (its own values), at its first
heterogeneity level with Byzantine fraction 0.2, timed as a grid cell runs
(robust_pfl.cells.execute_cell, one thread), for 1 and for ROUNDS + 1 rounds, under
the plain attack and under each attack of the file's set; per round = the difference
over ROUNDS, overhead = the 1-round run minus one round.  Also records
robust_pfl.costs' estimate of a round of each method there (the scale to other tasks).

    python benchmarks/bench_benchmark_costs.py [--rounds 20] [--attacks A,B] [--out robust_pfl/worst_case/cell_costs.json]

``--attacks`` measures those attacks only (with the plain one) and updates their
entries of an existing table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from robust_pfl.cells import CellTask, execute_cell  # noqa: E402
from robust_pfl.provenance import machine_text  # noqa: E402
from robust_pfl.worst_case.cost import PLAIN, method_key  # noqa: E402
from robust_pfl.worst_case.plan import build_plan  # noqa: E402
from robust_pfl.worst_case.spec import load_benchmark  # noqa: E402


def timed(config: dict, rounds: int) -> float:
    config = {**config, "rounds": rounds, "eval_every": rounds}
    outcome = execute_cell(CellTask("calibration", config, "calibration", None, 1))
    if outcome.error:
        raise RuntimeError(outcome.error)
    return outcome.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "robust_pfl" / "worst_case" / "cell_costs.json"))
    parser.add_argument("--attacks", default=None, help="comma-separated: measure these only, update the table")
    args = parser.parse_args()
    spec = load_benchmark(ROOT / "configs" / "benchmark_digits.toml", tune=False)
    level = spec.benchmark.heterogeneity[0]["label"]
    spec = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={
        "fractions": [0.0, 0.2], "heterogeneity": spec.benchmark.heterogeneity[:1], "backdoors": []})})
    plan = build_plan(spec)
    only = None if args.attacks is None else {PLAIN, *args.attacks.split(",")}
    old = json.loads(Path(args.out).read_text(encoding="utf-8")) if only is not None else {}
    per_round: dict[str, dict[str, float]] = old.get("per_round", {})
    model_round: dict[str, float] = old.get("model_round", {})
    overheads = []
    for key, combo in plan.combos.items():
        if key[3] != 0.2 or (only is not None and combo.config.attack.name not in only):
            continue
        name = method_key(combo)
        config = combo.config.model_copy(update={"seeds": [0]}).model_dump()
        one, many = timed(config, 1), timed(config, args.rounds + 1)
        step = max((many - one) / args.rounds, 0.0)
        per_round.setdefault(name, {})[combo.config.attack.name] = step
        from robust_pfl.experiments import built

        model_round[name] = built(combo.config).round_seconds[0]
        if combo.config.attack.name == PLAIN:
            overheads.append(one - step)
        print(f"{name:32s} {combo.config.attack.name:28s} {1000 * step:8.2f} ms a round", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    table = {
        "what": "seconds a round of each method (the benchmark's digits task, level " + repr(level) + ", f = 0.2, "
                "one thread) under each attack; benchmarks/bench_benchmark_costs.py",
        "machine": machine_text(), "commit": commit, "rounds": args.rounds,
        "overhead_seconds": statistics.median(overheads) if only is None else old["overhead_seconds"],
        "per_round": per_round, "model_round": model_round,
    }
    Path(args.out).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
