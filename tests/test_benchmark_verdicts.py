"""Benchmark verdicts and allocation on hand-made runs (issue 53): decisions by paired
intervals against the tolerance, inconclusive where the interval straddles it, no
verdict for a clean run still climbing, for a vacuous defense or for the reference;
attacks and candidates raced on validation only; seeds added where a verdict is open."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from robust_pfl.worst_case import analysis
from robust_pfl.worst_case.allocation import (
    CellState, Final, Rule, Runs, Tuning, allocate, clearly_above, t_interval, tune)
from robust_pfl.worst_case.analysis import Judge
from robust_pfl.worst_case.plan import Plan
from robust_pfl.worst_case.spec import Tolerance

LEVEL = "H"
SEEDS = (0, 1, 2, 3, 4)


def final(validation: float, test: float | None = None, loss: float = 1.0) -> Final:
    return Final(validation, loss, validation if test is None else test, validation if test is None else test, 0.0)


def key(method: str, candidate: str, fraction: float, attack: str) -> tuple:
    return (method, candidate, LEVEL, fraction, attack)


def runs_of(table: dict[tuple, list[tuple[float, float]]], curves: dict | None = None) -> Runs:
    """``{combination: [(validation, test) per seed]}`` as finished runs."""
    return Runs({(k, SEEDS[i]): final(v, t) for k, values in table.items() for i, (v, t) in enumerate(values)},
                curves or {})


def plan_of(groups: dict[tuple[str, float], dict[str, list[str]]], backdoors: dict | None = None) -> Plan:
    """A plan of the hand-made cells ``{(method, fraction): {candidate: [attacks]}}``."""
    plan = Plan(SimpleNamespace(seeds=list(SEEDS)))
    for (method, fraction), candidates in groups.items():
        group = (method, LEVEL, fraction)
        plan.candidates[group] = list(candidates)
        for candidate, attacks in candidates.items():
            plan.attacks[(group, candidate)] = list(attacks)
            plan.backdoors[(group, candidate)] = list((backdoors or {}).get((method, fraction), []))
    return plan


def judge(share: float = 0.2, plateau: float = 0.02, references: frozenset = frozenset(), rule: Rule | None = None,
          rounds: int = 100) -> Judge:
    return Judge(Tolerance(share=share), 0.1, plateau, rule or Rule(SEEDS, 2), references,
                 {"D": rounds, "E": rounds, "Local": rounds})


def state(method: str, fraction: float, attacks: list[str], seeds: int, candidate: str = "x") -> CellState:
    return CellState(Tuning((method, LEVEL, fraction), candidate, seeds, attacks), attacks, seeds)


# -- intervals ---------------------------------------------------------------------------------------
def test_the_interval_of_a_sample_with_a_known_answer():
    """[1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.302652729911275 (tables)."""
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0)
    assert high - mean == pytest.approx(4.302652729911275 / math.sqrt(3), rel=1e-9)
    assert t_interval([0.0, 1.0], bounds=(0.0, 1.0))[1:] == (0.0, 1.0)
    assert all(math.isnan(v) for v in t_interval([0.7])[1:])
    assert all(math.isnan(v) for v in t_interval([0.5, math.inf]))


def test_each_look_is_taken_at_the_bonferroni_level():
    rule = Rule(SEEDS, 2, confidence=0.95)
    assert rule.looks == 4 and rule.level == pytest.approx(1 - 0.05 / 4)
    assert Rule(SEEDS, 5).looks == 1 and Rule(SEEDS, 5).level == pytest.approx(0.95)


def test_clearly_above_is_a_paired_interval():
    """Differences 10, 12, 11 (mean 11, s = 1): the 95% interval is 11 +- 4.303 / sqrt 3."""
    assert clearly_above([0.5, 0.62, 0.41], [0.4, 0.5, 0.3], 0.95)
    assert not clearly_above([0.5, 0.30, 0.41], [0.4, 0.5, 0.3], 0.95)  # differences 0.1, -0.2, 0.11
    assert not clearly_above([0.9], [0.1], 0.95)  # one pair: no interval


# -- decisions ------------------------------------------------------------------------------------------
CLEAN = [(0.9, 0.9)] * 4


def decision_of(drops: list[float], seeds: int = 4, share: float = 0.2) -> analysis.Decision:
    runs = runs_of({key("D", "x", 0.0, "none"): CLEAN,
                    key("D", "x", 0.2, "a"): [(0.9 - d, 0.9 - d) for d in drops]})
    return analysis.decide(runs, key("D", "x", 0.0, "none"), state("D", 0.2, ["a"], seeds), judge(share))


def test_a_drop_whose_interval_lies_above_the_tolerance_breaks():
    # tolerance 0.2 * (0.9 - 0.1) = 0.16; drops 0.50 +- small
    found = decision_of([0.50, 0.52, 0.49, 0.51])
    assert found.decision == analysis.BREAKS and found.tolerance == pytest.approx(0.16)
    assert found.drop == pytest.approx(0.505) and found.drop_low > 0.16


def test_a_drop_whose_interval_lies_below_the_tolerance_holds():
    found = decision_of([0.01, 0.02, 0.0, 0.03])
    assert found.decision == analysis.HOLDS and found.drop_high <= 0.16


def test_a_cell_whose_interval_straddles_the_tolerance_is_inconclusive():
    found = decision_of([0.05, 0.25, 0.15, 0.20])  # mean 0.1625, interval wide across 0.16
    assert found.decision == analysis.UNDECIDED
    assert found.drop_low < found.tolerance < found.drop_high
    # the same mean drop without the spread is decided: the interval, not the mean, decides
    assert decision_of([0.1625] * 4).decision == analysis.BREAKS
    assert decision_of([0.155, 0.156, 0.154, 0.155]).decision == analysis.HOLDS


def test_one_seed_decides_nothing():
    assert decision_of([0.8], seeds=1).decision == analysis.UNDECIDED


def test_an_absolute_tolerance_is_in_points():
    runs = runs_of({key("D", "x", 0.0, "none"): CLEAN, key("D", "x", 0.2, "a"): [(0.8, 0.8)] * 2 + [(0.79, 0.79)]
                    + [(0.81, 0.81)]})
    points = Judge(Tolerance(points=5.0), 0.1, 0.02, Rule(SEEDS, 2), frozenset(), {"D": 100})
    found = analysis.decide(runs, key("D", "x", 0.0, "none"), state("D", 0.2, ["a"], 4), points)
    assert found.tolerance == pytest.approx(0.05) and found.decision == analysis.BREAKS


def test_any_attack_whose_drop_is_clearly_above_breaks_and_every_attack_must_hold():
    runs = runs_of({key("D", "x", 0.0, "none"): CLEAN,
                    key("D", "x", 0.2, "weak"): [(0.9, 0.9)] * 4,
                    key("D", "x", 0.2, "strong"): [(0.3, 0.30), (0.3, 0.31), (0.3, 0.29), (0.3, 0.30)]})
    found = analysis.decide(runs, key("D", "x", 0.0, "none"), state("D", 0.2, ["weak", "strong"], 4), judge())
    assert found.decision == analysis.BREAKS and found.attack == "strong"


# -- statuses: reference, not converged, vacuous ---------------------------------------------------------
def states_of(runs: Runs, methods: list[str], fractions: list[float], seeds: int = 4) -> dict:
    out = {}
    for method in methods:
        for fraction in fractions:
            attacks = ["none"] if fraction == 0 else ["a"]
            out[(method, LEVEL, fraction)] = state(method, fraction, attacks, seeds)
    return out


def test_a_clean_run_still_climbing_gets_no_verdict():
    curve = {(key("D", "x", 0.0, "none"), s): [(0, 0.1), (50, 0.5), (70, 0.6), (90, 0.8), (100, 0.9)]
             for s in SEEDS[:4]}
    flat = {(key("E", "x", 0.0, "none"), s): [(0, 0.1), (50, 0.88), (70, 0.9), (90, 0.89), (100, 0.9)]
            for s in SEEDS[:4]}
    table = {key(m, "x", 0.0, "none"): CLEAN for m in "DE"}
    table.update({key(m, "x", 0.2, "a"): [(0.3, 0.3)] * 4 for m in "DE"})
    runs = runs_of(table, {**curve, **flat})
    states = states_of(runs, ["D", "E"], [0.0, 0.2])
    found = analysis.statuses(runs, states, judge())
    assert found[("D", LEVEL)].status == analysis.NOT_CONVERGED
    # the last two evaluations (0.8, 0.9) against the last two at or before round 75 (0.5, 0.6)
    assert found[("D", LEVEL)].climb == pytest.approx(0.3)
    assert found[("E", LEVEL)].status == analysis.OPEN
    rows = analysis.breakdown(runs, states, judge(), [0.0, 0.2]).set_index("method")
    assert rows.loc["D", "verdict"].startswith("no verdict: clean run still climbing")
    assert not rows.loc["D", "decided"] and not rows.loc["D", "converged"]
    assert rows.loc["E", "verdict"] == "breaks at f = 0.2" and rows.loc["E", "decided"]
    assert analysis.wants_seed(runs, states, judge()) == {}  # no seed is spent on it either


def test_a_defense_within_the_tolerance_of_local_or_chance_is_vacuous_and_local_is_the_reference():
    table = {key("D", "x", 0.0, "none"): [(0.5, 0.5)] * 4, key("Local", "x", 0.0, "none"): [(0.45, 0.45)] * 4,
             key("E", "x", 0.0, "none"): [(0.15, 0.15)] * 4}
    table.update({key(m, "x", 0.2, "a"): [(0.1, 0.1)] * 4 for m in ("D", "Local", "E")})
    runs = runs_of(table)
    states = states_of(runs, ["D", "Local", "E"], [0.0, 0.2])
    found = analysis.statuses(runs, states, judge(references=frozenset({"Local"})))
    # D: tolerance 0.2 * (0.5 - 0.1) = 0.08 > 0.5 - 0.45; E: within 0.01 of chance; Local: the reference
    assert found[("D", LEVEL)].status == analysis.VACUOUS and found[("D", LEVEL)].reference == pytest.approx(0.45)
    assert found[("E", LEVEL)].status == analysis.VACUOUS
    assert found[("Local", LEVEL)].status == analysis.REFERENCE
    without = analysis.statuses(runs, states, judge())  # no Local among the defenses: chance alone
    assert without[("D", LEVEL)].status == analysis.OPEN


def test_the_walk_holds_breaks_and_stops_at_the_first_open_fraction():
    def cell(decision: str) -> analysis.Decision:
        return analysis.Decision(decision, "a", 0.1, 0.0, 0.2, 0.1, 3)

    H, B, U = (cell(d) for d in (analysis.HOLDS, analysis.BREAKS, analysis.UNDECIDED))
    ending, holds, breaks, open_, _ = analysis.walk([0, 0.1, 0.2, 0.3], {0.1: H, 0.2: H, 0.3: H})
    assert (ending, holds) == ("decided", 0.3) and math.isnan(breaks) and math.isnan(open_)
    ending, holds, breaks, open_, _ = analysis.walk([0, 0.1, 0.2, 0.3], {0.1: H, 0.2: B, 0.3: U})
    assert (ending, holds, breaks) == ("decided", 0.1, 0.2)
    ending, holds, breaks, open_, _ = analysis.walk([0, 0.1, 0.2, 0.3], {0.1: H, 0.2: U, 0.3: B})
    assert (ending, holds, open_) == ("inconclusive", 0.1, 0.2) and math.isnan(breaks)
    ending, holds, breaks, _, why = analysis.walk([0, 0.1, 0.2], {0.1: H})
    assert (ending, breaks, why) == ("decided", 0.2, "not applicable")


# -- allocation -------------------------------------------------------------------------------------
def test_the_reference_races_the_attacks_and_the_others_run_the_survivors_only():
    """At the reference (listed first), attack "b" is clearly less damaging than "a"
    on validation (paired over 2 seeds) and is dropped; candidate "y" then runs "a"
    alone."""
    plan = plan_of({("D", 0.2): {"x": ["a", "b"], "y": ["a", "b"]}})
    rule = Rule(SEEDS, 2)
    runs = runs_of({key("D", "x", 0.2, "a"): [(0.30, 0.9), (0.32, 0.9)],
                    key("D", "x", 0.2, "b"): [(0.80, 0.1), (0.81, 0.1)]})
    tuning = tune(runs, plan, ("D", LEVEL, 0.2), rule)
    assert tuning.dropped_attacks["x"] == {"b": "validation accuracy clearly above a's (2 seeds)"}
    assert sorted(tuning.missing) == [(key("D", "y", 0.2, "a"), 0), (key("D", "y", 0.2, "a"), 1)]


def test_racing_reads_only_validation():
    """The same validation accuracies with the test accuracies reversed: the same
    attacks dropped, the same candidate chosen."""
    plan = plan_of({("D", 0.2): {"x": ["a", "b"], "y": ["a", "b"]}})
    rule = Rule(SEEDS, 2)
    table = {key("D", "x", 0.2, "a"): [(0.30, 0.9), (0.32, 0.8)], key("D", "x", 0.2, "b"): [(0.80, 0.1), (0.81, 0.2)],
             key("D", "y", 0.2, "a"): [(0.60, 0.1), (0.61, 0.2)], key("D", "y", 0.2, "b"): [(0.9, 0.1), (0.9, 0.1)]}
    first = tune(runs_of(table), plan, ("D", LEVEL, 0.2), rule)
    reversed_ = {k: [(v, 1 - t) for v, t in values] for k, values in table.items()}
    second = tune(runs_of(reversed_), plan, ("D", LEVEL, 0.2), rule)
    assert first.chosen == second.chosen == "y" and first.dropped_candidates == second.dropped_candidates
    assert first.attacks == second.attacks
    # and validation does decide: swap y's validation accuracy below x's
    lower = {**table, key("D", "y", 0.2, "a"): [(0.00, 0.1), (0.01, 0.2)]}
    assert tune(runs_of(lower), plan, ("D", LEVEL, 0.2), rule).chosen == "x"


def test_a_chosen_candidate_other_than_the_reference_faces_the_dropped_attacks():
    plan = plan_of({("D", 0.2): {"x": ["a", "b"], "y": ["a", "b"]}})
    rule = Rule(SEEDS, 2)
    table = {key("D", "x", 0.2, "a"): [(0.30, 0.9), (0.32, 0.9)], key("D", "x", 0.2, "b"): [(0.80, 0.1), (0.81, 0.1)],
             key("D", "y", 0.2, "a"): [(0.60, 0.6), (0.61, 0.6)]}
    tuning = tune(runs_of(table), plan, ("D", LEVEL, 0.2), rule)
    assert tuning.chosen == "y" and sorted(tuning.missing) == [(key("D", "y", 0.2, "b"), 0),
                                                                (key("D", "y", 0.2, "b"), 1)]
    # "b" is y's worst attack: it joins y's set
    table[key("D", "y", 0.2, "b")] = [(0.40, 0.4), (0.41, 0.4)]
    tuning = tune(runs_of(table), plan, ("D", LEVEL, 0.2), rule)
    assert tuning.done and tuning.attacks == ["a", "b"]


def test_without_racing_every_candidate_runs_every_attack_and_the_best_worst_case_is_chosen():
    plan = plan_of({("D", 0.2): {"x": ["a", "b"], "y": ["a", "b"]}})
    rule = Rule(SEEDS[:2], 2, racing=False)
    table = {key("D", "x", 0.2, "a"): [(0.30, 0.9)] * 2, key("D", "x", 0.2, "b"): [(0.80, 0.1)] * 2,
             key("D", "y", 0.2, "a"): [(0.90, 0.1)] * 2, key("D", "y", 0.2, "b"): [(0.35, 0.9)] * 2}
    tuning = tune(runs_of(table), plan, ("D", LEVEL, 0.2), rule)
    assert tuning.chosen == "y" and tuning.attacks == ["a", "b"] and not tuning.dropped_attacks["x"]


def test_an_open_verdict_gets_the_next_seed_for_its_attacks_and_its_clean_run():
    plan = plan_of({("D", 0.0): {"x": ["none"]}, ("D", 0.2): {"x": ["a"]}})
    rule = Rule(SEEDS, 2)
    table = {key("D", "x", 0.0, "none"): [(0.9, 0.9)] * 2, key("D", "x", 0.2, "a"): [(0.75, 0.70), (0.75, 0.80)]}
    runs = runs_of(table)
    j = judge(rule=rule)
    allocation = allocate(runs, plan, rule, lambda states, done: analysis.wants_seed(done, states, j))
    assert sorted(allocation.requests) == [(key("D", "x", 0.0, "none"), 2), (key("D", "x", 0.2, "a"), 2)]
    decided = {**table, key("D", "x", 0.2, "a"): [(0.3, 0.30), (0.3, 0.31)]}
    allocation = allocate(runs_of(decided), plan, rule,
                          lambda states, done: analysis.wants_seed(done, states, j))
    assert allocation.requests == []  # broken beyond doubt at two seeds: nothing more


def test_an_open_verdict_stops_at_the_end_of_the_pool():
    plan = plan_of({("D", 0.0): {"x": ["none"]}, ("D", 0.2): {"x": ["a"]}})
    rule = Rule(SEEDS[:3], 2)
    table = {key("D", "x", 0.0, "none"): [(0.9, 0.9)] * 3,
             key("D", "x", 0.2, "a"): [(0.75, 0.70), (0.75, 0.80), (0.75, 0.60)]}
    j = judge(rule=rule)
    allocation = allocate(runs_of(table), plan, rule, lambda states, done: analysis.wants_seed(done, states, j))
    assert allocation.requests == []
    rows = analysis.breakdown(runs_of(table), allocation.cells, j, [0.0, 0.2])
    assert rows["verdict"].tolist() == ["inconclusive at f = 0.2"]


def test_the_best_defense_is_separated_only_when_its_interval_clears_the_runner_up():
    import pandas as pd

    table = pd.DataFrame([
        {"method": "D", "heterogeneity": LEVEL, "fraction": 0.2, "worst": 0.8, "low": 0.75, "high": 0.85,
         "status": "open", "decision": "holds"},
        {"method": "E", "heterogeneity": LEVEL, "fraction": 0.2, "worst": 0.7, "low": 0.6, "high": 0.78,
         "status": "vacuous", "decision": "holds"},
    ])
    best = analysis.best_defense(table).iloc[0]
    assert best["best"] == "D" and best["runner_up"] == "E" and not best["separated"]
    best = analysis.best_defense(table.assign(high=[0.85, 0.74])).iloc[0]
    assert best["separated"]


def test_t_interval_matches_scipy_at_the_per_look_level():
    values = np.array([0.1, 0.4, 0.35, 0.2])
    level = Rule(SEEDS, 2).level
    mean, low, high = t_interval(values, level)
    half = stats.t.ppf(0.5 + level / 2, 3) * values.std(ddof=1) / 2
    assert (low, high) == pytest.approx((mean - half, mean + half))


def test_candidates_race_on_the_references_worst_survivors_then_the_chosen_faces_the_rest():
    """Five attacks survive at the reference x (none clearly less damaging than the
    worst); y runs only the three of lowest mean validation accuracy at x (c, d, e);
    chosen, y then screens a and b."""
    attacks = ["a", "b", "c", "d", "e"]
    plan = plan_of({("D", 0.2): {"x": attacks, "y": attacks}})
    rule = Rule(SEEDS, 2)
    # means 0.40, 0.35, 0.30, 0.25, 0.20; the differences to e vary too much across the two
    # seeds for any to be clearly less damaging
    seeds = {"a": (0.60, 0.20), "b": (0.15, 0.55), "c": (0.45, 0.15), "d": (0.20, 0.30), "e": (0.30, 0.10)}
    table = {key("D", "x", 0.2, a): [(v, v) for v in values] for a, values in seeds.items()}
    tuning = tune(runs_of(table), plan, ("D", LEVEL, 0.2), rule)
    assert not tuning.dropped_attacks["x"]
    assert sorted({request[0][4] for request in tuning.missing}) == ["c", "d", "e"]
    assert {request[0][1] for request in tuning.missing} == {"y"}
    table.update({key("D", "y", 0.2, a): [(0.9, 0.9), (0.8, 0.8)] for a in "cde"})  # 0.7 above x on both seeds
    tuning = tune(runs_of(table), plan, ("D", LEVEL, 0.2), rule)
    assert tuning.chosen == "y" and sorted({request[0][4] for request in tuning.missing}) == ["a", "b"]
    everything = tune(runs_of(table), plan, ("D", LEVEL, 0.2), Rule(SEEDS, 2, compare=None))
    assert sorted({request[0][4] for request in everything.missing}) == ["a", "b"]  # y raced all five: it lacks a, b
