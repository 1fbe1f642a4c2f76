"""Plug-ins (robust_pfl.plugins): a user's module named in a run or grid file registers
its attack before the file is validated, from a .py path relative to the file or a
module name; a module that fails to import is a config error naming the key."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import attacks
import robust_pfl
from robust_pfl.cli import main
from robust_pfl.config import ConfigError, load_config

pytestmark = pytest.mark.usefixtures("single_thread")

PLUGIN = textwrap.dedent('''
    """A user's attack in its own file."""
    import dataclasses

    import attacks


    @attacks.register
    @dataclasses.dataclass(frozen=True)
    class PluginScaled(attacks.AttackBase):
        """Every Byzantine row: minus ``scale`` times the mean honest message."""

        name = "{name}"
        summary = "minus scale times the honest mean"
        needs = frozenset()
        scale: float = 3.0

        def __call__(self, messages, context):
            rows = int(context.byzantine.sum())
            mean = messages.mean(dim=-2, keepdim=True)
            return (-self.scale * mean).expand(*messages.shape[:-2], rows, messages.shape[-1])
''')

RUN = textwrap.dedent('''
    plugins = ["{plugin}"]
    seeds = [0]
    rounds = 2
    eval_every = 1
    [task]
    clusters = 2
    clients_per_cluster = 3
    [byzantine]
    total = 1
    [attack]
    name = "{name}"
    scale = 4.0
    [[methods]]
    name = "global"
    lr = 0.01
''')


@pytest.fixture
def plugin_file(tmp_path):
    """A plug-in file beside a run file that names it by a relative path; the
    registration is undone afterwards."""
    name = f"plugin_scaled_{tmp_path.name[-8:]}".replace("-", "_")
    (tmp_path / "my_attack.py").write_text(PLUGIN.format(name=name))
    yield tmp_path, name
    attacks.REGISTRY.pop(name, None)
    sys.modules.pop("my_attack", None)


def test_a_run_file_names_a_plugin_attack_by_a_path_beside_it(plugin_file, monkeypatch, tmp_path_factory):
    folder, name = plugin_file
    config_path = folder / "run.toml"
    config_path.write_text(RUN.format(plugin="my_attack.py", name=name))
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))  # relative to the file, not the cwd
    config = load_config(config_path)
    assert config.plugins == [str(folder / "my_attack.py")] and config.attack.name == name
    assert main(["run", str(config_path), "--out", str(folder / "out")]) == 0
    assert (folder / "out" / "summary.json").exists()


def test_a_grid_file_names_a_plugin_attack(plugin_file):
    folder, name = plugin_file
    grid_path = folder / "grid.toml"
    text = RUN.format(plugin="my_attack.py", name=name).replace("[attack]\n", "").replace(
        f'name = "{name}"\nscale = 4.0\n', "")
    grid_path.write_text(text + f'\n[grid]\nattack = [{{ name = "none" }}, {{ name = "{name}", scale = 4.0 }}]\n')
    assert main(["grid", str(grid_path), "--out", str(folder / "grid_out"), "--jobs", "2"]) == 0  # worker processes
    frame = pd.read_csv(folder / "grid_out" / "results.csv")
    assert set(frame["attack"]) == {"none", name} and set(frame["status"]) == {"ok"}


def test_a_dict_names_a_plugin_module_on_the_path(plugin_file, monkeypatch):
    folder, name = plugin_file
    monkeypatch.syspath_prepend(str(folder))
    data = load_config_dict(name, "my_attack")
    frame = robust_pfl.run(data)
    assert len(frame) > 0


def load_config_dict(name: str, plugin: str) -> dict:
    return {"plugins": [plugin], "seeds": [0], "rounds": 2, "eval_every": 1,
            "task": {"clusters": 2, "clients_per_cluster": 3}, "byzantine": {"total": 1},
            "attack": {"name": name}, "methods": [{"name": "global", "lr": 0.01}]}


def test_a_plugin_that_fails_to_import_is_a_config_error_naming_the_key(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('not today')\n")
    with pytest.raises(ConfigError, match=r"plugins\[0\]: cannot import .*broken\.py.*RuntimeError: not today"):
        robust_pfl.run(load_config_dict("none", str(tmp_path / "broken.py")))
    with pytest.raises(ConfigError, match=r"plugins\[0\]: cannot import 'no_such_module_xyz'"):
        robust_pfl.run(load_config_dict("none", "no_such_module_xyz"))
    with pytest.raises(ConfigError, match=r"plugins\[1\]: must be a module name"):
        robust_pfl.run({**load_config_dict("none", "json"), "plugins": ["json", 3]})
    with pytest.raises(ConfigError, match=r"plugins\[0\]: cannot import .*missing\.py"):
        robust_pfl.run(load_config_dict("none", str(tmp_path / "missing.py")))


def test_installed_entry_points_are_loaded_once(monkeypatch):
    """A package's ``robust_pfl.plugins`` entry points are imported at the first config
    parsed, once per process."""
    from robust_pfl import plugins

    loaded = []

    class FakePoint:
        name = "fake"

        def load(self):
            loaded.append(self.name)

    monkeypatch.setattr(plugins, "entry_points", lambda group: [FakePoint()] if group == plugins.ENTRY_POINT_GROUP else [])
    plugins.load_entry_points.cache_clear()
    try:
        robust_pfl.run(load_config_dict("none", "json"))
        robust_pfl.run(load_config_dict("none", "json"))
        assert loaded == ["fake"]
    finally:
        plugins.load_entry_points.cache_clear()


def test_a_cells_key_does_not_depend_on_where_its_names_came_from():
    """Grid stores written before plug-ins existed keep their keys: ``plugins`` is not
    part of a cell's identity."""
    from robust_pfl.config import parse_config
    from robust_pfl.grid_file import cell_key

    data = load_config_dict("none", "json")
    without = {key: value for key, value in data.items() if key != "plugins"}
    assert cell_key(parse_config(data)) == cell_key(parse_config(without))
