"""A benchmark file checked at load, as a run config is (:func:`check_file`): every
attack, backdoor, defense, option, tuning value, level and profile, with every mistake
in one :class:`~robust_pfl.config.ConfigError` naming its field, before any work.

The checks reuse the run config's validators: the attack registry's
(:func:`attacks.build`: names, options, values), the schema and the registries'
(:func:`robust_pfl.experiments.parse_and_validate`, on the run each level and defense
setting makes without Byzantine clients, one run per tuning value, not per candidate
of the product), and pydantic's messages (:func:`robust_pfl.config.validation_problems`).
Their fields are renamed to where the benchmark file wrote them (``methods[0].lr`` of a
defense's probe is ``defenses[2].lr``, or ``defenses[2].tune.lr`` for a tuning value;
``task.clusters`` set by a level is ``benchmark.heterogeneity[1].clusters``).

A plan's size is computed arithmetically before anything is enumerated and refused
above :data:`MAX_COMBINATIONS`, :data:`MAX_CANDIDATES`, :data:`MAX_SEEDS` or
:data:`MAX_ROUNDS` (docs/benchmark.md, "Limits").  What is left "not applicable" at
planning (:mod:`robust_pfl.worst_case.plan`) is only a valid combination that cannot
run (Bulyan's ``n >= 4f + 3`` at a large fraction), each with its reason.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pydantic import ValidationError

import attacks
from robust_pfl.config import ByzantineConfig, ConfigError, Problem, config_error, merged_problems, validation_problems
from robust_pfl.engine.registry import display_key
from robust_pfl.engine.types import BackdoorAttack
from robust_pfl.plugins import plugin_problems
from robust_pfl.worst_case.spec import (ALL, PER_CELL, BenchmarkSpec, BenchmarkTable, Defense, Profile, cell_payload,
                                        duplicated, unknown_labels)

#: The most combinations a plan may have.  Planning validates every one (about 3 ms
#: each on one core: 50,000 is a few minutes); the shipped digits file has about 8,000.
MAX_COMBINATIONS = 50_000
#: The most candidate settings of one defense's ``tune`` (each races every surviving
#: attack at every level and fraction; the shipped files try at most 5).
MAX_CANDIDATES = 100
#: The most seeds of a pool: each undecided cell may draw all of them, and each look at
#: a cell divides the verdicts' error level (Bonferroni), so a larger pool decides less
#: per seed; the shipped files use 3-5.
MAX_SEEDS = 100
#: The most rounds of one run (the shipped files use 100-150; 100,000 rounds of the
#: smallest digits run are already hours of compute, and every combination runs them).
MAX_ROUNDS = 100_000

#: ``section`` of a robustness attack and of a backdoor (:class:`AttackEntry`).
ROBUST, BACKDOOR = "attack", "backdoor"
#: The attack label (and attack name) of the clean cells.
NO_ATTACK = "none"

#: The keys of ``[benchmark]`` that make the attack set.
ATTACK_KEYS = ("attacks", "backdoors", "exclude_attacks", "attack_options")

Add = Callable[[str, str], None]  # records a problem: (field, message)


@dataclass(frozen=True)
class AttackEntry:
    """One attack of the set: its label in results, its table and its section."""

    label: str
    table: dict[str, Any]
    section: str
    where: str = ""  # the field that wrote it (benchmark.attacks[1]; benchmark.attacks for "all")


def check_file(data: dict[str, Any], source: str) -> BenchmarkSpec:
    """The benchmark file ``data`` (parsed TOML, paths resolved) as a
    :class:`BenchmarkSpec`, every part checked (module docstring).

    Raises:
        ConfigError: ``invalid config <source>:`` and one line per bad field, each
            field once, every check's at once.
    """
    problems: list[Problem] = []

    def add(where: str, message: str) -> None:
        problems.append((where, message))

    imports = plugin_problems(data.get("plugins"))
    problems += imports
    for key in PER_CELL[:-1]:
        if key in data:
            add(key, "set per cell by the benchmark; remove it (use [[defenses]], benchmark.fractions, "
                     "benchmark.attacks)")
    task = data.get("task")
    image = isinstance(task, dict) and task.get("name") == "image"
    if not image:
        add("task.name", 'a benchmark measures accuracy: give an image task ([task] name = "image")')
    base = {key: value for key, value in data.items() if key not in ("defenses", "benchmark", *PER_CELL[:-1])}
    defenses, all_defenses = _defenses(data.get("defenses"), add)
    table, refused = _table(data.get("benchmark"), add)
    if table is not None:
        entries, complete = None, False
        if imports:  # a plug-in that did not import may be what registers a name
            add("", "not checked because a plug-in did not import (plugins): the attacks' and defenses' names and "
                    "options, the profiles' attack labels, the tuning values, each level's run and the Byzantine "
                    "counts")
        else:
            before = len(problems)
            entries = attack_entries(table, refused, add)
            # a profile's attack labels can be judged only against every attack of the file
            complete = len(problems) == before and not refused & {(key,) for key in ATTACK_KEYS}
        _check_profiles(table, refused, [d.display for d in defenses.values()] if all_defenses else None,
                        entries if complete else None, add)
        fits = _check_sizes(base, table, defenses, entries, add)
        if fits and not imports and image and ("heterogeneity",) not in refused and defenses:
            configs = _check_runs(source, base, table, defenses, add)
            for where, fractions, levels in _fraction_lists(table, refused):
                _check_counts(where, fractions, {label: configs[label] for label in configs
                                                 if levels is None or label in levels}, add)
    if problems or table is None:
        raise config_error(source, merged_problems(problems))
    return BenchmarkSpec(source=source, base=base, defenses=list(defenses.values()), benchmark=table)


def _defenses(raw: Any, add: Add) -> tuple[dict[int, Defense], bool]:
    """The valid ``[[defenses]]`` tables by index, and whether every table is valid
    (else the labels a profile names cannot all be known)."""
    if not isinstance(raw, list) or not raw:
        add("defenses", f"give at least one [[defenses]] table (a method: name, label, options), got {raw!r}")
        return {}, False
    valid = {}
    for index, item in enumerate(raw):
        try:
            valid[index] = Defense.model_validate(item)
        except ValidationError as error:
            for problem in validation_problems(error, Defense, ("defenses", index)):
                add(*problem)
    labels = [d.display for d in valid.values()]
    if duplicated(labels):
        add("defenses", f"labels must be distinct, got {labels} (set 'label')")
    return valid, len(valid) == len(raw)


def _table(raw: Any, add: Add) -> tuple[BenchmarkTable | None, set[tuple[str, ...]]]:
    """The ``[benchmark]`` table, validated in stages as a run config is
    (:func:`robust_pfl.config.check_config`): each refused key is reported, replaced
    by its default (``fractions``, which has none, by ``[0.0]``) and named in the
    returned set (as :func:`_part` names it), so that the checks reading it are skipped
    and the others still run."""
    if not isinstance(raw, dict):
        add("benchmark", f"give a [benchmark] table (fractions, attacks, ...), got {raw!r}")
        return None, set()
    data, refused = dict(raw), set()
    for _ in range(3):  # the keys; the keys the first pass hid; a last try
        try:
            return BenchmarkTable.model_validate(data), refused
        except ValidationError as error:
            for problem in validation_problems(error, BenchmarkTable, ("benchmark",)):
                add(*problem)
            parts = {_part(tuple(item["loc"])) for item in error.errors()}
            if () in parts or parts <= refused:
                break
            refused |= parts
            for part in parts:
                _drop(data, part)
            if ("fractions",) in parts:
                data["fractions"] = [0.0]  # required: a placeholder, its checks skipped
    return None, refused


def _part(loc: Sequence[str | int]) -> tuple[str, ...]:
    """The key of ``[benchmark]`` a pydantic location lies in, down to one profile's
    key (``("quick", "fractions")``, ``("subsets", name, "attacks")``), so that a bad
    key of a profile leaves its other keys checked; ``()`` for the whole table."""
    depth = 3 if loc[:1] == ("subsets",) else 2 if loc[:1] == ("quick",) else 1
    return tuple(str(part) for part in loc[:depth])


def _drop(data: dict[str, Any], part: tuple[str, ...]) -> None:
    """``data`` (the ``[benchmark]`` table, copied where changed) without ``part``: the
    key takes its default."""
    *tables, key = part
    for name in tables:
        inner = data.get(name)
        if not isinstance(inner, dict):
            return
        data[name] = data = dict(inner)
    data.pop(key, None)


def attack_entries(table: BenchmarkTable, refused: set[tuple[str, ...]], add: Add) -> list[AttackEntry]:
    """The robustness attacks, then the backdoors, of ``table`` (``"all"`` or lists),
    each with ``attack_options`` of its name under the options its own table sets, and
    every problem given to ``add``: an unknown name, a table without a name, an option
    the attack does not take or a value it refuses (:func:`attacks.build`), a backdoor
    among the attacks or the reverse, ``none``, an empty attack list, a label used
    twice.  Entries with a problem are left out."""
    backdoor_names = sorted(n for n, cls in attacks.REGISTRY.items() if issubclass(cls, BackdoorAttack))
    robust_names = sorted(n for n in attacks.REGISTRY if n not in backdoor_names and n != NO_ATTACK)
    for index, name in enumerate(table.exclude_attacks):
        if name not in attacks.REGISTRY:  # the registry's message (a near name, the allowed ones)
            _build(name, {}, f"benchmark.exclude_attacks[{index}]", add)
    usable = {}
    for name, options in table.attack_options.items():
        where = f"benchmark.attack_options.{display_key(name)}"
        usable[name] = _build(name, options, where, add, options_where=where)
    out = []
    for section, key, names in ((ROBUST, "attacks", robust_names), (BACKDOOR, "backdoors", backdoor_names)):
        chosen = getattr(table, key)
        if (key,) in refused:
            continue
        if chosen == ALL:
            entries = [(f"benchmark.{key}", {"name": n}) for n in names if n not in table.exclude_attacks]
        else:
            entries = [(f"benchmark.{key}[{index}]", entry) for index, entry in enumerate(chosen)]
        if section == ROBUST and not entries:
            add("benchmark.attacks", f"give at least one attack ('all' or names, one of {names}): without one "
                                     "the benchmark runs only clean cells and judges nothing")
        for where, entry in entries:
            found = _entry(where, entry, section, names, table.attack_options, usable, add)
            if found is not None:
                out.append(found)
    labels = [entry.label for entry in out]
    if duplicated(labels):
        add("benchmark.attacks", f"labels {duplicated(labels)} appear twice (give tables a 'label')")
    return out


def _entry(where: str, entry: str | dict[str, Any], section: str, names: list[str],
           defaults: Mapping[str, Mapping[str, Any]], usable: Mapping[str, bool], add: Add) -> AttackEntry | None:
    """One attack of a list (``where``: its field) as an :class:`AttackEntry`, or None
    after a problem."""
    table = {"name": entry} if isinstance(entry, str) else dict(entry)
    label = table.pop("label", None)
    name = table.get("name")
    named = where if isinstance(entry, str) else f"{where}.name"
    if not isinstance(name, str):
        add(named, f"every attack needs a 'name', one of {names}; got {entry!r}")
        return None
    if label is not None and not (isinstance(label, str) and label):
        add(f"{where}.label", f"must be a non-empty string, got {label!r}")
        return None
    if name == NO_ATTACK:
        add(named, f"'none' is the clean run every fraction 0 makes, not an attack; give one of {names}")
        return None
    if name in attacks.REGISTRY and name not in names:
        other = "benchmark.backdoors" if section == ROBUST else "benchmark.attacks"
        kind = "a backdoor (scored by attack success)" if section == ROBUST else "not a backdoor"
        add(named, f"{name!r} is {kind}: list it under {other}; here one of {names}")
        return None
    options = {**defaults.get(name, {}), **table}
    if not usable.get(name, True):
        return None  # its attack_options were refused (reported there)
    if not _build(name, {k: v for k, v in options.items() if k != "name"}, named, add, options_where=where):
        return None
    return AttackEntry(label or name, options, section, where)


def _build(name: str, options: Mapping[str, Any], where: str, add: Add, options_where: str | None = None) -> bool:
    """Whether the attack ``name`` builds with ``options`` (:func:`attacks.build`, as a
    run config's ``attack`` is checked); an unknown name is reported at ``where``, a
    refused option at ``options_where``."""
    try:
        attacks.build(name, dict(options))
    except attacks.UnknownAttack as error:
        add(where, str(error))
        return False
    except ValueError as error:
        add(options_where or where, str(error))
        return False
    return True


def profiles(table: BenchmarkTable) -> list[tuple[str, Profile]]:
    """``(field, profile)`` of the quick profile and every subset."""
    return [("benchmark.quick", table.quick),
            *((f"benchmark.subsets.{display_key(name)}", profile) for name, profile in table.subsets.items())]


def _check_profiles(table: BenchmarkTable, refused: set[tuple[str, ...]], defense_labels: list[str] | None,
                    entries: list[AttackEntry] | None, add: Add) -> None:
    """Every profile's labels, whichever profile runs (a list whose labels cannot all
    be known, after a problem there, is not checked)."""
    known = {
        "defenses": defense_labels,
        "heterogeneity": None if ("heterogeneity",) in refused else [level["label"] for level in table.heterogeneity],
        "attacks": None if entries is None else [e.label for e in entries if e.section == ROBUST],
        "backdoors": None if entries is None else [e.label for e in entries if e.section == BACKDOOR],
    }
    for where, profile in profiles(table):
        for field, labels in known.items():
            problem = None if labels is None else unknown_labels(f"{where}.{field}", getattr(profile, field), labels)
            if problem is not None:
                add(*problem)


def combination_bound(levels: int, fractions: Sequence[float], settings: int, attacks_: int) -> int:
    """The combinations of a plan before any is found not applicable: per level and
    defense setting, one clean combination per fraction 0 and one per attack at every
    other fraction."""
    clean = sum(1 for fraction in fractions if fraction == 0)
    return levels * settings * (clean + (len(fractions) - clean) * attacks_)


def _check_sizes(base: Mapping[str, Any], table: BenchmarkTable, defenses: Mapping[int, Defense],
                 entries: list[AttackEntry] | None, add: Add) -> bool:
    """The plan's sizes against the limits (module docstring), computed without
    enumerating anything; whether the runs can be checked (:func:`_check_runs`: not
    with more seeds, rounds or combinations than the limits)."""
    fits = True

    def refuse(where: str, message: str) -> None:
        nonlocal fits
        fits = False
        add(where, message)

    _check_seeds("seeds", base.get("seeds"), refuse)
    _check_rounds("rounds", base.get("rounds"), refuse)
    counts = {}
    for index, defense in defenses.items():
        _check_rounds(f"defenses[{index}].rounds", defense.rounds, refuse)
        counts[defense.display] = count = defense.candidate_count()
        if count > MAX_CANDIDATES:  # its values are then not probed (_check_tuning); the others are
            add(f"defenses[{index}].tune", f"{count} candidate settings, at most {MAX_CANDIDATES}: tune fewer "
                                              "values, or one factor at a time (a list of tables)")
    if entries is None:
        return fits
    robust = [e.label for e in entries if e.section == ROBUST]
    backdoors = [e.label for e in entries if e.section == BACKDOOR]
    levels = [level["label"] for level in table.heterogeneity]
    runs = [("benchmark", None)] + [(where, profile) for where, profile in profiles(table)]
    for where, profile in runs:
        if profile is not None:
            _check_seeds(f"{where}.seeds", profile.seeds, refuse)
            _check_rounds(f"{where}.rounds", profile.rounds, refuse)

        def narrowed(field: str, full: list[str]) -> list[str]:
            chosen = None if profile is None else getattr(profile, field)
            return full if chosen is None else [label for label in full if label in chosen]

        tune = table.tune if profile is None or profile.tune is None else profile.tune
        chosen = narrowed("defenses", list(counts))
        settings = sum(counts[label] if tune else 1 for label in chosen)
        fractions = table.fractions if profile is None or profile.fractions is None else profile.fractions
        attacked = len(narrowed("attacks", robust)) + len(narrowed("backdoors", backdoors))
        total = combination_bound(len(narrowed("heterogeneity", levels)), fractions, settings, attacked)
        if total > MAX_COMBINATIONS:
            clean = sum(1 for fraction in fractions if fraction == 0)
            refuse(where, f"{'the file' if profile is None else 'this profile'} plans {total} combinations "
                          f"({len(narrowed('heterogeneity', levels))} levels x {settings} defense settings x "
                          f"({clean} clean + {len(fractions) - clean} fractions x {attacked} attacks)), at most "
                          f"{MAX_COMBINATIONS}: split it into subsets, or tune fewer values")
    return fits


def _check_seeds(where: str, seeds: Any, add: Add) -> None:
    """A seed pool within :data:`MAX_SEEDS` (a value that is no list is the schema's to refuse)."""
    if isinstance(seeds, list) and len(seeds) > MAX_SEEDS:
        add(where, f"a pool of at most {MAX_SEEDS} seeds, got {len(seeds)}")


def _check_rounds(where: str, rounds: Any, add: Add) -> None:
    """A run length within :data:`MAX_ROUNDS` (a value that is no integer is the schema's to refuse)."""
    if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds > MAX_ROUNDS:
        add(where, f"must be at most {MAX_ROUNDS} rounds a run, got {rounds}")


def _check_runs(source: str, base: dict[str, Any], table: BenchmarkTable, defenses: Mapping[int, Defense],
                add: Add) -> dict[str, Any]:
    """Each level's run with each defense's own values, and each tuning value at the
    first level, checked as a run config without Byzantine clients
    (:func:`robust_pfl.experiments.parse_and_validate`), problems renamed to the
    file's fields; returns a validated config per level (label) that passed."""
    spec = BenchmarkSpec.model_construct(source=source, base=base, defenses=list(defenses.values()),
                                         benchmark=table, attack_labels=None, backdoor_labels=None)
    clean = {"name": NO_ATTACK}
    configs: dict[str, Any] = {}
    checked: dict[int, bool] = {}  # defense index: its own values make a valid run at the first level
    for level_index, level in enumerate(table.heterogeneity):
        where = f"benchmark.heterogeneity[{level_index}]"
        if "name" in level and level["name"] != "image":
            add(f"{where}.name", f"a level sets options of the file's image task, not another task: a benchmark "
                                 f"measures accuracy (task.name = 'image'); got {level['name']!r}")
            continue
        first = next(iter(defenses))
        # the file's own rounds are checked even where every defense sets its own
        probes = [(first, defenses[first].model_copy(update={"rounds": None}))] if defenses[first].rounds else []
        for index, defense in [*probes, *defenses.items()]:
            method = defense.candidates(False)[0][1]
            found = _probe(cell_payload(spec, level, 0.0, defense, method, clean), source)
            if isinstance(found, list):
                for field, message in found:
                    add(_blame(field, level_index, level, index, defense, base), _renamed_skip(message, index))
            else:
                configs.setdefault(level["label"], found)
            if index not in checked:
                checked[index] = not isinstance(found, list)
                if checked[index]:
                    _check_tuning(spec, level, index, defense, source, add)
    return configs


def _check_tuning(spec: BenchmarkSpec, level: Mapping[str, Any], index: int, defense: Defense, source: str,
                  add: Add) -> None:
    """Each value of ``defense``'s ``tune`` (a table of lists: each value alone; a list
    of tables: each table) in a run at ``level``, whether or not the file tunes;
    problems of the changed options only (the others are the defense's own, checked
    already)."""
    if defense.candidate_count() > MAX_CANDIDATES:
        return  # refused by its size (_check_sizes): probing each of its values could take minutes
    base = defense.candidates(False)[0][1]
    if isinstance(defense.tune, list):
        changes = [(f"defenses[{index}].tune[{k}]", table) for k, table in enumerate(defense.tune)]
    else:
        changes = [(f"defenses[{index}].tune", {key: value})
                   for key, values in defense.tune.items() for value in values]
    for where, change in changes:
        found = _probe(cell_payload(spec, level, 0.0, defense, {**base, **change}, {"name": NO_ATTACK}), source)
        if not isinstance(found, list):
            continue
        for field, message in found:
            rest = field[len("methods[0]"):] if field.startswith("methods[0]") else None
            if rest is not None and (rest == "" or re.split(r"[.\[]", rest[1:])[0] in change):
                add(f"{where}{rest}", message)


def _probe(payload: dict[str, Any], source: str) -> Any:
    """The validated config of ``payload``, or its problems ``[(field, message)]``.
    Cost and budget warnings are left to planning, which validates every combination
    (and says them once)."""
    from robust_pfl.experiments import parse_and_validate

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return parse_and_validate(payload, source)
    except ConfigError as error:
        return [_split(line) for line in str(error).splitlines()[1:]]


def _split(line: str) -> Problem:
    """A :func:`~robust_pfl.config.config_error` line back as ``(field, message)``
    (``""`` where the message names its own field)."""
    text = line.strip()
    field, colon, message = text.partition(": ")
    if colon and field and " " not in field:
        return field, message
    return "", text


def _renamed_skip(message: str, index: int) -> str:
    """A run config's "``methods ...`` not checked" line as the benchmark file names
    the method: ``defenses[index] ...`` (other messages unchanged)."""
    if message.startswith("methods ") and " not checked: " in message:
        return f"defenses[{index}]{message[len('methods'):]}"
    return message


def _blame(field: str, level_index: int, level: Mapping[str, Any], index: int, defense: Defense,
           base: Mapping[str, Any]) -> str:
    """A probe's field as the benchmark file wrote it: the method's options are the
    defense's, a task option a level sets is the level's, the run length a defense sets
    is its own, a validation split the file's task leaves unset is the benchmark's."""
    if field == "methods[0]" or field.startswith(("methods[0].", "methods[0][")):
        return f"defenses[{index}]{field[len('methods[0]'):]}"
    if field.startswith("task."):
        key = re.split(r"[.\[]", field[len("task."):])[0]
        if key in level:
            return f"benchmark.heterogeneity[{level_index}].{field[len('task.'):]}"
        if key == "validation_per_client" and key not in (base.get("task") or {}):
            return "benchmark.validation_per_client"
    if field == "rounds" and defense.rounds is not None:
        return f"defenses[{index}].rounds"
    return field


def _fraction_lists(table: BenchmarkTable,
                    refused: set[tuple[str, ...]]) -> list[tuple[str, list[float], list[str] | None]]:
    """``(field, fractions, levels)`` of the file (every level: ``None``) and of every
    profile that sets fractions (the levels it runs)."""
    out = [] if ("fractions",) in refused else [("benchmark.fractions", table.fractions, None)]
    return out + [(f"{where}.fractions", p.fractions, p.heterogeneity) for where, p in profiles(table)
                  if p.fractions is not None]


def _check_counts(where: str, fractions: Sequence[float], configs: Mapping[str, Any], add: Add) -> None:
    """Each fraction > 0 must add a Byzantine client at every level, and no two
    fractions the same count: they would run the same cells twice under two names
    (refused, not merged: the fraction a verdict names must be the one written)."""
    from robust_pfl.experiments import byzantine_count

    for label, config in configs.items():
        honest = config.task.clusters * config.task.clients_per_cluster
        seen: dict[int, float] = {}
        for fraction in fractions:
            count = byzantine_count(config.model_copy(update={"byzantine": ByzantineConfig(fraction=fraction)}))
            if fraction > 0 and count == 0:
                add(where, f"{fraction:g} adds no Byzantine client to the {honest} honest ones of level {label!r} "
                           "(a share of all clients, rounded): raise it or remove it")
            elif count in seen:
                add(where, f"{seen[count]:g} and {fraction:g} both add {count} Byzantine clients to the {honest} "
                           f"honest ones of level {label!r}: the same runs twice; keep one")
            else:
                seen[count] = fraction


def checked_size(spec: BenchmarkSpec, entries: Sequence[AttackEntry]) -> int:
    """The combinations ``spec``'s plan enumerates (:func:`combination_bound`)."""
    settings = sum(d.candidate_count() if spec.benchmark.tune else 1 for d in spec.defenses)
    return combination_bound(len(spec.benchmark.heterogeneity), spec.benchmark.fractions, settings, len(entries))
