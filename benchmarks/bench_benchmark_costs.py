"""Calibrate the benchmark's cost estimate (robust_pfl/worst_case/cell_costs.json) for
one benchmark file's dataset: every method of the file (its own values), at its first
heterogeneity level with Byzantine fraction 0.2, timed as a grid cell runs
(robust_pfl.cells.execute_cell, one thread), under the plain attack and under each
attack of the file's set.  Three timings give the three terms of
robust_pfl.worst_case.cost.run_seconds:

    one   = 1 round, metrics at rounds 0 and 1
    many  = ROUNDS + 1 rounds, metrics at rounds 0 and ROUNDS + 1
    evals = ROUNDS + 1 rounds, metrics every round (plain attack only)

per round = (many - one) / ROUNDS (a difference lost in timing noise falls back to
many / (ROUNDS + 1), an upper bound); per evaluation = (evals - many) / ROUNDS;
overhead = one - per round - 2 per evaluation (the median over methods).  Also
records robust_pfl.costs' estimate of a round of each method there (the scale to a
dataset without its own entry).

    python benchmarks/bench_benchmark_costs.py [--config configs/benchmark_digits.toml] [--data-dir DIR]
        [--rounds 20] [--attacks A,B] [--out robust_pfl/worst_case/cell_costs.json]

The dataset's entry is replaced; other datasets' entries are kept.  ``--attacks``
measures those attacks only (with the plain one) and updates them in the dataset's
existing entry.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from robust_pfl.cells import CellTask, execute_cell  # noqa: E402
from robust_pfl.provenance import machine_text  # noqa: E402
from robust_pfl.worst_case.cost import PLAIN, method_key, task_key  # noqa: E402
from robust_pfl.worst_case.plan import build_plan  # noqa: E402
from robust_pfl.worst_case.loading import load_benchmark  # noqa: E402


def timed(config: dict, rounds: int, eval_every: int) -> float:
    config = {**config, "rounds": rounds, "eval_every": eval_every}
    outcome = execute_cell(CellTask("calibration", config, "calibration", None, 1))
    if outcome.error:
        raise RuntimeError(outcome.error)
    return outcome.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "benchmark_digits.toml"))
    parser.add_argument("--data-dir", default=None, help="the dataset's directory (sets ROBUST_PFL_DATA)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "robust_pfl" / "worst_case" / "cell_costs.json"))
    parser.add_argument("--attacks", default=None, help="comma-separated: measure these only, update the entry")
    args = parser.parse_args()
    if args.data_dir is not None:
        os.environ["ROBUST_PFL_DATA"] = str(Path(args.data_dir).resolve())
    spec = load_benchmark(args.config, tune=False)
    level = spec.benchmark.heterogeneity[0]["label"]
    spec = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={
        "fractions": [0.0, 0.2], "heterogeneity": spec.benchmark.heterogeneity[:1], "backdoors": []})})
    plan = build_plan(spec)
    dataset = task_key(next(iter(plan.combos.values())).config)
    out = Path(args.out)
    table = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {"tasks": {}}
    only = None if args.attacks is None else {PLAIN, *args.attacks.split(",")}
    old = table["tasks"].get(dataset, {}) if only is not None else {}
    per_round: dict[str, dict[str, float]] = old.get("per_round", {})
    per_evaluation: dict[str, float] = old.get("per_evaluation", {})
    model_round: dict[str, float] = old.get("model_round", {})
    overheads = []
    rounds = args.rounds
    for key, combo in plan.combos.items():
        if key[3] != 0.2 or (only is not None and combo.config.attack.name not in only):
            continue
        name, attack = method_key(combo), combo.config.attack.name
        config = combo.config.model_copy(update={"seeds": [0]}).model_dump()
        one, many = timed(config, 1, 1), timed(config, rounds + 1, rounds + 1)
        step = (many - one) / rounds if many > one else many / (rounds + 1)
        per_round.setdefault(name, {})[attack] = step
        from robust_pfl.experiments import built

        model_round[name] = built(combo.config).round_seconds[0]
        if attack == PLAIN:
            evaluation = max(timed(config, rounds + 1, 1) - many, 0.0) / rounds
            per_evaluation[name] = evaluation
            overheads.append(max(one - step - 2 * evaluation, 0.0))
            print(f"{name:32s} {'(one evaluation)':28s} {1000 * evaluation:8.2f} ms", flush=True)
        print(f"{name:32s} {attack:28s} {1000 * step:8.2f} ms a round", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    table["tasks"][dataset] = {
        "what": (f"seconds of each method on {Path(args.config).name}'s task, level {level!r}, f = 0.2, one "
                 "thread: a round under each attack, an evaluation, a run's overhead; "
                 "benchmarks/bench_benchmark_costs.py"),
        "machine": machine_text(), "commit": commit, "rounds": rounds,
        "overhead_seconds": statistics.median(overheads) if overheads else old["overhead_seconds"],
        "per_round": per_round, "per_evaluation": per_evaluation, "model_round": model_round,
    }
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out} (entry {dataset!r})")


if __name__ == "__main__":
    main()
