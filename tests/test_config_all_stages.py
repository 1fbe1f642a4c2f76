"""One report for every stage of a config's checks (issue 44): plug-in imports, the
schema's fields, its checks across tables, and the registry checks of methods and
attacks (with theirs across them) all run on what the stages before left valid, and
their problems come back in one ConfigError naming each bad field once.  Before, each
stage raised on its own and a config with three mistakes took three reruns."""

from __future__ import annotations

import copy
import re
import textwrap
import tomllib
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import robust_pfl
from robust_pfl.cli import main
from robust_pfl.config import ConfigError, check_config, load_config, merged_problems, parse_config
from robust_pfl.experiments import load_and_validate, parse_and_validate
from robust_pfl.grid_file import expand_grid

BASE: dict[str, Any] = {
    "rounds": 2,
    "task": {"clusters": 2, "clients_per_cluster": 3},
    "methods": [{"name": "fc"}, {"name": "local"}, {"name": "global", "label": "g"}],
}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mistake: ``value`` written at the dotted ``path`` (``methods.0.lr``)."""
    *parents, last = path.split(".")

    def apply(data: dict[str, Any]) -> None:
        for part in parents:
            data = data[int(part)] if part.isdigit() else data.setdefault(part, {})
        data[int(last) if last.isdigit() else last] = value

    return apply


#: Mistakes no check of another one reads (none of them touches what another's check
#: reads), by the one field the report must name for each: the schema's fields, an
#: unknown key, the registry's method and attack checks and the checks across methods.
MISTAKES: dict[str, Callable[[dict[str, Any]], None]] = {
    "rounds": _set("rounds", 0),  # schema, top level
    "roundz": _set("roundz", 5),  # schema, unknown key
    "dtype": _set("dtype", "float16"),  # schema, a choice
    "task.dim": _set("task.dim", 0),  # schema, a table
    "byzantine.total": _set("byzantine.total", -1),  # schema, another table
    "attack": _set("attack", {"name": "large_gradient", "std": -1.0}),  # registry: an attack option
    "methods[0].lr": _set("methods.0.lr", -1.0),  # registry: a method option
    "methods[1].name": _set("methods.1.name", "no_such_method"),  # registry: a method name
    "methods": _set("methods.2.label", "fc"),  # across methods: labels must be unique
    "theory.estimate": _set("theory", {"estimate": ["momentum"]}),  # across: no method sends momenta
}


def with_mistakes(names: list[str]) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for name in names:
        MISTAKES[name](data)
    return data


#: A line naming a check not run (``  attack.name not checked: <why>``), the check's
#: field in group 1; a grid puts the cell's field before it (``  methods[0]: ...``).
SKIPPED = re.compile(r"  (?:[\w.\[\]]+: )?([\w.\[\]]+)(?: \([^)]*\))? not checked: (.+)")


def named_fields(error: ConfigError) -> list[str]:
    """The field each problem line of a config error names (``  field: message``); the
    lines naming skipped checks (:func:`skipped_fields`) are not problems."""
    lines = [line for line in str(error).splitlines()[1:] if not SKIPPED.fullmatch(line)]
    assert all(line.startswith("  ") and ": " in line for line in lines), lines
    return [line.strip().split(": ", 1)[0] for line in lines]


def skipped_fields(error: ConfigError) -> dict[str, str]:
    """The field of each check a config error says was not run -> why."""
    return {match[1]: match[2] for line in str(error).splitlines()[1:] if (match := SKIPPED.fullmatch(line))}


def reported(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_and_validate(data)
    return named_fields(info.value)


def skipped(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_and_validate(data)
    return skipped_fields(info.value)


def test_the_base_config_is_valid():
    """Without the mistakes nothing is reported (so each line below is a mistake's)."""
    assert parse_and_validate(copy.deepcopy(BASE)).methods[2].label == "g"


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_single_mistake_names_exactly_its_field(name):
    assert reported(with_mistakes([name])) == [name]


@settings(max_examples=60, deadline=None)
@given(st.sets(st.sampled_from(sorted(MISTAKES)), min_size=1))
def test_any_set_of_independent_mistakes_is_reported_exactly_each_once(names):
    """Whatever stages the mistakes fall in, one error names each bad field once and
    nothing else."""
    fields = reported(with_mistakes(sorted(names)))
    assert sorted(fields) == sorted(names)


def test_mistakes_in_three_stages_are_one_error():
    """A bad field (the schema's fields), Byzantine clusters that do not exist (the
    schema's cross-check, which pydantic runs only once every field is valid), and a
    bad method option and attack option (the registries)."""
    data = copy.deepcopy(BASE)
    data.update(rounds=0, byzantine={"total": 1, "clusters": [5]},
                attack={"name": "large_gradient", "std": -1.0})
    data["methods"][0]["lr"] = -1.0
    assert reported(data) == ["rounds", "byzantine.clusters", "methods[0].lr", "attack"]


def test_an_unknown_attack_a_bad_lr_and_a_failed_cross_check_together():
    data = copy.deepcopy(BASE)
    data["byzantine"] = {"total": 1}
    data["attack"] = {"name": "no_such_attack"}
    data["methods"][0]["lr"] = -1.0
    data["methods"][2]["aggregator"] = {"name": "krum", "f": 3}  # krum needs n > 2f + 2; N = 7
    fields = reported(data)
    assert sorted(fields) == ["attack.name", "methods[0].lr", "methods[2].aggregator"]


def test_a_check_reading_a_refused_part_is_skipped_not_judging_its_default():
    """A bad image task is replaced by the default (synthetic) task for the later
    stages; the label-flip attack, which needs an image task, must not be reported
    against that default, while the bad method option beside it still is."""
    data = {"task": {"name": "image", "clusters": 0}, "attack": {"name": "label_flip"},
            "methods": [{"name": "fc", "lr": -1.0}]}
    assert reported(data) == ["task.clusters", "methods[0].lr"]
    assert skipped(data) == {"attack.name": "task is invalid"}  # and the report says so


# -- each field once ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data, field",
    [
        # the plug-in imports and the schema both refuse a `plugins` that is not a list
        ({"plugins": 5, "methods": [{"name": "fc"}]}, "plugins"),
        # the schema (too few clusters to compare) and the registries (fc sends no momenta)
        ({"task": {"clusters": 1}, "theory": {"estimate": ["momentum"]}, "methods": [{"name": "fc"}]},
         "theory.estimate"),
    ],
    ids=["plugins", "theory-estimate"],
)
def test_a_field_two_stages_refuse_is_named_once(data, field):
    assert reported(data) == [field]


def test_every_failing_plugin_is_named_with_the_schema_s_problems():
    """Every entry of ``plugins`` is tried; the names a failed plug-in may register are
    not called unknown, the other mistakes are reported."""
    data = {"plugins": ["no_such_module_a", 7, "no_such_module_b"], "rounds": 0, "attack": {"name": "theirs"},
            "methods": [{"name": "theirs_too"}, {"name": "fc", "lr": -1.0}]}
    assert reported(data) == ["plugins[0]", "plugins[1]", "plugins[2]", "rounds", "methods[1].lr"]
    assert skipped(data) == {"methods[0].name": "the plug-ins did not load", "attack.name": "the plug-ins did not load"}


# -- skipped checks are named (issue 55) --------------------------------------------------------
def test_a_misspelt_plugin_an_unknown_attack_and_a_bad_field_are_one_report(tmp_path):
    """The acceptance case: the plug-in error and the independent mistake are reported,
    and the attack's name, which the plug-in might have registered, is named as not
    checked; once the path is right (a plug-in registering nothing) the same report
    names the unknown attack, so the first one said what the next run would check."""
    # a name no other test imports: a plug-in stays in sys.modules for the worker's later tests
    (tmp_path / "stage_check_plugin.py").write_text("# registers nothing\n")
    data = {"plugins": ["stage_check_plugn.py"], "attack": {"name": "bitflip"}, "rounds": 0, "methods": [{"name": "fc"}]}
    with pytest.raises(ConfigError) as info:
        parse_and_validate(data, base_dir=tmp_path)
    assert named_fields(info.value) == ["plugins[0]", "rounds"]
    assert skipped_fields(info.value) == {"attack.name": "the plug-ins did not load"}
    assert "stage_check_plugn.py" in str(info.value)
    data["plugins"] = ["stage_check_plugin.py"]
    with pytest.raises(ConfigError) as info:
        parse_and_validate(data, base_dir=tmp_path)
    assert named_fields(info.value) == ["rounds", "attack.name"] and skipped_fields(info.value) == {}
    assert "bitflip" in str(info.value)


def test_a_known_attack_is_still_checked_when_a_plugin_fails():
    """A name the registry knows does not depend on the plug-ins: its options are
    judged, and nothing is called skipped."""
    data = {"plugins": ["no_such_module"], "attack": {"name": "large_gradient", "std": -1.0},
            "methods": [{"name": "fc"}]}
    assert reported(data) == ["plugins[0]", "attack"]
    assert skipped(data) == {}


def test_a_skipped_check_of_a_field_already_reported_or_unset_is_not_named():
    """The attack table itself refused (no line for its name: its own problem comes
    first); Byzantine clusters and [theory] left unset (their checks across the task
    judge nothing)."""
    data = {"plugins": ["no_such_module"], "attack": {"name": 5}, "task": {"clusters": 0},
            "methods": [{"name": "fc", "lr": -1.0}]}
    assert reported(data) == ["plugins[0]", "task.clusters", "attack.name", "methods[0].lr"]
    assert not {"attack.name", "byzantine.clusters", "theory.estimate"} & set(skipped(data))


def test_a_check_across_tables_skipped_for_a_refused_task_is_named():
    """``byzantine.clusters`` is compared with ``task.clusters``; with the task refused
    the comparison does not run, and the report says so."""
    data = {"task": {"clusters": 2, "clients_per_cluster": 3, "dim": 0},
            "byzantine": {"total": 1, "clusters": [5]}, "methods": [{"name": "fc"}]}
    assert reported(data) == ["task.dim"]
    assert skipped(data)["byzantine.clusters"] == "task is invalid"
    data["task"]["dim"] = 2  # the task fixed: the comparison runs and finds the mistake
    assert reported(data) == ["byzantine.clusters"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["a", "b", "c.d", "e[0]", ""]),
                                   st.sampled_from(["x", "y", "z"])), max_size=6), max_size=4))
def test_merged_problems_name_each_field_once_from_the_earliest_stage(stages):
    merged = merged_problems(*stages)
    fields = [where for where, _ in merged if where]
    assert len(fields) == len(set(fields))
    assert set(fields) == {where for stage in stages for where, _ in stage if where}
    for where, message in merged:
        if not where:
            continue
        first = next(stage for stage in stages if any(w == where for w, _ in stage))
        assert message.split("; ") == list(dict.fromkeys(m for w, m in first if w == where))
    unnamed = [message for where, message in merged if not where]
    assert unnamed == list(dict.fromkeys(m for stage in stages for w, m in stage if not w))


# -- every entry point ---------------------------------------------------------------------------
THREE = textwrap.dedent("""\
    rounds = 0
    [task]
    clusters = 2
    clients_per_cluster = 3
    [attack]
    name = "large_gradient"
    std = -1.0
    [[methods]]
    name = "fc"
    lr = -1.0
""")


def test_the_command_line_exits_2_and_prints_all_three(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(THREE)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: invalid config {path}:\n")
    assert skipped_fields(ConfigError(err.rstrip("\n"))) == {}  # none: each mistake is its own part's
    assert named_fields(ConfigError(err.removeprefix("error: ").rstrip("\n"))) == ["rounds", "methods[0].lr", "attack"]
    assert not (tmp_path / "out").exists()


def test_a_file_a_dict_and_robust_pfl_run_report_the_same(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(THREE)
    data = tomllib.loads(THREE)
    messages = []
    for call in (lambda: load_and_validate(path), lambda: parse_and_validate(data), lambda: robust_pfl.run(data)):
        with pytest.raises(ConfigError) as info:
            call()
        messages.append(str(info.value).split("\n", 1)[1])
    assert messages[0] == messages[1] == messages[2]
    assert named_fields(ConfigError("header\n" + messages[0])) == ["rounds", "methods[0].lr", "attack"]


def test_load_config_alone_reports_its_stages_together(tmp_path):
    """``load_config`` (no registry checks) names every schema problem and the
    cross-checks of the parts that are valid, in one error."""
    path = tmp_path / "bad.toml"
    path.write_text('rounds = 0\n[byzantine]\nclusters = [9]\n[[methods]]\nname = "fc"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert named_fields(info.value) == ["rounds", "byzantine.clusters"]
    assert parse_config({"methods": [{"name": "fc"}]}).rounds == 100
    assert check_config({"methods": [{"name": "fc"}]}).problems == []


def test_a_grid_reports_its_own_problems_and_its_cells_together():
    """A bad ``[resources]`` key, a bad base field of every cell and a bad element of an
    axis: one error, each once (however many cells share it)."""
    grid = {
        "seeds": [0, 1],
        "rounds": 2,
        "task": {"clusters": 2, "clients_per_cluster": 3, "dim": 0},
        "methods": [{"name": "fc"}, {"name": "local"}],
        "resources": {"cpuz": 1},
        "grid": {"attack": [{"name": "none"}, {"name": "large_gradient", "std": -1.0}]},
    }
    with pytest.raises(ConfigError) as info:
        expand_grid(grid, "<dict>")
    fields = named_fields(info.value)
    assert sorted(fields) == ["grid.attack[1]", "resources.cpuz", "task.dim"]


def test_a_grid_field_its_own_check_named_is_not_named_again_by_a_cell():
    """Two equal elements of the method axis: the axis check says so, and the cells
    they make (the same run twice) are not reported at that element again."""
    grid = {"rounds": 2, "task": {"clusters": 2, "clients_per_cluster": 3},
            "methods": [{"name": "local"}, {"name": "local"}]}
    with pytest.raises(ConfigError) as info:
        expand_grid(grid, "<dict>")
    assert named_fields(info.value) == ["methods[1]"]
