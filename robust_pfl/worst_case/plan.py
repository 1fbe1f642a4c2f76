"""A benchmark's cells: every (heterogeneity level, Byzantine fraction, defense,
candidate setting, attack, seed), each one run of the grid store
(:mod:`robust_pfl.grid`), keyed like any grid cell so that cells shared with other
grids are run once.

Fraction 0 is the clean cell (attack ``none``, no Byzantine client); every other
fraction runs every attack of the set and every backdoor.  A combination whose config
fails validation (Bulyan's ``n >= 4f + 3`` at a large fraction, a loss-forging attack on
a method that reports no loss, a data attack on a regression task) is *not applicable*:
listed with its reason, never run, and shown as such in the tables.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import attacks
from robust_pfl.config import ConfigError
from robust_pfl.engine.types import BackdoorAttack
from robust_pfl.grid_file import Grid, GridCell, Resources, grid_cell
from robust_pfl.worst_case.spec import ALL, BenchmarkSpec

#: The store's axis columns of a benchmark's cells.
COLUMNS = ["method", "candidate", "heterogeneity", "fraction", "attack", "seed"]
#: ``section`` of a cell: the clean cell, a robustness attack, a backdoor.
CLEAN, ROBUST, BACKDOOR = "clean", "attack", "backdoor"


@dataclass(frozen=True)
class AttackEntry:
    """One attack of the set: its label in results, its table and its section."""

    label: str
    table: dict[str, Any]
    section: str


@dataclass
class Plan:
    """A benchmark's cells (grid order), each cell's axes and section, the
    combinations that are not applicable (axes without seed, and the reason), and the
    cost estimate of the cells (seconds, a lower bound: :mod:`robust_pfl.costs`)."""

    spec: BenchmarkSpec
    cells: list[GridCell] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)
    not_applicable: list[dict[str, Any]] = field(default_factory=list)
    estimated_seconds: float = 0.0

    def grid(self, resources: Resources | None = None) -> Grid:
        return Grid(self.spec.source, list(COLUMNS), self.cells, resources or Resources())


def attack_set(spec: BenchmarkSpec) -> list[AttackEntry]:
    """The robustness attacks, then the backdoors, of ``spec`` (module docstring of
    :mod:`robust_pfl.worst_case.spec`)."""
    table = spec.benchmark
    excluded = set(table.exclude_attacks)
    unknown = sorted(excluded - set(attacks.REGISTRY))
    if unknown:
        raise ConfigError(f"invalid config {spec.source}:\n  benchmark.exclude_attacks: unknown attacks {unknown}")
    backdoor_names = sorted(n for n, cls in attacks.REGISTRY.items() if issubclass(cls, BackdoorAttack))
    robust_names = sorted(n for n in attacks.REGISTRY if n not in backdoor_names and n != "none")
    out = []
    for section, chosen, everything in ((ROBUST, table.attacks, robust_names), (BACKDOOR, table.backdoors, backdoor_names)):
        entries = [{"name": n} for n in everything if n not in excluded] if chosen == ALL else chosen
        for entry in entries:
            entry = {"name": entry} if isinstance(entry, str) else dict(entry)
            label = entry.pop("label", None) or entry.get("name")
            if not isinstance(label, str):
                raise ConfigError(f"invalid config {spec.source}:\n  benchmark.{section}s: every entry needs a "
                                  f"string name, got {entry!r}")
            out.append(AttackEntry(label, entry, section))
    labels = [entry.label for entry in out]
    duplicated = sorted({label for label in labels if labels.count(label) > 1})
    if duplicated:
        raise ConfigError(f"invalid config {spec.source}:\n  benchmark.attacks: labels {duplicated} appear twice "
                          "(give tables a 'label')")
    for section, labels in ((ROBUST, spec.attack_labels), (BACKDOOR, spec.backdoor_labels)):
        known = [e.label for e in out if e.section == section]
        unknown = [label for label in labels or [] if label not in known]
        if unknown:
            raise ConfigError(f"invalid config {spec.source}:\n  the profile's {section}s: unknown {unknown}; "
                              f"known: {known}")
    selected = [e for e in out if (e.section == ROBUST and _kept(e, spec.attack_labels))
                or (e.section == BACKDOOR and _kept(e, spec.backdoor_labels))]
    return selected


def _kept(entry: AttackEntry, labels: list[str] | None) -> bool:
    return labels is None or entry.label in labels


def cell_payload(spec: BenchmarkSpec, level: dict[str, Any], fraction: float, method: dict[str, Any],
                 attack: dict[str, Any]) -> dict[str, Any]:
    """The run config of one combination, every seed: the file's base, the level's task
    options, the Byzantine fraction, the attack and the candidate method."""
    payload = copy.deepcopy(spec.base)
    payload["task"] = {**payload.get("task", {}), **{k: v for k, v in level.items() if k != "label"}}
    if fraction > 0:
        payload["byzantine"] = {"fraction": fraction}
    payload["attack"] = copy.deepcopy(attack)
    payload["methods"] = [copy.deepcopy(method)]
    return payload


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
                    parse_and_validate(cell_payload(spec, level, 0.0, method, clean.table), spec.source)
                except ConfigError as error:
                    where = f"defenses[{index}] ({defense.display}, {candidate}) at level {level['label']!r}"
                    problems += [f"  {where}: {line.strip()}" for line in str(error).splitlines()[1:]]
    if problems:
        raise ConfigError("\n".join([f"invalid config {spec.source}: a run without Byzantine clients fails", *problems]))


def build_plan(spec: BenchmarkSpec) -> Plan:
    """Every cell of ``spec``, validated now (:func:`robust_pfl.experiments.validate`);
    combinations that fail validation are recorded as not applicable."""
    from robust_pfl.experiments import built, parse_and_validate

    plan = Plan(spec)
    entries = attack_set(spec)
    seen: dict[str, dict[str, Any]] = {}
    clean = AttackEntry("none", {"name": "none"}, CLEAN)
    check_clean_runs(spec, clean)
    for level in spec.benchmark.heterogeneity:
        for fraction in spec.benchmark.fractions:
            for defense in spec.defenses:
                for candidate, method in defense.candidates(spec.benchmark.tune):
                    for entry in ([clean] if fraction == 0 else entries):
                        axes = {"method": defense.display, "candidate": candidate, "heterogeneity": level["label"],
                                "fraction": fraction, "attack": entry.label}
                        payload = cell_payload(spec, level, fraction, method, entry.table)
                        try:
                            config = parse_and_validate(payload, spec.source)
                        except ConfigError as error:
                            reason = " ".join(str(error).splitlines()[1:]).strip() or str(error)
                            plan.not_applicable.append({**axes, "section": entry.section, "reason": reason})
                            continue
                        plan.estimated_seconds += built(config).seconds
                        for seed in config.seeds:
                            cell = grid_cell(config.model_copy(update={"seeds": [seed]}), {**axes, "seed": seed})
                            if cell.cell in seen:
                                raise ConfigError(f"invalid config {spec.source}:\n  {axes} runs the same cell as "
                                                  f"{seen[cell.cell]}; combinations must differ")
                            seen[cell.cell] = axes
                            plan.cells.append(cell)
                            plan.sections[cell.cell] = entry.section
    return plan
