"""Mistaken and hostile benchmark files, one mistake each (issue 55, item 2): every
mistake the issue found accepted or crashing is refused at load with a config error
naming its field; random one-leaf mutations of a small valid file are either refused
the same way (never a raw pydantic, OS or type error) or accepted, and an accepted file
keeps every defense, level, fraction and attack it wrote (run or listed not
applicable with a reason, never silently dropped).  Nothing is trained: the files are
only loaded (every profile) and planned, as in the style of tests/test_hostile_configs.py
and tests/test_grid_file.py."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from robust_pfl.cli import main
from robust_pfl.config import ConfigError
from robust_pfl.worst_case.checks import MAX_CANDIDATES, MAX_COMBINATIONS, MAX_ROUNDS, MAX_SEEDS
from robust_pfl.worst_case.plan import build_plan
from robust_pfl.worst_case.loading import parse_benchmark

from test_worst_case import TINY, tiny

pytestmark = pytest.mark.usefixtures("single_thread")

#: A small valid file: two defenses (one tuned), two levels, a clean and an attacked
#: fraction, a named attack and a labelled table with an option, one backdoor, and the
#: quick profile and a subset.
VALID: dict[str, Any] = {
    "rounds": 2,
    "eval_every": 1,
    "batch_size": 8,
    "seeds": [0, 1],
    "task": {"name": "image", "dataset": "digits", "kind": "private_label", "clusters": 2,
             "clients_per_cluster": 4, "model": {"name": "mlp", "hidden": [8]}},
    "benchmark": {
        "fractions": [0.0, 0.2],
        "attacks": ["alie", {"name": "gaussian_noise", "label": "noise", "std": 1.0}],
        "backdoors": ["badnets"],
        "attack_options": {"alie": {"z": 1.0}},
        "tolerance": {"share": 0.2},
        "heterogeneity": [{"label": "K2"}, {"label": "K2 small", "train_per_client": 20}],
        "quick": {"rounds": 1, "attacks": ["alie"], "fractions": [0.0, 0.2]},
        "subsets": {"one": {"defenses": ["FC"], "heterogeneity": ["K2"]}},
    },
    "defenses": [
        {"label": "FC", "name": "fc", "tune": {"lr": [0.05, 0.1]}},
        {"label": "Global+median", "name": "global", "aggregator": "median", "lr": 0.1},
    ],
}

class _Delete:
    """A mutation's value: the key removed (its repr is stable, for test ids that
    every pytest-xdist worker collects alike)."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()


def mutated(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """:data:`VALID` with the leaf at ``path`` set to ``value`` (or removed)."""
    data = copy.deepcopy(VALID)
    *head, last = path
    inner = data
    for part in head:
        inner = inner[part]
    if value is DELETE:
        del inner[last]
    else:
        inner[last] = value
    return data


def load_every_profile(data: dict[str, Any]) -> None:
    """Load the file as each of its profiles runs (all of them are checked at load,
    whichever is asked for)."""
    parse_benchmark(copy.deepcopy(data), "fuzz.toml")
    parse_benchmark(copy.deepcopy(data), "fuzz.toml", quick=True)
    for name in data.get("benchmark", {}).get("subsets", {}):
        parse_benchmark(copy.deepcopy(data), "fuzz.toml", subset=name)


def assert_clear(error: ConfigError) -> list[str]:
    """The error's fields; every line under ``invalid config <file>:`` is one problem."""
    lines = str(error).splitlines()
    assert lines[0] == "invalid config fuzz.toml:", str(error)
    assert len(lines) >= 2 and all(line.startswith("  ") and line.strip() for line in lines[1:]), str(error)
    return [line.strip().split(": ", 1)[0] for line in lines[1:]]


def assert_keeps_every_entry(data: dict[str, Any]) -> None:
    """The accepted file's plan holds every defense, level and fraction it wrote, and
    each attack and backdoor it listed runs somewhere or is listed not applicable with
    a reason."""
    spec = parse_benchmark(copy.deepcopy(data), "fuzz.toml")
    plan = build_plan(spec)
    groups = set(plan.candidates)
    assert {g[0] for g in groups} == {d.display for d in spec.defenses}
    assert len(spec.defenses) == len(data["defenses"])
    assert {g[1] for g in groups} == {level["label"] for level in data["benchmark"]["heterogeneity"]}
    assert {g[2] for g in groups} == set(data["benchmark"]["fractions"])
    labels = [label for key in ("attacks", "backdoors") if (written := data["benchmark"].get(key, "all")) != "all"
              for label in (a if isinstance(a, str) else a.get("label") or a["name"] for a in written)]
    attacked = {key[4] for key in plan.combos} | {row["attack"] for row in plan.not_applicable if row["reason"]}
    assert set(labels) <= attacked, (labels, attacked)


#: One mistake each, with the field the error must name: the issue's 34 misbehaving
#: cases by kind, and their neighbours.
MISTAKES = [
    # attacks, backdoors and their options: were "not applicable" or silently run
    ((("benchmark", "attacks", 0), "bitflip"), "benchmark.attacks[0]"),
    ((("benchmark", "attacks", 1, "stdd"), 1.0), "benchmark.attacks[1]"),
    ((("benchmark", "attacks", 1, "std"), -1.0), "benchmark.attacks[1]"),
    ((("benchmark", "attacks", 1, "name"), DELETE), "benchmark.attacks[1].name"),
    ((("benchmark", "attacks", 1, "label"), ""), "benchmark.attacks[1].label"),
    ((("benchmark", "attacks", 1, "label"), "alie"), "benchmark.attacks"),
    ((("benchmark", "attacks"), []), "benchmark.attacks"),
    ((("benchmark", "attacks"), ["badnets"]), "benchmark.attacks[0]"),
    ((("benchmark", "attacks"), ["none"]), "benchmark.attacks[0]"),
    ((("benchmark", "backdoors"), ["badnetz"]), "benchmark.backdoors[0]"),
    ((("benchmark", "backdoors"), ["gaussian_noise"]), "benchmark.backdoors[0]"),
    ((("benchmark", "backdoors"), [{"name": "badnets", "target": 99}]), "benchmark.backdoors[0]"),
    ((("benchmark", "exclude_attacks"), ["bitflip"]), "benchmark.exclude_attacks[0]"),
    ((("benchmark", "attack_options", "bitflip"), {}), "benchmark.attack_options.bitflip"),
    ((("benchmark", "attack_options", "alie"), {"zz": 1.0}), "benchmark.attack_options.alie"),
    # profiles: checked whichever runs, never a raw ValidationError
    ((("benchmark", "quick", "attacks"), ["bitflip"]), "benchmark.quick.attacks"),
    ((("benchmark", "quick", "attacks"), []), "benchmark.quick.attacks"),
    ((("benchmark", "quick", "defenses"), ["XX"]), "benchmark.quick.defenses"),
    ((("benchmark", "quick", "fractions"), [0.2, 0.2]), "benchmark.quick.fractions"),
    ((("benchmark", "quick", "fractions"), [math.nan]), "benchmark.quick.fractions"),
    ((("benchmark", "quick", "rounds"), MAX_ROUNDS + 1), "benchmark.quick.rounds"),
    ((("benchmark", "subsets", "one", "fractions"), [0.7]), "benchmark.subsets.one.fractions"),
    ((("benchmark", "subsets", "one", "heterogeneity"), ["K3"]), "benchmark.subsets.one.heterogeneity"),
    ((("benchmark", "subsets", "one", "backdoors"), ["dba"]), "benchmark.subsets.one.backdoors"),
    ((("benchmark", "subsets", "one", "seeds"), list(range(MAX_SEEDS + 1))), "benchmark.subsets.one.seeds"),
    # tuning values, checked while tuning is off too
    ((("defenses", 0, "tune", "lr"), [-0.1, 0.1]), "defenses[0].tune.lr"),
    ((("defenses", 0, "tune"), [{"lr": -1.0}]), "defenses[0].tune[0].lr"),
    ((("defenses", 0, "tune"), {"lr": [0.1, 0.1]}), "defenses[0].tune"),
    ((("defenses", 0, "tune"), {"lr": [0.001 * i for i in range(1, MAX_CANDIDATES + 2)]}), "defenses[0].tune"),
    # 10^6 candidates: refused from the product's size, never enumerated (it hung for 35 minutes)
    ((("defenses", 0, "tune"), {"lr": [0.001 * i for i in range(1, 1001)], "heavy_ball": [i / 1e3 for i in range(1000)]}),
     "defenses[0].tune"),
    # defenses
    ((("defenses", 0, "name"), "fcc"), "defenses[0].name"),
    ((("defenses", 0, "lr"), -1.0), "defenses[0].lr"),
    ((("defenses", 1, "aggregator"), "krumm"), "defenses[1].aggregator"),
    ((("defenses", 1, "label"), "FC"), "defenses"),
    ((("defenses", 0, "rounds"), MAX_ROUNDS + 1), "defenses[0].rounds"),
    ((("defenses",), []), "defenses"),
    # levels: blamed on the field the level wrote
    ((("benchmark", "heterogeneity", 1, "name"), "synthetic_linear"), "benchmark.heterogeneity[1].name"),
    ((("benchmark", "heterogeneity", 0, "clusters"), "2"), "benchmark.heterogeneity[0].clusters"),
    ((("benchmark", "heterogeneity", 0, "clusterz"), 2), "benchmark.heterogeneity[0].clusterz"),
    ((("benchmark", "heterogeneity", 1, "label"), "K2"), "benchmark.heterogeneity"),
    ((("benchmark", "heterogeneity", 0, "train_per_client"), 5000), "benchmark.heterogeneity[0].train_per_client"),
    # the run config's fields, which profiles read: config errors, never TypeError
    ((("seeds",), 5), "seeds"),
    ((("rounds",), "2"), "rounds"),
    ((("eval_every",), "1"), "eval_every"),
    ((("rounds",), 10**12), "rounds"),
    ((("seeds",), list(range(10_000))), "seeds"),
    ((("task", "name"), "synthetic_linear"), "task.name"),
    ((("methods",), [{"name": "fc"}]), "methods"),
    # fractions and tolerance
    ((("benchmark", "fractions"), [0.0, 0.2, 0.21]), "benchmark.fractions"),
    ((("benchmark", "fractions"), [0.0, 1e-9]), "benchmark.fractions"),
    ((("benchmark", "fractions"), [0.0, 0.7]), "benchmark.fractions"),
    ((("benchmark", "fractions"), [0.0]), "benchmark.fractions"),
    ((("benchmark", "tolerance"), -1), "benchmark.tolerance.points"),
    ((("benchmark", "heterogeneity"), [{"label": f"L{i}"} for i in range(MAX_COMBINATIONS // 6)]), "benchmark"),
]


@pytest.mark.parametrize("mutation, field", MISTAKES, ids=[field + "=" + repr(m[1])[:24] for m, field in MISTAKES])
def test_each_mistake_is_refused_at_load_naming_its_field(mutation, field):
    data = mutated(*mutation)
    with pytest.raises(ConfigError) as error:
        load_every_profile(data)
        build_plan(parse_benchmark(copy.deepcopy(data), "fuzz.toml"))  # a data-dependent mistake: at planning
    assert field in assert_clear(error.value), str(error.value)


def test_the_valid_file_is_accepted_and_keeps_every_entry():
    load_every_profile(VALID)
    assert_keeps_every_entry(VALID)


def test_an_unknown_attack_an_unknown_option_and_a_negative_tolerance_exit_2_naming_all_three(tmp_path, capsys):
    """The issue's acceptance: one report names all three (before, only the tolerance;
    alone, the unknown attack ran as "not applicable" and exited 0)."""
    text = TINY.replace('attacks = ["alie", "bit_flip"]', 'attacks = ["bitflip", { name = "alie", zz = 1.0 }]')
    path = tiny(tmp_path, text.replace("[benchmark]\n", "[benchmark]\ntolerance = { points = -5 }\n"))
    assert main(["benchmark", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "benchmark.attacks[0]: unknown attack 'bitflip' (did you mean 'bit_flip'?); allowed:" in err
    assert "benchmark.attacks[1]: alie.zz is not an option" in err
    assert "benchmark.tolerance.points: must be a number in [0, 100]" in err
    assert not (tmp_path / "out").exists()  # nothing started


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path of :data:`VALID` down to a scalar, a list or a table."""
    out = [path] if path else []
    if isinstance(value, dict):
        out += [p for key, inner in value.items() for p in _leaves(inner, (*path, key))]
    elif isinstance(value, list):
        out += [p for index, inner in enumerate(value) for p in _leaves(inner, (*path, index))]
    return out


PATHS = _leaves(VALID)
HOSTILE = st.one_of(
    st.sampled_from([DELETE, -1, 0, 1, 2, -0.5, 0.21, 0.7, 1e-9, 10**12, math.nan, math.inf, True, "", "2", "bitflip",
                     "none", "all", "badnets", "$\\frac{1}$", "NA", [], [0], [0.2, 0.2], ["alie"], ["XX"], {},
                     {"name": "bitflip"}, {"label": "x"}, {"points": -1}]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.text(max_size=6),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=HOSTILE)
def test_a_one_leaf_mutation_is_refused_naming_a_field_or_kept_whole(path, value):
    """Any one leaf of the valid file replaced (or removed): a config error whose every
    line names a problem, or a file whose plan keeps every entry; any other exception
    fails the test (pydantic's ValidationError, TypeError, OSError ...)."""
    event(outcome(path, value))


@pytest.mark.parametrize("field", ["clusters", "clients_per_cluster"])
def test_a_huge_cluster_count_is_a_config_error(field):
    """10^12 clusters or clients per cluster: refused naming the task, by arithmetic
    (dealing them would allocate one entry per client first)."""
    with pytest.raises(ConfigError, match="task"):
        parse_benchmark(mutated(("task", field), 10**12), "fuzz.toml")


def outcome(path: tuple[Any, ...], value: Any) -> str:
    """``"refused"`` (a clear config error) or ``"accepted"`` (every entry kept) for
    the file with ``path`` set to ``value``; any other outcome raises."""
    data = mutated(path, value)
    try:
        load_every_profile(data)
        assert_keeps_every_entry(data)
    except ConfigError as error:
        assert_clear(error)
        return "refused"
    return "accepted"


def test_a_plugin_that_does_not_import_names_the_checks_it_skips():
    """The checks that read the registries (a failed plug-in may be what registers a
    name) are named as not checked; the others still report in the same message."""
    data = mutated(("plugins",), ["no_such_plugin_module"])
    data["benchmark"]["tolerance"] = -1
    with pytest.raises(ConfigError) as error:
        parse_benchmark(data, "fuzz.toml")
    text = str(error.value)
    assert "plugins[0]: cannot import 'no_such_plugin_module'" in text
    assert "benchmark.tolerance.points: must be a number in [0, 100]" in text
    assert "not checked because a plug-in did not import (plugins): the attacks' and defenses' names" in text


def test_a_check_skipped_for_an_invalid_task_names_the_files_defenses():
    """The run config's "methods (...) not checked" line, in a benchmark file's report,
    names each defense as the file writes it (it has no ``methods``)."""
    with pytest.raises(ConfigError) as error:
        parse_benchmark(mutated(("task", "clients_per_cluster"), 0), "fuzz.toml")
    lines = str(error.value).splitlines()[1:]
    assert lines[0].strip().startswith("task.clients_per_cluster: ")
    skipped = [line.strip() for line in lines if "not checked" in line]
    assert skipped and all(line.startswith("defenses[") for line in skipped)
    assert not any("methods" in line for line in lines)
