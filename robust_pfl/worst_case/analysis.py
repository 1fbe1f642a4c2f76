"""A benchmark's verdicts and tables, from its finished runs and their allocation
(:mod:`robust_pfl.worst_case.allocation`).

Per table cell (defense, heterogeneity level, Byzantine fraction ``f > 0``), at its
chosen candidate and with the seeds its allocation gave it:

* **Worst case**: each attack's mean test accuracy over seeds; the worst attack is the
  one of lowest mean, shown with its Student-t interval at the per-look level.
* **Drop**: for each attack, the clean accuracy minus the accuracy under it, *paired by
  seed* with the defense's clean run (its chosen candidate at ``f = 0``), and the
  interval of its mean.
* **Decision** (:func:`decide`): *breaks* when some attack's drop interval lies above
  the tolerance, *holds* when every attack's lies at or below it, else *inconclusive*
  (one seed gives no interval: inconclusive).  The tolerance is
  ``benchmark.tolerance`` in accuracy units: a number of points, or a share of what
  the defense learned over chance (``share * (clean - chance)``).

Per defense and level (:func:`statuses`), before any verdict:

* **reference**: Local needs no collaboration; its robustness is by construction.
* **not converged**: the clean run's validation accuracy (chosen candidate, mean over
  its seeds) still climbed more than ``plateau`` points over the last quarter of the
  run (:func:`climb`: its last two evaluations against the last two at or before
  ``3T/4``).
* **vacuous**: the clean accuracy is within the tolerance of a reference that needs
  no collaboration: chance (1 / classes) or Local's clean accuracy at that level.

Otherwise the fractions are walked upwards (:func:`breakdown`): the defense *holds up
to* the largest ``f`` such that every fraction ``<= f`` holds; it *breaks at* the
first fraction that breaks or cannot run (not applicable), provided every fraction
below it holds; a first fraction that is inconclusive makes the verdict
*inconclusive at f*.  Best defense per (level, fraction): the highest worst-case mean,
*separated* when its interval lies above the runner-up's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from robust_pfl.worst_case.allocation import CellState, Rule, Runs, clean_key, t_interval
from robust_pfl.worst_case.plan import NO_ATTACK, ComboKey, GroupKey, Plan
from robust_pfl.worst_case.spec import Tolerance

CELL = ["method", "heterogeneity", "fraction"]
UNIT = (0.0, 1.0)
#: A defense's status at a level, before its fractions are walked.
REFERENCE, NOT_CONVERGED, VACUOUS, OPEN, NO_CLEAN = "reference", "not converged", "vacuous", "open", "no clean run"
#: What a walk ends with.
DECIDED, INCONCLUSIVE = "decided", "inconclusive"
#: A cell's decision.
HOLDS, BREAKS, UNDECIDED, NOT_APPLICABLE, PENDING = "holds", "breaks", "inconclusive", "not applicable", "pending"


def interval_text(rule: Rule) -> str:
    """The interval every table shows, in words."""
    return (f"Student-t interval of the mean over seeds at level {rule.level:.4g} (each of the at most "
            f"{rule.looks} looks at {1 - (1 - rule.confidence) / rule.looks:.4g}: the verdicts of a cell hold jointly "
            f"at {rule.confidence:g}; none with one seed)")


@dataclass(frozen=True)
class Judge:
    """What verdicts read besides the runs: the tolerance, chance (1 / classes), the
    plateau (accuracy units), the interval level, the reference defenses (labels of
    Local), each defense's run length and each cell's seed pool."""

    tolerance: Tolerance
    chance: float
    plateau: float
    rule: Rule
    references: frozenset[str]
    rounds: Mapping[str, int]


@dataclass(frozen=True)
class Decision:
    """One cell's decision: ``decision``, the attack that decided it (the worst attack
    when it holds or is inconclusive), the mean drop under it and its interval, the
    tolerance (accuracy units), and the seeds paired."""

    decision: str
    attack: str
    drop: float
    drop_low: float
    drop_high: float
    tolerance: float
    seeds: int


def paired_seeds(runs: Runs, clean: ComboKey, state: CellState, pool: Sequence[int]) -> list[int]:
    """The seeds of ``pool[:state.seeds]`` that the clean run and every attack of the cell
    have."""
    seeds = pool[:state.seeds]
    return [s for s in seeds if runs.has(clean, s) and all(runs.has(state.key(a), s) for a in state.attacks)]


def clean_seeds(runs: Runs, clean: ComboKey, state: CellState, rule: Rule) -> list[int]:
    """The seeds of a clean run its allocation reached (``state.seeds`` of the pool) that
    finished."""
    return [s for s in rule.seeds[:max(state.seeds, 1)] if runs.has(clean, s)]


def decide(runs: Runs, clean: ComboKey, state: CellState, judge: Judge, clean_state: CellState | None = None
           ) -> Decision:
    """The decision of one attacked cell (module docstring); the tolerance follows the
    clean accuracy over the seeds ``clean_state`` reached (default: the cell's)."""
    seeds = paired_seeds(runs, clean, state, judge.rule.seeds)
    clean_values = np.asarray(runs.values(clean, seeds, "test"))
    reached = clean_seeds(runs, clean, clean_state or state, judge.rule)
    tolerance = judge.tolerance.of(float(np.mean(runs.values(clean, reached, "test"))), judge.chance)
    if not state.attacks or not seeds:
        return Decision(PENDING if state.attacks else NOT_APPLICABLE, "", math.nan, math.nan, math.nan, tolerance, 0)
    drops = {a: t_interval(clean_values - np.asarray(runs.values(state.key(a), seeds, "test")), judge.rule.level)
             for a in state.attacks}
    worst = max(state.attacks, key=lambda a: (drops[a][0], -state.attacks.index(a)))
    breaking = [a for a in state.attacks if math.isfinite(drops[a][1]) and drops[a][1] > tolerance]
    if breaking:
        attack = max(breaking, key=lambda a: (drops[a][1], -state.attacks.index(a)))
        return Decision(BREAKS, attack, *drops[attack], tolerance, len(seeds))
    holds = all(math.isfinite(drops[a][2]) and drops[a][2] <= tolerance for a in state.attacks)
    return Decision(HOLDS if holds else UNDECIDED, worst, *drops[worst], tolerance, len(seeds))


def climb(runs: Runs, clean: ComboKey, seeds: Sequence[int], rounds: int) -> float:
    """How much the clean run's validation accuracy still rose over the last quarter
    of the run: the mean of its last two evaluations minus the mean of the last two at
    or before ``3 * rounds / 4`` (two a side, so that one noisy evaluation decides
    nothing), averaged over ``seeds`` (nan without curves)."""
    rises = []
    for seed in seeds:
        curve = runs.curves.get((clean, seed))
        if not curve:
            continue
        before = [value for round_, value in curve if round_ <= 0.75 * rounds] or [curve[0][1]]
        end = [value for round_, value in curve if round_ > 0.75 * rounds] or [curve[-1][1]]
        rises.append(float(np.mean(end[-2:]) - np.mean(before[-2:])))
    return float(np.mean(rises)) if rises else math.nan


@dataclass(frozen=True)
class Status:
    """A defense's status at a level: ``status`` (module docstring), its clean mean
    test accuracy, the tolerance there, the clean run's climb over its last quarter,
    the reference it was compared with, and the clean seeds read."""

    status: str
    clean: float
    tolerance: float
    climb: float
    reference: float
    seeds: int


def statuses(runs: Runs, states: Mapping[GroupKey, CellState], judge: Judge) -> dict[tuple[str, str], Status]:
    """Every defense's status at every level (module docstring)."""
    means: dict[tuple[str, str], tuple[float, int]] = {}
    for (method, level, fraction), state in states.items():
        key = clean_key(states, method, level)
        if fraction == 0 and key is not None:
            seeds = clean_seeds(runs, key, state, judge.rule)
            means[(method, level)] = (float(np.mean(runs.values(key, seeds, "test"))), len(seeds))
    out = {}
    for (method, level, fraction) in states:
        if fraction != 0:
            continue
        key = clean_key(states, method, level)
        if key is None:
            out[(method, level)] = Status(NO_CLEAN, math.nan, math.nan, math.nan, math.nan, 0)
            continue
        clean, count = means[(method, level)]
        tolerance = judge.tolerance.of(clean, judge.chance)
        rise = climb(runs, key, clean_seeds(runs, key, states[(method, level, 0.0)], judge.rule), judge.rounds[method])
        locals_ = [means[(ref, level)][0] for ref in judge.references if (ref, level) in means]
        reference = max([judge.chance, *locals_])
        if method in judge.references:
            status = REFERENCE
        elif math.isfinite(rise) and rise > judge.plateau:
            status = NOT_CONVERGED
        elif clean - reference <= tolerance:
            status = VACUOUS
        else:
            status = OPEN
        out[(method, level)] = Status(status, clean, tolerance, rise, reference, count)
    return out


def decisions(runs: Runs, states: Mapping[GroupKey, CellState], judge: Judge) -> dict[GroupKey, Decision]:
    """Every attacked cell's decision, where its clean run is chosen."""
    out = {}
    for group, state in states.items():
        method, level, fraction = group
        key = clean_key(states, method, level)
        if fraction == 0 or key is None:
            continue
        if not state.tuning.done:
            applicable = bool(state.tuning.missing) or state.tuning.chosen is not None
            out[group] = Decision(PENDING if applicable else NOT_APPLICABLE, "", math.nan, math.nan, math.nan,
                                  math.nan, 0)
            continue
        out[group] = decide(runs, key, state, judge, states[(method, level, 0.0)])
    return out


def walk(fractions: Sequence[float], cells: Mapping[float, Decision]) -> tuple[str, float, float, float, str]:
    """``(ending, holds_up_to, breaks_at, inconclusive_at, why)`` of one defense at one
    level from its cells' decisions, fractions ascending (module docstring)."""
    holds = 0.0
    for fraction in sorted(f for f in fractions if f > 0):
        decision = cells.get(fraction)
        if decision is None or decision.decision == NOT_APPLICABLE:
            return DECIDED, holds, fraction, math.nan, "not applicable"
        if decision.decision == HOLDS:
            holds = fraction
            continue
        if decision.decision == BREAKS:
            return (DECIDED, holds, fraction, math.nan,
                    f"drop under {decision.attack} {100 * decision.drop:.1f} points "
                    f"[{100 * decision.drop_low:.1f}, {100 * decision.drop_high:.1f}] above the tolerance "
                    f"{100 * decision.tolerance:.1f}")
        why = ("runs missing" if decision.decision == PENDING else
               f"drop under {decision.attack} {100 * decision.drop:.1f} points, interval "
               f"[{_points(decision.drop_low)}, {_points(decision.drop_high)}] across the tolerance "
               f"{100 * decision.tolerance:.1f} ({decision.seeds} seeds)")
        return INCONCLUSIVE, holds, math.nan, fraction, why
    return DECIDED, holds, math.nan, math.nan, ""


def _points(value: float) -> str:
    return "none" if not math.isfinite(value) else f"{100 * value:.1f}"


def wants_seed(runs: Runs, states: Mapping[GroupKey, CellState], judge: Judge) -> dict[GroupKey, bool]:
    """Rule 4 of :mod:`robust_pfl.worst_case.allocation`: the first inconclusive cell of
    each open defense and level, walking the fractions upwards."""
    status = statuses(runs, states, judge)
    cells = decisions(runs, states, judge)
    out: dict[GroupKey, bool] = {}
    by_defense: dict[tuple[str, str], dict[float, Decision]] = {}
    for (method, level, fraction), decision in cells.items():
        by_defense.setdefault((method, level), {})[fraction] = decision
    for (method, level), mine in by_defense.items():
        if status.get((method, level), Status(NO_CLEAN, *[math.nan] * 4, 0)).status != OPEN:
            continue
        ending, _, _, first_open, _ = walk(list(mine), mine)
        if ending == INCONCLUSIVE and mine[first_open].decision == UNDECIDED:
            out[(method, level, first_open)] = True
    return out


# -- tables -------------------------------------------------------------------------------------
def worst_case_table(runs: Runs, plan: Plan, states: Mapping[GroupKey, CellState], judge: Judge) -> pd.DataFrame:
    """One row per table cell with a chosen candidate (fraction 0: the clean run):
    ``worst`` (worst-case mean test accuracy), ``low``/``high`` (its interval),
    ``worst_attack``, ``attacks`` (in the final set) and ``attacks_dropped``, ``seeds``,
    ``drop``/``drop_low``/``drop_high`` and ``decision`` with the ``tolerance``,
    ``worst_cluster``, ``clean``, the defense's ``status`` there, ``candidate``,
    ``candidates`` and ``candidates_dropped``."""
    status = statuses(runs, states, judge)
    cells = decisions(runs, states, judge)
    pool = judge.rule.seeds
    rows = []
    for group, state in states.items():
        method, level, fraction = group
        if state.chosen is None or not state.tuning.done:
            continue
        seeds = pool[:state.seeds]
        per_attack = []
        for attack in state.attacks:
            values = runs.values(state.key(attack), seeds, "test")
            mean, low, high = t_interval(values, judge.rule.level, UNIT)
            cluster = float(np.mean(runs.values(state.key(attack), seeds, "worst_cluster")))
            per_attack.append((mean, attack, low, high, cluster))
        mean, attack, low, high, _ = min(per_attack, key=lambda item: (item[0], state.attacks.index(item[1])))
        decision = cells.get(group)
        mine = status.get((method, level))
        rows.append({
            "method": method, "heterogeneity": level, "fraction": fraction, "worst": mean, "low": low, "high": high,
            "worst_attack": attack if fraction > 0 else NO_ATTACK, "attacks": len(state.attacks),
            "attacks_dropped": len(state.tuning.dropped_attacks.get(state.chosen, {})) + len(state.dropped_later),
            "seeds": len(seeds),
            "drop": decision.drop if decision else math.nan, "drop_low": decision.drop_low if decision else math.nan,
            "drop_high": decision.drop_high if decision else math.nan,
            "decision": decision.decision if decision else "",
            "decided_by": decision.attack if decision else "",
            "tolerance": mine.tolerance if mine else math.nan,
            "worst_cluster": min(item[4] for item in per_attack),
            "clean": mine.clean if mine else math.nan, "status": mine.status if mine else NO_CLEAN,
            "candidate": state.chosen, "candidates": len(plan.candidates[group]),
            "candidates_dropped": len(state.tuning.dropped_candidates),
        })
    return pd.DataFrame(rows, columns=WORST_CASE_COLUMNS)


WORST_CASE_COLUMNS = ["method", "heterogeneity", "fraction", "worst", "low", "high", "worst_attack", "attacks",
                      "attacks_dropped", "seeds", "drop", "drop_low", "drop_high", "decision", "decided_by",
                      "tolerance", "worst_cluster", "clean", "status", "candidate", "candidates",
                      "candidates_dropped"]
BREAKDOWN_COLUMNS = ["method", "heterogeneity", "status", "verdict", "holds_up_to", "breaks_at", "inconclusive_at",
                     "why", "clean", "tolerance", "climb", "reference", "vacuous", "converged", "decided"]


def breakdown(runs: Runs, states: Mapping[GroupKey, CellState], judge: Judge,
              fractions: Iterable[float]) -> pd.DataFrame:
    """Per (defense, level): its status, the verdict in words, ``holds_up_to``,
    ``breaks_at``, ``inconclusive_at`` (nan where none), ``why``, the clean accuracy,
    tolerance, climb and reference, the flags ``vacuous`` and ``converged``, and
    ``decided`` (a verdict both ways: holds up to / breaks at, every fraction below
    the end decided)."""
    status = statuses(runs, states, judge)
    cells = decisions(runs, states, judge)
    fractions = sorted(fractions)
    rows = []
    for (method, level), mine in status.items():
        own = {f: d for (m, l, f), d in cells.items() if (m, l) == (method, level)}
        base = {"method": method, "heterogeneity": level, "status": mine.status, "clean": mine.clean,
                "tolerance": mine.tolerance, "climb": mine.climb, "reference": mine.reference,
                "vacuous": mine.status == VACUOUS, "converged": mine.status != NOT_CONVERGED
                and math.isfinite(mine.climb)}
        if mine.status != OPEN:
            text = {REFERENCE: "no verdict: needs no collaboration (the reference)",
                    NOT_CONVERGED: f"no verdict: clean run still climbing ({100 * mine.climb:.1f} points over the "
                                   "last quarter)",
                    VACUOUS: f"no verdict: clean accuracy within the tolerance ({100 * mine.tolerance:.1f} points) "
                             f"of chance or Local ({100 * mine.reference:.1f}%)",
                    NO_CLEAN: "no verdict: no clean run"}[mine.status]
            rows.append({**base, "verdict": text, "holds_up_to": math.nan, "breaks_at": math.nan,
                         "inconclusive_at": math.nan, "why": "", "decided": False})
            continue
        ending, holds, breaks, undecided, why = walk(fractions, own)
        if ending == INCONCLUSIVE:
            text = f"inconclusive at f = {undecided:g}" + (f" (holds up to {holds:g})" if holds > 0 else "")
        elif math.isfinite(breaks):
            text = f"breaks at f = {breaks:g}" + (f" (holds up to {holds:g})" if holds > 0 else "")
        else:
            text = f"holds up to f = {holds:g}"
        rows.append({**base, "status": ending, "verdict": text, "holds_up_to": holds, "breaks_at": breaks,
                     "inconclusive_at": undecided, "why": why, "decided": ending == DECIDED})
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)


def best_defense(table: pd.DataFrame) -> pd.DataFrame:
    """Per (level, fraction): the defense of the highest worst-case mean (ties: the one
    listed first), its interval, the runner-up, whether the best's interval lies above
    the runner-up's (``separated``), and the best's status and decision."""
    out = []
    for (level, fraction), group in table.groupby(["heterogeneity", "fraction"], sort=False):
        ranked = group[group["worst"].notna()].sort_values("worst", ascending=False, kind="stable")
        if ranked.empty:
            out.append({"heterogeneity": level, "fraction": fraction, "best": None, "worst": math.nan,
                        "low": math.nan, "high": math.nan, "runner_up": None, "separated": False, "status": "",
                        "decision": ""})
            continue
        best = ranked.iloc[0]
        second = ranked.iloc[1] if len(ranked) > 1 else None
        separated = second is None or (math.isfinite(best["low"]) and math.isfinite(second["high"])
                                       and best["low"] > second["high"])
        out.append({"heterogeneity": level, "fraction": fraction, "best": best["method"], "worst": best["worst"],
                    "low": best["low"], "high": best["high"],
                    "runner_up": None if second is None else second["method"], "separated": bool(separated),
                    "status": best["status"], "decision": best["decision"]})
    return pd.DataFrame(out, columns=["heterogeneity", "fraction", "best", "worst", "low", "high", "runner_up",
                                      "separated", "status", "decision"])


def tuning_table(plan: Plan, states: Mapping[GroupKey, CellState]) -> pd.DataFrame:
    """Per table cell: the chosen candidate, the seeds it was chosen with, its mean
    worst-case validation accuracy, the candidates compared and dropped."""
    rows = []
    for group, state in states.items():
        tuning = state.tuning
        rows.append({"method": group[0], "heterogeneity": group[1], "fraction": group[2],
                     "candidate": tuning.chosen, "reference": (plan.candidates[group] or [None])[0],
                     "tuned_with_seeds": tuning.tuned_at,
                     "validation_worst": tuning.scores.get(tuning.chosen, math.nan) if tuning.chosen else math.nan,
                     "candidates": len(plan.candidates[group]), "candidates_dropped": len(tuning.dropped_candidates),
                     "dropped": "; ".join(f"{c}: {why}" for c, why in tuning.dropped_candidates.items())})
    return pd.DataFrame(rows, columns=["method", "heterogeneity", "fraction", "candidate", "reference",
                                       "tuned_with_seeds", "validation_worst", "candidates", "candidates_dropped",
                                       "dropped"])


def backdoor_worst_case(runs: Runs, plan: Plan, states: Mapping[GroupKey, CellState], rule: Rule) -> pd.DataFrame:
    """Per attacked cell at its chosen candidate: ``success`` (the highest mean attack
    success rate over the backdoors, with the tuning's seeds), its interval,
    ``backdoor`` (which), ``accuracy`` (mean test accuracy under it)."""
    out = []
    for group, state in states.items():
        if group[2] == 0 or not state.tuning.done:
            continue
        seeds = rule.seeds[:state.tuning.tuned_at]
        best = None
        for backdoor in plan.backdoors[(group, state.chosen)]:
            key = state.key(backdoor)
            if not all(runs.has(key, s) for s in seeds):
                continue
            mean, low, high = t_interval(runs.values(key, seeds, "success"), rule.level, UNIT)
            if best is None or mean > best[0]:
                best = (mean, low, high, backdoor, float(np.mean(runs.values(key, seeds, "test"))))
        if best is not None:
            out.append({"method": group[0], "heterogeneity": group[1], "fraction": group[2], "success": best[0],
                        "success_low": best[1], "success_high": best[2], "backdoor": best[3], "accuracy": best[4]})
    return pd.DataFrame(out, columns=["method", "heterogeneity", "fraction", "success", "success_low",
                                      "success_high", "backdoor", "accuracy"])
