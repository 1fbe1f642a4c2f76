"""A benchmark's combinations and cells: every (defense, candidate setting,
heterogeneity level, Byzantine fraction, attack), validated once, and its runs, one per
seed, each a cell of the grid store (:mod:`robust_pfl.grid`) keyed like any grid cell
so that cells shared with other grids are run once.

Fraction 0 is the clean cell (attack ``none``, no Byzantine client); every other
fraction runs the attacks of the set and the backdoors.  A combination whose config
fails validation (Bulyan's ``n >= 4f + 3`` at a large fraction, a loss-forging attack on
a method that reports no loss) is *not applicable*: listed with its reason, never run,
and shown as such in the tables.

Which runs are made, and with how many seeds, is not decided here:
:mod:`robust_pfl.worst_case.allocation` asks for them from the finished ones.  The plan
knows every applicable combination, so it can build any run asked for and count the
full factorial the allocation is measured against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from robust_pfl.config import ConfigError, ExperimentConfig, config_error
from robust_pfl.grid_file import Grid, GridCell, Resources, cell_key
from robust_pfl.worst_case.checks import BACKDOOR, NO_ATTACK, ROBUST, AttackEntry, attack_entries, checked_size
from robust_pfl.worst_case.spec import BenchmarkSpec, Defense, cell_payload

#: The store's axis columns of a benchmark's cells.
COLUMNS = ["method", "candidate", "heterogeneity", "fraction", "attack", "seed"]
#: ``section`` of a cell: the clean cell, a robustness attack (:data:`ROBUST`), a
#: backdoor (:data:`BACKDOOR`), a diagnostic run beside the factorial
#: (:mod:`robust_pfl.worst_case.theorem`).  :data:`NO_ATTACK`: the attack label of the
#: clean cells.
CLEAN, DIAGNOSTIC = "clean", "diagnostic"
#: Seconds of planning after which :func:`build_plan` reports its progress.
PROGRESS_SECONDS = 5.0

#: ``(method, candidate, heterogeneity, fraction, attack)``: one combination.
ComboKey = tuple[str, str, str, float, str]
#: ``(method, heterogeneity, fraction)``: one cell of the worst-case table.
GroupKey = tuple[str, str, float]


@dataclass(frozen=True)
class Combo:
    """One applicable combination: its validated config (every seed of the pool), its
    section and each seed's estimated seconds (:mod:`robust_pfl.costs`)."""

    key: ComboKey
    section: str
    config: ExperimentConfig
    n_clients: int
    n_byzantine: int
    rounds: int


@dataclass
class Plan:
    """A benchmark's applicable combinations, grouped: per group (defense, level,
    fraction) its candidates (the reference first), per candidate its attacks and
    backdoors; the combinations that are not applicable (with the reason); the seed
    pool; and the cells made so far from it."""

    spec: BenchmarkSpec
    combos: dict[ComboKey, Combo] = field(default_factory=dict)
    candidates: dict[GroupKey, list[str]] = field(default_factory=dict)
    attacks: dict[tuple[GroupKey, str], list[str]] = field(default_factory=dict)
    backdoors: dict[tuple[GroupKey, str], list[str]] = field(default_factory=dict)
    not_applicable: list[dict[str, Any]] = field(default_factory=list)
    #: runs beside the factorial (the theorem diagnostics): never allocated or judged
    extras: dict[ComboKey, Combo] = field(default_factory=dict)
    #: one run's estimated seconds (the runner passes
    #: :func:`robust_pfl.worst_case.cost.run_seconds`): its share of a stage's progress
    #: ETA and its place in the start order; every run weighs the same without one
    weigh: Callable[[Combo], float] = field(default=lambda combo: 1.0)
    _cells: dict[tuple[ComboKey, int], GridCell] = field(default_factory=dict)
    _made: dict[str, ComboKey] = field(default_factory=dict)  # cell key -> its combination

    @property
    def seeds(self) -> list[int]:
        return self.spec.seeds

    @property
    def groups(self) -> list[GroupKey]:
        return list(self.candidates)

    def cell(self, key: ComboKey, seed: int) -> GridCell:
        """The run of combination ``key`` with ``seed`` (made once, then kept)."""
        found = self._cells.get((key, seed))
        if found is None:
            combo = self.combos[key] if key in self.combos else self.extras[key]
            config = combo.config.model_copy(update={"seeds": [seed]})
            axes = dict(zip(COLUMNS, (*key, seed)))
            found = GridCell(cell_key(config), axes, config.model_dump(), combo.n_clients, combo.n_byzantine,
                             self.weigh(combo))
            self._cells[(key, seed)] = found
            self._made[found.cell] = key
        return found

    @property
    def cells(self) -> list[GridCell]:
        """The cells made so far, in the order they were asked for."""
        return list(self._cells.values())

    def combo_of(self, cell: str) -> Combo:
        """The combination of a cell made from this plan."""
        key = self._made[cell]
        return self.combos[key] if key in self.combos else self.extras[key]

    def add_extra(self, key: ComboKey, config: ExperimentConfig, section: str) -> None:
        """A run beside the factorial (validated ``config``)."""
        from robust_pfl.experiments import byzantine_count, client_count

        self.extras[key] = Combo(key, section, config, client_count(config), byzantine_count(config), config.rounds)

    @property
    def factorial_cells(self) -> list[GridCell]:
        """The cells made so far of the factorial (not its extras)."""
        return [made for (key, _), made in self._cells.items() if key in self.combos]

    def section(self, cell: str) -> str:
        """The section of a cell made from this plan."""
        return self.combo_of(cell).section

    def grid(self, cells: Iterable[GridCell], resources: Resources | None = None) -> Grid:
        return Grid(self.spec.source, list(COLUMNS), list(cells), resources or Resources())

    def full_factorial(self) -> int:
        """The runs of every applicable combination with every seed of the pool."""
        return len(self.combos) * len(self.seeds)


def attack_set(spec: BenchmarkSpec) -> list[AttackEntry]:
    """The robustness attacks, then the backdoors, of ``spec`` (module docstring of
    :mod:`robust_pfl.worst_case.spec`), each with ``benchmark.attack_options`` of its
    name under the options its own table sets
    (:func:`robust_pfl.worst_case.checks.attack_entries`), as a profile narrows them."""
    problems: list[tuple[str, str]] = []
    entries = attack_entries(spec.benchmark, set(), lambda where, message: problems.append((where, message)))
    if problems:  # a spec made without parse_benchmark's checks
        raise config_error(spec.source, problems)
    return [e for e in entries if (e.section == ROBUST and _kept(e, spec.attack_labels))
            or (e.section == BACKDOOR and _kept(e, spec.backdoor_labels))]


def _kept(entry: AttackEntry, labels: list[str] | None) -> bool:
    return labels is None or entry.label in labels


def _check_evaluations(spec: BenchmarkSpec) -> None:
    """The convergence check reads the clean validation accuracy a quarter of the run
    before its end: every defense's run needs an evaluation there."""
    every = int(spec.base.get("eval_every", 10))
    short = [(d.display, spec.rounds_of(d)) for d in spec.defenses if every > max(1, spec.rounds_of(d) // 4)]
    if short:
        raise ConfigError(f"invalid config {spec.source}:\n  eval_every: {every} leaves no evaluation in the last "
                          f"quarter of the runs of {short} (defense, rounds); at most a quarter of the shortest "
                          "run, so that whether a clean run still climbs can be read")


def check_clean_runs(spec: BenchmarkSpec, clean: AttackEntry) -> None:
    """Every level and defense setting must make a valid run without Byzantine
    clients: a failure there is the file's error (a bad option, a level whose data do
    not fit), raised now, never reported as a combination that is not applicable."""
    from robust_pfl.experiments import parse_and_validate

    problems = []
    for level in spec.benchmark.heterogeneity:
        for index, defense in enumerate(spec.defenses):
            for candidate, method in defense.candidates(spec.benchmark.tune):
                try:
                    parse_and_validate(cell_payload(spec, level, 0.0, defense, method, clean.table), spec.source)
                except ConfigError as error:
                    where = f"defenses[{index}] ({defense.display}, {candidate}) at level {level['label']!r}"
                    problems += [f"  {where}: {line.strip()}" for line in str(error).splitlines()[1:]]
    if problems:
        raise ConfigError("\n".join([f"invalid config {spec.source}: a run without Byzantine clients fails", *problems]))


def build_plan(spec: BenchmarkSpec, weigh: Callable[[Combo], float] | None = None,
               say: Callable[[str], None] | None = None) -> Plan:
    """Every combination of ``spec``, validated now (:func:`robust_pfl.experiments.validate`);
    combinations that fail validation are recorded as not applicable.  ``weigh``:
    :attr:`Plan.weigh`; ``say``: a line of progress every :data:`PROGRESS_SECONDS`
    while planning lasts."""
    from robust_pfl.experiments import byzantine_count, client_count, parse_and_validate

    plan = Plan(spec) if weigh is None else Plan(spec, weigh=weigh)
    entries = attack_set(spec)
    seen: dict[str, ComboKey] = {}
    clean = AttackEntry(NO_ATTACK, {"name": NO_ATTACK}, CLEAN)
    check_clean_runs(spec, clean)
    _check_evaluations(spec)
    progress = _Progress(checked_size(spec, entries), say)
    for level in spec.benchmark.heterogeneity:
        for fraction in spec.benchmark.fractions:
            for defense in spec.defenses:
                group: GroupKey = (defense.display, level["label"], fraction)
                plan.candidates[group] = []
                for candidate, method in defense.candidates(spec.benchmark.tune):
                    plan.candidates[group].append(candidate)
                    plan.attacks[(group, candidate)] = []
                    plan.backdoors[(group, candidate)] = []
                    for entry in ([clean] if fraction == 0 else entries):
                        progress.step()
                        key: ComboKey = (defense.display, candidate, level["label"], fraction, entry.label)
                        payload = cell_payload(spec, level, fraction, defense, method, entry.table)
                        try:
                            config = parse_and_validate(payload, spec.source)
                        except ConfigError as error:
                            reason = " ".join(str(error).splitlines()[1:]).strip() or str(error)
                            plan.not_applicable.append({**dict(zip(COLUMNS, key)), "section": entry.section,
                                                        "reason": reason})
                            continue
                        identity = cell_key(config)
                        if identity in seen:
                            raise ConfigError(f"invalid config {spec.source}:\n  {dict(zip(COLUMNS, key))} runs the "
                                              f"same cells as {dict(zip(COLUMNS, seen[identity]))}; combinations "
                                              "must differ")
                        seen[identity] = key
                        plan.combos[key] = Combo(key, entry.section, config, client_count(config),
                                                 byzantine_count(config), config.rounds)
                        (plan.backdoors if entry.section == BACKDOOR else plan.attacks)[(group, candidate)].append(
                            entry.label)
            _check_fraction_runs(plan, level["label"], fraction)
    _check_attack_runs(plan, entries)
    return plan


def _check_attack_runs(plan: Plan, entries: list[AttackEntry]) -> None:
    """An attack that runs in no combination (a backdoor's target or trigger that the
    data cannot take, say) is the file's error at its field, never an attack left out
    of every worst case as not applicable."""
    ran = {key[4] for key in plan.combos}
    problems = []
    for entry in entries:
        if entry.label in ran or not any(group[2] > 0 for group in plan.candidates):  # no attacked fraction
            continue
        reasons = sorted({row["reason"] for row in plan.not_applicable if row["attack"] == entry.label})
        problems.append((entry.where or f"benchmark.{entry.section}s",
                         f"{entry.label!r} can run in no combination: {'; '.join(reasons[:3])}"))
    if problems:
        raise config_error(plan.spec.source, problems)


def _check_fraction_runs(plan: Plan, level: str, fraction: float) -> None:
    """A fraction at which no combination of a level can run is the file's error (its
    data do not fit that many clients, say), never a break of every defense."""
    if any(key[2] == level and key[3] == fraction for key in plan.combos):
        return
    reasons = sorted({row["reason"] for row in plan.not_applicable
                      if row["heterogeneity"] == level and row["fraction"] == fraction})
    lines = [f"  benchmark.fractions: no combination can run at fraction {fraction:g} of level {level!r}:",
             *(f"    {reason}" for reason in reasons[:5])]
    raise ConfigError("\n".join([f"invalid config {plan.spec.source}:", *lines]))


class _Progress:
    """Counts the combinations checked and says how far planning is, every
    :data:`PROGRESS_SECONDS` (silent for a plan checked faster)."""

    def __init__(self, total: int, say: Callable[[str], None] | None) -> None:
        self.total, self.say, self.done = total, say, 0
        self.start = self.last = time.perf_counter()

    def step(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if self.say is not None and now - self.last >= PROGRESS_SECONDS:
            self.last = now
            self.say(f"planning: {self.done} of {self.total} combinations checked ({now - self.start:.0f} s)")
