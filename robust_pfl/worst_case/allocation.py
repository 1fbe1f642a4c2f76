"""Where a benchmark's runs go: attacks raced, tuning candidates raced, seeds added
where a verdict is still open.  Every decision is a function of the finished runs,
recomputed from them after each stage, so a killed benchmark rerun asks for the same
runs and reaches the same choices.

The rules (docs/benchmark.md, "How runs are allocated"); ``n0`` is
``benchmark.initial_seeds``, the seeds are the file's ``seeds`` in order (the pool),
and every interval is a Student-t interval of a mean of differences *paired by seed*
(for the races at ``confidence``, :attr:`Rule.race_level`):

1. **Attacks raced at the reference candidate** (the defense's own values).  Every
   attack runs with the first ``n0`` seeds.  Attack ``a`` is dropped when the interval
   of its validation accuracy minus the worst attack's (the lowest mean validation
   accuracy) lies above 0: it is clearly less damaging.
2. **Candidates raced on the worst survivors.**  Every candidate runs the reference's
   :attr:`Rule.compare` surviving attacks of lowest mean validation accuracy (all of
   them with ``compare = None``; and races them itself).  A candidate's score on a
   seed is its worst validation accuracy over those attacks on that seed; a candidate
   whose score minus the leader's (the highest mean score) has its interval below 0 is
   dropped.
   While more than one candidate is left, the next seed of the pool is added to all of
   them, up to the pool's end; then the leader is *chosen* (ties: the lower mean
   validation loss under its worst attack, then the order of the file).  Without
   racing (``racing = false``) every candidate runs every attack with the first ``n0``
   seeds and the leader is chosen there.
3. **The chosen candidate faces every attack.**  The attacks it has not raced (the
   reference's other survivors, and, for another candidate, the attacks the
   reference's race dropped) are run for it with ``n0`` seeds and raced against its
   worst as in 1; those not dropped join its set (and get the seeds it was chosen
   with).
4. **Seeds for open verdicts.**  Walking the fractions upwards, a table cell whose
   verdict (:func:`robust_pfl.worst_case.analysis.decide`) is inconclusive gets the
   next seed, for its chosen candidate's attacks (still raced on validation as in 1)
   and for the clean run it is paired with, until it is decided or the pool is spent.
   Cells above a decided break, and cells of a defense that gets no verdict (the
   reference Local, a clean run still climbing, a clean accuracy within the tolerance
   of chance or Local), get no seeds beyond their tuning's.

Only validation accuracies and losses choose: the attacks raced and the candidate
chosen in 1-3 never read a test metric, and the seeds added in 4 (which do) come after
the choice and never reopen it.  Sequential looks at the same data inflate an
interval's error; each look's verdict interval is taken at level ``1 - (1 -
confidence) / looks`` (Bonferroni over the at most ``len(seeds) - n0 + 1`` looks,
:attr:`Rule.level`), so that the verdicts of a cell hold jointly at ``confidence``.
The races use ``confidence`` uncorrected: a wrong drop costs an attack or a candidate,
which the chosen candidate's screen (3) and the verdict's own intervals guard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from robust_pfl.worst_case.plan import NO_ATTACK, ComboKey, GroupKey, Plan

#: A run asked for: a combination and a seed.
Request = tuple[ComboKey, int]


@dataclass(frozen=True)
class Rule:
    """The allocation's settings: the seed pool in order, the seeds every run starts
    with, whether attacks and candidates are raced, and the confidence the verdicts of
    a cell hold at jointly."""

    seeds: tuple[int, ...]
    initial: int
    racing: bool = True
    confidence: float = 0.95
    compare: int | None = 3  # the reference's worst surviving attacks the candidates race on (None: all)

    @property
    def first(self) -> int:
        """Seeds every run starts with (at most the pool)."""
        return max(1, min(self.initial, len(self.seeds)))

    @property
    def cap(self) -> int:
        return len(self.seeds)

    @property
    def looks(self) -> int:
        """How often a cell's intervals can be read: after ``first`` seeds and after each
        one added."""
        return self.cap - self.first + 1

    @property
    def level(self) -> float:
        """Each look's interval level for verdicts (Bonferroni over :attr:`looks`)."""
        return 1 - (1 - self.confidence) / self.looks

    @property
    def race_level(self) -> float:
        """The races' interval level: ``confidence`` itself (a wrong drop costs an
        attack or a candidate, not a verdict: the verdict's own intervals decide)."""
        return self.confidence


@dataclass(frozen=True)
class Final:
    """A finished run's final honest metrics (accuracies in [0, 1]; a non-finite
    accuracy, a diverged run, counts as 0 and a non-finite loss as inf)."""

    validation: float
    validation_loss: float
    test: float
    worst_cluster: float
    success: float


class Runs:
    """The finished runs of a benchmark, by combination and seed, and the clean runs'
    validation-accuracy curves (for the convergence check)."""

    def __init__(self, finals: Mapping[Request, Final], curves: Mapping[Request, Sequence[tuple[int, float]]] = ()):
        self.finals = dict(finals)
        self.curves = dict(curves)

    @classmethod
    def from_frames(cls, finals: pd.DataFrame, curves: pd.DataFrame | None = None) -> Runs:
        """From a finals frame (:func:`robust_pfl.worst_case.runner.finals_frame`) and a
        frame of clean validation curves (columns ``method, candidate, heterogeneity,
        fraction, attack, seed, round, value``)."""
        def finite(values: pd.Series, fill: float) -> np.ndarray:
            array = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
            return np.where(np.isfinite(array), array, fill)

        out: dict[Request, Final] = {}
        if len(finals):
            keys = zip(finals["method"], finals["candidate"], finals["heterogeneity"],
                       finals["fraction"].astype(float), finals["attack"], finals["seed"].astype(int))
            columns = [finite(finals["validation_accuracy"], 0.0), finite(finals["validation_loss"], math.inf),
                       finite(finals["test_accuracy"], 0.0), finite(finals["worst_cluster_test_accuracy"], 0.0),
                       finite(finals["attack_success_rate"], 1.0)]
            for (method, candidate, level, fraction, attack, seed), *values in zip(keys, *columns):
                out[((method, candidate, level, fraction, attack), seed)] = Final(*map(float, values))
        lines: dict[Request, list[tuple[int, float]]] = {}
        if curves is not None and len(curves):
            ordered = curves.sort_values("round", kind="stable")
            for row in ordered.itertuples(index=False):
                request = ((row.method, row.candidate, row.heterogeneity, float(row.fraction), row.attack), int(row.seed))
                value = float(row.value) if math.isfinite(float(row.value)) else 0.0
                lines.setdefault(request, []).append((int(row.round), value))
        return cls(out, lines)

    def has(self, key: ComboKey, seed: int) -> bool:
        return (key, seed) in self.finals

    def values(self, key: ComboKey, seeds: Iterable[int], metric: str) -> list[float]:
        return [getattr(self.finals[(key, seed)], metric) for seed in seeds]

    def seeds_of(self, key: ComboKey, pool: Sequence[int]) -> list[int]:
        """The seeds of the pool finished for ``key``, in pool order."""
        return [seed for seed in pool if (key, seed) in self.finals]


def t_interval(values: Iterable[float], level: float = 0.95,
               bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float, float]:
    """``(mean, low, high)`` of ``values``: the Student-t interval of the mean,
    ``mean +- t_{(1 + level) / 2, n - 1} * s / sqrt(n)`` (``s`` the sample standard
    deviation), clipped to ``bounds``; ``low = high = nan`` for fewer than two values;
    a non-finite value makes all three nan."""
    from scipy import stats

    array = np.asarray(list(values), dtype=float)
    if array.size == 0 or not np.isfinite(array).all():
        return math.nan, math.nan, math.nan
    mean = float(array.mean())
    if array.size < 2:
        return mean, math.nan, math.nan
    spread = float(array.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, array.size - 1) * spread / math.sqrt(array.size)) if spread else 0.0
    return mean, max(mean - half, bounds[0]), min(mean + half, bounds[1])


def clearly_above(values: Sequence[float], reference: Sequence[float], level: float) -> bool:
    """Whether the interval of the mean of ``values - reference`` (paired) lies above 0
    (at least two pairs)."""
    if len(values) < 2:
        return False
    _, low, _ = t_interval(np.subtract(values, reference), level)
    return math.isfinite(low) and low > 0


@dataclass
class Race:
    """An attack race's outcome for one candidate: the attacks kept, those dropped (with
    the reason), the seeds every kept attack has (``reached``), and the runs the next
    level needs (empty when the race reached its last level)."""

    kept: list[str]
    dropped: dict[str, str]
    reached: int
    missing: list[Request]


def key_of(group: GroupKey, candidate: str, attack: str) -> ComboKey:
    method, level, fraction = group
    return (method, candidate, level, fraction, attack)


def worst_attack(runs: Runs, group: GroupKey, candidate: str, attacks: Sequence[str], seeds: Sequence[int]) -> str:
    """The attack of lowest mean validation accuracy (ties: the higher mean validation
    loss, then the first listed)."""
    def rank(item: tuple[int, str]) -> tuple[float, float, int]:
        index, attack = item
        key = key_of(group, candidate, attack)
        return (float(np.mean(runs.values(key, seeds, "validation"))),
                -float(np.mean(runs.values(key, seeds, "validation_loss"))), index)

    return min(enumerate(attacks), key=rank)[1]


def race_attacks(runs: Runs, group: GroupKey, candidate: str, start: Sequence[str], first: int, last: int,
                 rule: Rule) -> Race:
    """Race ``start`` (attacks of ``candidate``) from ``first`` to ``last`` seeds (rule 1
    of the module docstring); stops at the first level whose runs are missing."""
    kept, dropped, reached = list(start), {}, first - 1
    for level in range(first, last + 1):
        seeds = rule.seeds[:level]
        missing = [(key_of(group, candidate, a), s) for a in kept for s in seeds
                   if not runs.has(key_of(group, candidate, a), s)]
        if missing:
            return Race(kept, dropped, reached, missing)
        reached = level
        if rule.racing and level >= 2 and len(kept) > 1:
            worst = worst_attack(runs, group, candidate, kept, seeds)
            floor = runs.values(key_of(group, candidate, worst), seeds, "validation")
            for attack in kept:
                mine = runs.values(key_of(group, candidate, attack), seeds, "validation")
                if attack != worst and clearly_above(mine, floor, rule.race_level):
                    dropped[attack] = f"validation accuracy clearly above {worst}'s ({level} seeds)"
            kept = [a for a in kept if a not in dropped]
    return Race(kept, dropped, reached, [])


@dataclass
class Tuning:
    """One table cell's tuning (rules 1-3): the chosen candidate (``None`` while the
    race runs), the seeds it was chosen with, its attack set, what was dropped and why,
    each candidate's mean worst-case validation accuracy when chosen, and the runs
    still missing."""

    group: GroupKey
    chosen: str | None = None
    tuned_at: int = 0
    attacks: list[str] = field(default_factory=list)
    dropped_attacks: dict[str, dict[str, str]] = field(default_factory=dict)
    dropped_candidates: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    missing: list[Request] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.chosen is not None and not self.missing


def _scores(runs: Runs, group: GroupKey, candidate: str, attacks: Sequence[str], seeds: Sequence[int]) -> list[float]:
    """Per seed, the candidate's worst validation accuracy over ``attacks``."""
    columns = [runs.values(key_of(group, candidate, a), seeds, "validation") for a in attacks]
    return list(np.min(np.asarray(columns, dtype=float), axis=0))


def _leader(runs: Runs, group: GroupKey, alive: Sequence[str], sets: Mapping[str, list[str]],
            seeds: Sequence[int]) -> tuple[str, dict[str, float]]:
    """The candidate of the highest mean score (ties: the lower mean validation loss
    under its worst attack, then the order of the file), and every mean score."""
    means = {c: float(np.mean(_scores(runs, group, c, sets[c], seeds))) for c in alive}

    def rank(item: tuple[int, str]) -> tuple[float, float, int]:
        index, candidate = item
        worst = worst_attack(runs, group, candidate, sets[candidate], seeds)
        loss = float(np.mean(runs.values(key_of(group, candidate, worst), seeds, "validation_loss")))
        return (-means[candidate], loss, index)

    return min(enumerate(alive), key=rank)[1], means


def tune(runs: Runs, plan: Plan, group: GroupKey, rule: Rule) -> Tuning:
    """Rules 1-3 of the module docstring for one table cell."""
    out = Tuning(group)
    candidates = [c for c in plan.candidates[group] if plan.attacks[(group, c)]]
    if not candidates:
        return out  # nothing can run here: not applicable
    reference = candidates[0]
    applicable = {c: plan.attacks[(group, c)] for c in candidates}
    first = rule.first
    screen = race_attacks(runs, group, reference, applicable[reference], first, first, rule)
    if screen.missing:
        out.missing = screen.missing
        return out
    out.dropped_attacks = {c: {} for c in candidates}
    out.dropped_attacks[reference].update(screen.dropped)
    compared = screen.kept
    if rule.racing and rule.compare is not None:
        by_damage = sorted(screen.kept, key=lambda a: _mean(runs, key_of(group, reference, a), rule.seeds[:first]))
        compared = [a for a in screen.kept if a in by_damage[:rule.compare]]
    sets = {c: [a for a in (compared if rule.racing else applicable[c]) if a in applicable[c]]
            or list(applicable[c]) for c in candidates}
    alive = list(candidates)
    for level in range(first, rule.cap + 1):
        missing: list[Request] = []
        for candidate in alive:
            race = race_attacks(runs, group, candidate, sets[candidate], level, level, rule)
            sets[candidate] = race.kept
            out.dropped_attacks[candidate].update(race.dropped)
            missing += race.missing
        if missing:
            out.missing = missing
            return out
        seeds = rule.seeds[:level]
        leader, means = _leader(runs, group, alive, sets, seeds)
        out.scores = means
        if rule.racing and level >= 2:
            best = _scores(runs, group, leader, sets[leader], seeds)
            for candidate in alive:
                if candidate != leader and clearly_above(best, _scores(runs, group, candidate, sets[candidate], seeds),
                                                         rule.race_level):
                    out.dropped_candidates[candidate] = (f"worst-case validation accuracy clearly below {leader}'s "
                                                         f"({level} seeds)")
            alive = [c for c in alive if c not in out.dropped_candidates]
        if not rule.racing or len(alive) == 1 or level == rule.cap:
            out.chosen, out.tuned_at = leader, level
            break
    chosen = out.chosen
    attacks = sets[chosen]
    if rule.racing:
        attacks, out.missing = _verified(runs, group, chosen, attacks, applicable[chosen],
                                         out.dropped_attacks[chosen], out.tuned_at, rule)
    order = applicable[chosen]
    out.attacks = sorted(attacks, key=order.index)
    return out


def _mean(runs: Runs, key: ComboKey, seeds: Sequence[int]) -> float:
    """Mean validation accuracy of ``key`` over ``seeds``."""
    return float(np.mean(runs.values(key, seeds, "validation")))


def _verified(runs: Runs, group: GroupKey, chosen: str, attacks: list[str], applicable: Sequence[str],
              dropped: dict[str, str], tuned_at: int, rule: Rule) -> tuple[list[str], list[Request]]:
    """Rule 3: the attacks ``chosen`` has not run, screened with the first seeds and
    raced against its worst there; those kept join its set (with ``tuned_at`` seeds).
    Returns the set and the runs still missing."""
    seeds = rule.seeds[:rule.first]
    others = [a for a in applicable if a not in attacks and a not in dropped]
    missing = [(key_of(group, chosen, a), s) for a in others for s in seeds if not runs.has(key_of(group, chosen, a), s)]
    if missing:
        return attacks, missing
    if others:
        worst = worst_attack(runs, group, chosen, attacks, seeds)
        floor = runs.values(key_of(group, chosen, worst), seeds, "validation")
        for attack in others:
            mine = runs.values(key_of(group, chosen, attack), seeds, "validation")
            if clearly_above(mine, floor, rule.race_level):
                dropped[attack] = f"validation accuracy clearly above {worst}'s ({rule.first} seeds, chosen candidate)"
            else:
                attacks = [*attacks, attack]
    full = rule.seeds[:tuned_at]
    missing = [(key_of(group, chosen, a), s) for a in attacks for s in full if not runs.has(key_of(group, chosen, a), s)]
    return attacks, missing


@dataclass
class CellState:
    """A table cell after allocation: its tuning, and the attack set and seeds its
    verdict reads (the set raced on past the tuning as seeds were added)."""

    tuning: Tuning
    attacks: list[str] = field(default_factory=list)
    seeds: int = 0
    dropped_later: dict[str, str] = field(default_factory=dict)

    @property
    def group(self) -> GroupKey:
        return self.tuning.group

    @property
    def chosen(self) -> str | None:
        return self.tuning.chosen

    def key(self, attack: str) -> ComboKey:
        return key_of(self.group, self.chosen, attack)


@dataclass
class Allocation:
    """Every table cell's state and the runs to make next (empty: nothing left)."""

    cells: dict[GroupKey, CellState]
    requests: list[Request]


#: ``wants_seed(states, runs) -> {cell: open}``: by the analysis' verdict rules, which
#: table cells (their tuning done) still want a seed (rule 4).
Opener = Callable[[Mapping[GroupKey, CellState], Runs], Mapping[GroupKey, bool]]


def allocate(runs: Runs, plan: Plan, rule: Rule, wants_seed: Opener) -> Allocation:
    """Rules 1-4 of the module docstring over every table cell of ``plan``:
    ``wants_seed(states, runs)`` says, for each cell whose tuning is done, whether its
    verdict is still open and may take a seed (rule 4's walk lives in the analysis).

    Seeds are taken level by level: a cell reads the next seed only while its verdict is
    open, whatever else the store holds (runs made for another grid, or by a full
    factorial in the same store), so the allocation, and every verdict, is the one a
    fresh run would reach."""
    requests: list[Request] = []
    states: dict[GroupKey, CellState] = {}
    for group in plan.groups:
        tuning = tune(runs, plan, group, rule)
        states[group] = CellState(tuning, list(tuning.attacks), tuning.tuned_at)
        requests += tuning.missing
        if tuning.done and group[2] > 0:
            requests += [(key_of(group, tuning.chosen, b), s) for b in plan.backdoors[(group, tuning.chosen)]
                         for s in rule.seeds[:tuning.tuned_at] if not runs.has(key_of(group, tuning.chosen, b), s)]
    waiting: set[GroupKey] = set()
    while True:
        moved = False
        for group, open_ in wants_seed(states, runs).items():
            state = states[group]
            if not open_ or state.seeds >= rule.cap or group in waiting:
                continue
            level = state.seeds + 1
            race = race_attacks(runs, group, state.chosen, state.attacks, level, level, rule)
            clean = states.get((group[0], group[1], 0.0))
            paired = [] if clean is None or clean.chosen is None else [
                (clean.key(NO_ATTACK), s) for s in rule.seeds[:level] if not runs.has(clean.key(NO_ATTACK), s)]
            if race.missing or paired:
                requests += race.missing + paired
                waiting.add(group)
                continue
            state.attacks, state.seeds = race.kept, level
            state.dropped_later.update(race.dropped)
            if clean is not None:
                clean.seeds = max(clean.seeds, level)
            moved = True
        if not moved:
            break
    return Allocation(states, list(dict.fromkeys(requests)))


def clean_key(states: Mapping[GroupKey, CellState], method: str, level: str) -> ComboKey | None:
    """The clean run a defense's cells at ``level`` are paired with (its chosen
    candidate at fraction 0), or ``None`` while that is not chosen."""
    state = states.get((method, level, 0.0))
    if state is None or state.chosen is None or not state.tuning.done:
        return None
    return state.key(NO_ATTACK)


