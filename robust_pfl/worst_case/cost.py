"""A benchmark's cost, estimated before any work and measured after.

**One run.**  ``seconds = overhead + (rounds * per_round(method, attack) +
evaluations * per_evaluation(method)) * scale`` with ``evaluations`` the run's
metric rounds (round 0, every ``eval_every``-th and the last).  The terms are measured
per task (``benchmarks/bench_benchmark_costs.py`` writes :data:`CALIBRATION`'s entry
for a benchmark file's dataset: every method of the file under a plain attack and
under each attack of its set, on the CPU it names).  A dataset without an entry takes
the reference task's (:data:`REFERENCE_TASK`), and ``scale`` carries it there by the
ratio of :mod:`robust_pfl.costs`' estimates of a round at the two tasks (a coarse
guess: it does not see the size of the evaluation sets).  A method the entry lacks
takes :mod:`robust_pfl.costs`' estimate times the entry's median ratio of measured to
estimated seconds; an attack it lacks costs as the plain one.

**The allocation** (:mod:`robust_pfl.worst_case.allocation`) decides from the results
which runs to make, so the total is estimated by rule (:func:`estimate`): with
``n0`` initial seeds, per attacked cell of ``C`` candidates and ``A`` attacks, the
reference runs all ``A`` attacks with ``n0`` seeds; the other ``C - 1`` candidates the
``min(compare, S)`` worst of the ``S`` survivors (the share :data:`SURVIVING` of the
attacks) with ``n0`` seeds and, while the candidates race, :data:`RACE_SEEDS` more
seeds; the chosen candidate (another than the reference with probability ``1 - 1 /
C``) screens the attacks it has not raced; an open verdict adds :data:`VERDICT_SEEDS`
seeds to the surviving attacks; backdoors run with ``n0`` seeds.  Without racing every candidate runs every attack with ``n0`` seeds.
The constants are the shares measured on the shipped page (docs/benchmark.md,
"Cost"); ``tests/test_benchmark_cost.py`` checks the rule on a hand-made plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from robust_pfl.costs import readable_duration
from robust_pfl.grid_file import GridCell
from robust_pfl.worst_case.allocation import Rule
from robust_pfl.worst_case.plan import Combo, Plan
from robust_pfl.worst_case.spec import BenchmarkSpec

CALIBRATION = Path(__file__).with_name("cell_costs.json")
#: The calibrated task whose terms a dataset without its own entry borrows.
REFERENCE_TASK = "digits"
#: Share of the attacks that survive the reference candidate's race.
SURVIVING = 0.3
#: Seeds the candidates' race adds, on average, to the candidates still racing.
RACE_SEEDS = 1.0
#: Seeds an open verdict adds, on average, per attacked cell.
VERDICT_SEEDS = 1.0
#: The attack a method is calibrated under when no search runs against it.
PLAIN = "gaussian_noise"


@lru_cache(maxsize=1)
def calibration() -> dict[str, Any]:
    """The measured table (:data:`CALIBRATION`): ``{"tasks": {dataset: entry}}``, each
    entry with ``overhead_seconds``, ``per_round`` (method -> attack -> seconds),
    ``per_evaluation`` and ``model_round`` (method -> seconds)."""
    return json.loads(CALIBRATION.read_text(encoding="utf-8"))


def task_key(config: Any) -> str:
    """The calibration entry a run's task reads: an image task's dataset, else the
    task's name."""
    task = config.task
    return task.dataset if task.name == "image" else task.name


def method_key(combo: Combo) -> str:
    """``name`` of the combination's method, ``global+<aggregator>`` (with ``+pre``
    names) for Global."""
    method = combo.config.methods[0]
    options = method.options()
    if method.name != "global":
        return method.name
    rule = options.get("aggregator", "mean")
    if isinstance(rule, dict):
        return "+".join(["global", str(rule.get("name")), *map(str, rule.get("pre", []))])
    return f"global+{rule}"


def evaluations(rounds: int, eval_every: int) -> int:
    """The metric rounds of a run: round 0, every ``eval_every``-th, and the last."""
    return 1 + rounds // eval_every + (1 if rounds % eval_every else 0)


def _model_round(combo: Combo) -> float:
    from robust_pfl.experiments import built

    return built(combo.config).round_seconds[0]


def run_seconds(combo: Combo) -> float:
    """One run's estimated seconds (module docstring)."""
    tasks = calibration()["tasks"]
    dataset = task_key(combo.config)
    entry = tasks.get(dataset, tasks[REFERENCE_TASK])
    key, attack_name = method_key(combo), combo.config.attack.name
    rows, model = entry["per_round"], _model_round(combo)
    if key in rows:
        per_round = rows[key].get(attack_name, rows[key][PLAIN])
        per_evaluation = entry["per_evaluation"][key]
        scale = 1.0 if dataset in tasks else model / entry["model_round"][key]
    else:
        ratio = float(np.median([rows[k][PLAIN] / entry["model_round"][k] for k in rows]))
        evaluation_ratio = float(np.median([entry["per_evaluation"][k] / entry["model_round"][k] for k in rows]))
        per_round, per_evaluation, scale = model * ratio, model * evaluation_ratio, 1.0
    count = evaluations(combo.rounds, combo.config.eval_every)
    return entry["overhead_seconds"] + (combo.rounds * per_round + count * per_evaluation) * scale


def seconds(cells: Iterable[GridCell], plan: Plan) -> float:
    """The estimated seconds of ``cells`` (runs of ``plan``)."""
    return sum(run_seconds(plan.combo_of(cell.cell)) for cell in cells)


@dataclass(frozen=True)
class Estimate:
    """The estimated compute of a benchmark: ``seconds`` in all (by rule), of which
    ``first`` the first stage's (exact in count), ``full`` the full factorial's."""

    seconds: float
    first: float
    full: float

    def text(self, workers: int = 1) -> str:
        wall = self.seconds / max(workers, 1)
        return (f"estimated {readable_duration(self.seconds)} of compute (first stage "
                f"{readable_duration(self.first)}; the full factorial would be {readable_duration(self.full)}), "
                f"about {readable_duration(wall)} with {workers} worker{'s' if workers != 1 else ''}")


def estimate(plan: Plan, rule: Rule) -> Estimate:
    """The rule of the module docstring over every table cell of ``plan``."""
    pool, first = len(rule.seeds), rule.first
    total = first_stage = full = 0.0
    for group, candidates in plan.candidates.items():
        costs = {c: [run_seconds(plan.combos[(group[0], c, group[1], group[2], a)]) for a in plan.attacks[(group, c)]]
                 for c in candidates}
        backdoors = {c: [run_seconds(plan.combos[(group[0], c, group[1], group[2], b)])
                         for b in plan.backdoors[(group, c)]] for c in candidates}
        full += pool * sum(sum(costs[c]) + sum(backdoors[c]) for c in candidates)
        live = [c for c in candidates if costs[c]]
        if not live:
            continue
        mean = {c: float(np.mean(costs[c])) for c in live}
        reference, others = live[0], live[1:]
        if not rule.racing:
            stage = first * sum(sum(costs[c]) for c in live)
            total += stage + first * sum(sum(backdoors[c]) for c in live)
            first_stage += stage
            if group[2] > 0:
                total += VERDICT_SEEDS * min(pool - first, 1) * sum(costs[live[0]])
            continue
        attacks = len(costs[reference])
        kept = max(1.0, SURVIVING * attacks) if group[2] > 0 else 1.0
        raced = kept if rule.compare is None else min(kept, rule.compare)
        stage = first * sum(costs[reference])
        first_stage += stage
        later = first * sum(raced * mean[c] for c in others)
        if len(live) > 1:
            later += RACE_SEEDS * min(pool - first, 1) * sum(raced * mean[c] for c in live)
            later += (1 - 1 / len(live)) * first * (attacks - raced) * float(np.mean(list(mean.values())))
        if group[2] > 0:
            later += VERDICT_SEEDS * min(pool - first, 1) * kept * float(np.mean(list(mean.values())))
            later += first * float(np.mean([sum(backdoors[c]) for c in live]))
        total += stage + later
    return Estimate(total, first_stage, full)


def measured_text(finals: pd.DataFrame, plan: Plan, full: BenchmarkSpec) -> str:
    """The measured compute, the runs made against the full factorial, and the full
    file's extrapolation (the measured seconds per run times its full factorial's
    runs and round ratio)."""
    seconds_ = finals["cell_seconds"].dropna() if len(finals) else pd.Series(dtype=float)
    if seconds_.empty:
        return "no run finished."
    per_run = float(seconds_.mean())
    made = len(plan.factorial_cells)
    rounds = float(np.mean([c.rounds for c in plan.combos.values()])) if plan.combos else 1.0
    full_rounds = float(np.mean([full.rounds_of(d) for d in full.defenses]))
    runs = _full_runs(full)
    return (f"{made} runs made of the {plan.full_factorial()} of the full factorial "
            f"({100 * made / max(plan.full_factorial(), 1):.0f}%); {readable_duration(float(seconds_.sum()))} of "
            f"compute, {per_run:.2f} s per run on one worker (mean rounds {rounds:.0f}); the full file's factorial "
            f"has at most {runs} runs at a mean of {full_rounds:.0f} rounds, about "
            f"{readable_duration(runs * per_run * full_rounds / rounds)} of compute at this run's cost per round.")


def _full_runs(spec: BenchmarkSpec) -> int:
    """An upper bound on the runs of the file's full factorial (not-applicable
    combinations are only known after validating each)."""
    from robust_pfl.worst_case.checks import checked_size
    from robust_pfl.worst_case.plan import attack_set

    return checked_size(spec, attack_set(spec)) * len(spec.seeds)

