"""Grid files: expansion into cells (Cartesian product, labels, the seed and method
axes, dotted paths, table replacement), cell keys, and bad grids rejected before any
cell runs with the grid field named."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from pathlib import Path

import pytest

from robust_pfl import experiments
from robust_pfl.cli import main
from robust_pfl.config import ConfigError, ExperimentConfig
from robust_pfl.grid_file import Resources, expand_grid, load_grid

pytestmark = pytest.mark.usefixtures("single_thread")

METHODS = [{"name": "fc"}, {"name": "global", "aggregator": "median", "label": "global+median"}]
ATTACKS = [
    {"name": "none"},
    {"name": "large_gradient"},
    {"name": "bit_flip", "label": "bit flip (client 0)", "source": "client"},
]


def base(**changes) -> dict:
    data = {
        "seeds": [0, 1],
        "rounds": 2,
        "task": {"clusters": 2, "clients_per_cluster": 3},
        "methods": [dict(m) for m in METHODS],
        "grid": {"attack": [dict(a) for a in ATTACKS], "byzantine": {"total": [0, 2]}},
    }
    data.update(changes)
    return data


def test_cells_are_the_cartesian_product_in_axis_order():
    grid = expand_grid(base(), "g")
    assert grid.columns == ["method", "seed", "attack", "byzantine.total"]
    attacks = ["none", "large_gradient", "bit flip (client 0)"]
    expected = list(itertools.product(["fc", "global+median"], [0, 1], attacks, [0, 2]))
    assert [tuple(cell.axes.values()) for cell in grid.cells] == expected
    assert len({cell.cell for cell in grid.cells}) == 2 * 2 * 3 * 2
    for cell in grid.cells:
        config = cell.config
        assert config["seeds"] == [cell.axes["seed"]] and len(config["methods"]) == 1
        assert config["byzantine"]["total"] == cell.axes["byzantine.total"]
        assert (cell.n_clients, cell.n_byzantine) == (6 + cell.axes["byzantine.total"], cell.axes["byzantine.total"])


def test_labels_name_values_and_only_a_method_keeps_its_label():
    grid = expand_grid(base(), "g")
    flip = next(c for c in grid.cells if c.axes["attack"] == "bit flip (client 0)")
    assert flip.config["attack"] == {"name": "bit_flip", "source": "client"}  # label removed before applied
    median = next(c for c in grid.cells if c.axes["method"] == "global+median")
    assert median.config["methods"][0]["label"] == "global+median"
    # a table without label or name shows as compact JSON, a scalar as itself
    grid = expand_grid(base(grid={"byzantine": [{"total": 1}, {"per_cluster": 1, "label": "one each"}],
                                  "task": {"dim": [3]}}), "g")
    assert [c.axes["byzantine"] for c in grid.cells[:2]] == ['{"total":1}', "one each"]
    assert grid.cells[0].axes["task.dim"] == 3


def test_grid_seed_and_method_replace_the_base_ones():
    data = base(grid={"seed": [5, 7], "method": [{"name": "local"}, {"name": "ground_truth", "label": "GT"}]})
    grid = expand_grid(data, "g")
    axes = [(c.axes["method"], c.axes["seed"]) for c in grid.cells]
    assert axes == [("local", 5), ("local", 7), ("GT", 5), ("GT", 7)]
    assert [c.config["methods"][0]["name"] for c in grid.cells] == ["local", "local", "ground_truth", "ground_truth"]


def test_dotted_toml_keys_and_tables_are_the_same_axes(tmp_path):
    head = 'seeds = [0]\nrounds = 2\n[task]\nclusters = 2\nclients_per_cluster = 3\n[[methods]]\nname = "global"\n'
    dotted = tmp_path / "dotted.toml"
    dotted.write_text(head + "[grid]\nbyzantine.total = [0, 1]\ntask.dim = [3, 4]\nmethod.lr = [0.1, 0.2]\n")
    tables = tmp_path / "tables.toml"
    tables.write_text(
        head + "[grid.byzantine]\ntotal = [0, 1]\n[grid.task]\ndim = [3, 4]\n[grid.method]\nlr = [0.1, 0.2]\n"
    )
    first, second = load_grid(dotted), load_grid(tables)
    assert first.columns == second.columns == ["method", "seed", "byzantine.total", "task.dim", "method.lr"]
    assert [c.cell for c in first.cells] == [c.cell for c in second.cells]
    set_values = {(c.config["task"]["dim"], c.config["methods"][0]["lr"]) for c in first.cells}
    assert set_values == {(3, 0.1), (3, 0.2), (4, 0.1), (4, 0.2)}


def test_a_table_value_replaces_the_whole_table():
    data = base(attack={"name": "large_gradient", "mean": 5.0}, byzantine={"total": 2, "per_cluster": 1},
                grid={"attack": [{"name": "alie"}], "byzantine": [{"total": 3}]})
    cell = expand_grid(data, "g").cells[0]
    assert cell.config["attack"] == {"name": "alie"}  # no "mean" left from the base table
    assert (cell.config["byzantine"]["total"], cell.config["byzantine"]["per_cluster"]) == (3, 0)


def test_cell_key_is_the_resolved_config_hash_and_ignores_explicit_defaults():
    implicit = expand_grid(base(), "g")
    defaults = {"eval_every": 10, "dtype": "float32", "device": "cpu", "byzantine": {"fraction": 0.0}}
    explicit = expand_grid(base(**defaults), "other source")
    assert [c.cell for c in implicit.cells] == [c.cell for c in explicit.cells]
    for cell in implicit.cells:  # the contract's formula, computed here independently
        dumped = ExperimentConfig.model_validate(cell.config).model_dump(mode="json", exclude={"plugins"})
        dumped["checkpoint_every"] = None  # when state is saved changes no result
        assert cell.cell == hashlib.sha256(json.dumps(dumped, sort_keys=True).encode()).hexdigest()[:16]
    changed = expand_grid(base(rounds=3), "g")
    assert not {c.cell for c in changed.cells} & {c.cell for c in implicit.cells}
    checkpointed = expand_grid(base(checkpoint_every=5), "g")
    assert [c.cell for c in checkpointed.cells] == [c.cell for c in implicit.cells]
    assert all(c.config["checkpoint_every"] == 5 for c in checkpointed.cells)  # still what the cell runs with


def test_resources_are_read_and_checked():
    assert expand_grid(base(resources={"cpus": 2, "gpus": 0.5}), "g").resources == Resources(2.0, 0.5)
    assert Resources(0.5).threads == 1 and Resources(3.0).threads == 3
    with pytest.raises(ConfigError, match=r"resources\.cpu: unknown key \(did you mean 'cpus'\?\)"):
        expand_grid(base(resources={"cpu": 2}), "g")


@pytest.mark.parametrize("field", ["cpus", "gpus"])
@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_non_finite_or_negative_resources_are_refused_naming_the_field(field, value):
    """TOML writes ``inf`` and ``nan``: neither is a CPU count (``int(inf)`` has no
    thread count) nor a reservation Ray can make."""
    with pytest.raises(ConfigError, match=rf"resources\.{field}: must be a finite number >= 0"):
        expand_grid(base(resources={field: value}), "g")


# -- bad grids: rejected before any cell runs, naming the field --------------------------------
BAD = {
    "unknown attack name": (
        '[grid]\nattack = [{ name = "none" }, { name = "alie" }, { name = "bitflip" }]\n',
        "  grid.attack[2].name: unknown attack 'bitflip' (did you mean 'bit_flip'?)",
    ),
    "wrong type inside a list": (
        '[grid]\nbyzantine.total = [0, "two"]\n',
        "  grid.byzantine.total[1]: must be an integer >= 0, got 'two'",
    ),
    "empty list": ("[grid]\nbyzantine.total = []\n", "  grid.byzantine.total: empty list; give at least one value"),
    "unknown path": ("[grid]\nnosuch = [1, 2]\n", "  grid.nosuch: unknown field 'nosuch'"),
    "not a list": ("[grid]\nrounds = 5\n", "  grid.rounds: must be a list of values"),
    "bad method option": ("[grid]\nmethod.lr = [0.1, -1.0]\n", "  grid.method.lr[1]: must be a finite number > 0, got -1.0"),
    "unknown nested path": (
        "[grid]\ntask.kindd = [1]\n",
        "  grid.task.kindd: unknown field 'task.kindd' (did you mean 'kind'?)",
    ),
}
HEAD = 'seeds = [0]\nrounds = 2\n[task]\nclusters = 2\nclients_per_cluster = 3\n[[methods]]\nname = "global"\n'


@pytest.mark.parametrize("case", list(BAD))
def test_bad_grid_fails_before_any_cell_naming_the_field(case, tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(experiments, "run_cell_config", lambda *a, **k: calls.append(a) or [])
    text, line = BAD[case]
    path = tmp_path / "bad.toml"
    path.write_text(HEAD + text)
    out = tmp_path / "out"
    assert main(["grid", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: invalid grid {path}:" in err and line in err
    assert not calls and not out.exists()


def test_base_field_errors_name_the_base_field():
    with pytest.raises(ConfigError) as caught:
        expand_grid(base(rounds=0), "g")
    assert "\n  rounds: must be an integer >= 1, got 0" in str(caught.value)
    with pytest.raises(ConfigError, match=r"\n  seeds\[1\]: the same value as seeds\[0\]"):
        expand_grid(base(seeds=[1, 1]), "g")
    methods = [{"name": "fc"}, {"name": "nope"}]
    with pytest.raises(ConfigError, match=r"\n  methods\[1\]\.name: unknown method 'nope'"):
        expand_grid(base(methods=methods), "g")


def test_an_error_from_two_axes_names_the_field_and_the_client_count():
    """Krum with f = 2 needs N > 6: the cells with 2 Byzantine clients (N = 8) pass,
    those without (N = 6) fail; the message names the method and N."""
    methods = [{"name": "global", "aggregator": {"name": "krum", "f": 2}}]
    with pytest.raises(ConfigError) as caught:
        expand_grid(base(methods=methods), "g")
    lines = str(caught.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].startswith("  methods[0].aggregator: ") and "N = 6 clients" in lines[0]


def test_cells_that_differ_only_by_label_are_refused():
    grid = {"attack": [{"name": "none"}, {"name": "none", "label": "again"}]}
    with pytest.raises(ConfigError, match=r"grid\.attack\[1\]: gives the same run as grid\.attack\[0\]"):
        expand_grid(base(grid=grid), "g")
    with pytest.raises(ConfigError, match=r"grid\.attack\[1\]: shows as 'alie' in results, as grid\.attack\[0\] does"):
        expand_grid(base(grid={"attack": [{"name": "alie"}, {"name": "alie", "z": 1.0}]}), "g")


def test_shipped_attack_table_grids_load():
    configs = Path(__file__).resolve().parents[1] / "configs"
    synthetic = load_grid(configs / "attack_table.toml")
    digits = load_grid(configs / "attack_table_digits.toml")
    assert synthetic.columns == digits.columns == ["method", "seed", "attack"]
    assert "label_flip" in {c.axes["attack"] for c in digits.cells}
    assert {c.config["task"]["name"] for c in digits.cells} == {"image"}
