"""Grids ship their plug-ins with each cell's task (issue 30, item 3): a new attack and a
new aggregator written in a folder outside the package, named by a grid file's
``plugins``, pass their conformance checks and run on the local backend (in-process and
in a pool of worker processes) and on Ray with identical results; workers that lack
the plug-in files (a cluster node) or the grid process's ``sys.path`` import the source
text shipped with the task."""

from __future__ import annotations

import importlib
import linecache
import shutil
import sys
import textwrap
from pathlib import Path

import pandas
import pytest

import attacks
import defenses
from robust_pfl.backends import LocalBackend
from robust_pfl.cli import main
from robust_pfl.config import ConfigError
from robust_pfl.grid import run_grid
from robust_pfl.grid_file import load_grid
from robust_pfl.plugins import SOURCE_ATTRIBUTE, install_sources, load_plugins, shipped_sources

pytestmark = pytest.mark.usefixtures("single_thread")

ATTACK = textwrap.dedent('''
    """Every Byzantine row: the first honest sender's row plus a constant."""
    import dataclasses

    import torch

    import attacks


    @attacks.register
    @dataclasses.dataclass(frozen=True)
    class FirstRowPlus(attacks.AttackBase):
        """The first honest row shifted by ``shift`` in every coordinate (zeros plus
        ``shift`` when every sender is Byzantine)."""

        name = "{name}"
        summary = "the first honest row plus a constant"
        needs = frozenset({{"omniscient"}})
        reads_own_rows = False
        shift: float = 1.0

        def __call__(self, messages: torch.Tensor, context) -> torch.Tensor:
            rows = int(context.byzantine.sum())
            honest = messages[..., ~context.byzantine, :]
            if honest.shape[-2] == 0:
                first = messages.new_zeros(*messages.shape[:-2], 1, messages.shape[-1])
            else:
                first = honest[..., :1, :]
            return (first + self.shift).expand(*messages.shape[:-2], rows, messages.shape[-1]).clone()
''')

AGGREGATOR = textwrap.dedent('''
    """The coordinate-wise mean of the half of the rows closest to the median."""
    import dataclasses
    from typing import ClassVar

    import torch

    import defenses


    @defenses.register_aggregator
    @dataclasses.dataclass(frozen=True)
    class NearMedianMean(defenses.Aggregator):
        """The mean of the ceil(n/2) admissible rows nearest (Euclidean) to the
        coordinate-wise median of the admissible rows (ties: the earlier row)."""

        name: ClassVar[str] = "{name}"
        summary: ClassVar[str] = "mean of the half of the rows nearest the coordinate-wise median"
        reference: ClassVar[str] = "a test plug-in"

        def aggregate_rows(self, rows, previous, generator):
            values, admissible, count = rows
            masked = torch.where(admissible.unsqueeze(-1), values, torch.nan)
            median = torch.nan_to_num(torch.nanmedian(masked, dim=-2).values)  # [..., d]
            distance = torch.linalg.vector_norm(values - median.unsqueeze(-2), dim=-1)  # [..., N]
            largest = torch.finfo(values.dtype).max
            key = torch.where(admissible, torch.nan_to_num(distance, nan=largest, posinf=largest), torch.inf)
            order = torch.sort(key, dim=-1, stable=True).indices
            rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1]).expand_as(order))
            keep = admissible & (rank < ((count + 1) // 2).unsqueeze(-1))
            kept = torch.where(keep.unsqueeze(-1), values, torch.zeros_like(values))
            return kept.sum(-2) / keep.sum(-1, keepdim=True).clamp_min(1).to(values.dtype)
''')

GRID = textwrap.dedent('''
    plugins = {plugins}
    seeds = [0]
    rounds = 4
    eval_every = 2

    [task]
    clusters = 2
    clients_per_cluster = 3

    [byzantine]
    total = 1

    [[methods]]
    name = "fc"
    lr = 0.05

    [[methods]]
    name = "global"
    aggregator = "{aggregator}"
    lr = 0.05
    label = "global+near_median"

    [grid]
    attack = [{{ name = "none" }}, {{ name = "{attack}", shift = 5.0 }}]
''')


class Plugins:
    """A folder outside the package holding a plug-in attack and aggregator (module
    and registered names made unique by ``tag``) and a grid file naming both."""

    def __init__(self, folder: Path, tag: str) -> None:
        self.folder, self.tag = folder, tag
        self.attack, self.aggregator = f"first_row_plus_{tag}", f"near_median_mean_{tag}"
        self.attack_module, self.aggregator_module = f"grid_plugin_attack_{tag}", f"grid_plugin_aggregator_{tag}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{self.attack_module}.py").write_text(ATTACK.format(name=self.attack))
        (folder / f"{self.aggregator_module}.py").write_text(AGGREGATOR.format(name=self.aggregator))

    def grid_file(self, plugins: list[str]) -> Path:
        path = self.folder / "grid.toml"
        path.write_text(GRID.format(plugins=repr(plugins).replace("'", '"'), aggregator=self.aggregator,
                                    attack=self.attack))
        return path

    def path_plugins(self) -> list[str]:
        return [f"{self.attack_module}.py", f"{self.aggregator_module}.py"]

    def unregister(self) -> None:
        attacks.REGISTRY.pop(self.attack, None)
        defenses.AGGREGATORS.pop(self.aggregator, None)
        for module in (self.attack_module, self.aggregator_module):
            sys.modules.pop(module, None)


@pytest.fixture
def make_plugins(tmp_path_factory):
    """Writes :class:`Plugins` folders; every registration and module is undone after
    the test, so no other test sees them."""
    made: list[Plugins] = []

    def make(tag: str) -> Plugins:
        made.append(Plugins(tmp_path_factory.mktemp(f"user_plugins_{tag}"), tag))
        return made[-1]

    yield make
    for plugins in made:
        plugins.unregister()


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray instance with 2 CPUs for the module (``--backend ray`` reuses a
    connection the caller opened); shut down afterwards, so its workers, which hold
    the plug-ins they imported, go with it.  A connection already open is reused."""
    ray = pytest.importorskip("ray", reason="the Ray backend needs Ray: pip install 'robust-pfl[ray]'")
    if ray.is_initialized():
        yield ray
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def comparable(frame: pandas.DataFrame) -> pandas.DataFrame:
    """Rows in a fixed order, wall-clock values removed."""
    frame = frame.copy()
    frame.loc[frame["metric"] == "cell_seconds", "value"] = float("nan")
    return frame.sort_values(["cell", "metric", "round"]).reset_index(drop=True)


def assert_expected_cells(out: Path, grid_path: Path, plugins: Plugins) -> pandas.DataFrame:
    """``out/results.csv`` holds every cell of the grid, each finished without error,
    with the plug-ins' names in its axis columns."""
    frame = pandas.read_csv(out / "results.csv")
    expected = {cell.cell for cell in load_grid(grid_path).cells}
    assert set(frame["cell"]) == expected and len(expected) == 4
    assert set(frame["status"]) == {"ok"}, frame.loc[frame["status"] != "ok", "error"].tolist()
    assert set(frame["attack"]) == {"none", plugins.attack}
    assert set(frame["method"]) == {"fc", "global+near_median"}
    assert {"test_loss", "cell_seconds"} <= set(frame["metric"])
    return frame


def test_the_plugins_meet_the_attack_and_aggregator_contracts(make_plugins):
    plugins = make_plugins("contract")
    load_plugins([str(plugins.folder / name) for name in plugins.path_plugins()])
    attacks.check_attack(attacks.REGISTRY[plugins.attack])
    attacks.check_attack(attacks.REGISTRY[plugins.attack](shift=-3.0))
    defenses.check_aggregator(defenses.AGGREGATORS[plugins.aggregator])
    defenses.check_aggregator(plugins.aggregator)
    # the aggregator does what it says: 5 rows, the 3 nearest the median averaged
    import torch

    rows = torch.tensor([[0.0], [1.0], [2.0], [3.0], [100.0]])
    assert defenses.AGGREGATORS[plugins.aggregator]()(rows).item() == pytest.approx(2.0)


def test_a_plugin_grid_gives_the_same_results_on_the_local_and_ray_backends(make_plugins, ray_instance, monkeypatch,
                                                                           tmp_path_factory):
    plugins = make_plugins("backends")
    grid_path = plugins.grid_file(plugins.path_plugins())  # paths relative to the grid file
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    out = plugins.folder / "out"
    assert main(["grid", str(grid_path), "--backend", "local", "--out", str(out / "local")]) == 0
    assert main(["grid", str(grid_path), "--backend", "ray", "--out", str(out / "ray")]) == 0
    assert ray_instance.is_initialized()  # the caller's connection was reused

    local = assert_expected_cells(out / "local", grid_path, plugins)
    on_ray = assert_expected_cells(out / "ray", grid_path, plugins)
    pandas.testing.assert_frame_equal(comparable(local), comparable(on_ray), check_exact=True)
    attacked = local[(local["attack"] == plugins.attack) & (local["metric"] == "test_loss")]
    clean = local[(local["attack"] == "none") & (local["metric"] == "test_loss")]
    assert not attacked["value"].reset_index(drop=True).equals(clean["value"].reset_index(drop=True))


def test_workers_without_the_plugin_files_or_the_grid_sys_path_run_the_shipped_source(
        make_plugins, ray_instance, monkeypatch):
    """A cluster node: the attack file is gone once the grid is loaded, and the
    aggregator is a module found on the grid process's ``sys.path`` only (Ray workers
    do not inherit it).  Ray workers and pool workers import the shipped text, and
    every backend stores the in-process run's results."""
    from robust_pfl.ray_backend import RayBackend

    plugins = make_plugins("shipped")
    monkeypatch.syspath_prepend(str(plugins.folder))
    grid_path = plugins.grid_file([f"{plugins.attack_module}.py", plugins.aggregator_module])
    grid = load_grid(grid_path)  # imports the plug-ins in this process
    moved = plugins.folder.parent / f"{plugins.folder.name}_moved"
    moved.mkdir()
    shutil.move(plugins.folder / f"{plugins.attack_module}.py", moved / "attack.py")
    assert not (plugins.folder / f"{plugins.attack_module}.py").exists()

    out = plugins.folder / "out"
    run_grid(grid, out / "in_process", progress=False)
    pool = LocalBackend(jobs=2)
    try:
        run_grid(grid, out / "pool", pool, progress=False)
    finally:
        pool.close()
    run_grid(grid, out / "ray", RayBackend(), progress=False)

    reference = comparable(assert_expected_cells(out / "in_process", grid_path, plugins))
    for backend in ("pool", "ray"):
        frame = assert_expected_cells(out / backend, grid_path, plugins)
        pandas.testing.assert_frame_equal(reference, comparable(frame), check_exact=True)


def test_shipped_sources_are_what_this_process_imported(make_plugins, monkeypatch):
    plugins = make_plugins("texts")
    attack_path = plugins.folder / f"{plugins.attack_module}.py"
    monkeypatch.syspath_prepend(str(plugins.folder))
    entries = [str(attack_path), plugins.aggregator_module, "json", "attacks.base"]
    load_plugins(entries)
    executed = attack_path.read_text()
    attack_path.write_text("raise RuntimeError('edited after the grid was loaded')\n")

    shipped = shipped_sources(entries)
    # the .py path and the single-file module; packages and submodules are imported by name
    assert [(s.index, s.module) for s in shipped] == [(0, plugins.attack_module), (1, plugins.aggregator_module)]
    assert shipped[0].text == executed and shipped[0].origin == str(attack_path)
    assert shipped[1].text == (plugins.folder / f"{plugins.aggregator_module}.py").read_text()
    assert shipped_sources(None) == () and shipped_sources([]) == ()


def test_install_sources_registers_the_plugins_where_the_files_and_path_are_missing(make_plugins, monkeypatch):
    plugins = make_plugins("install")
    attack_path = plugins.folder / f"{plugins.attack_module}.py"
    monkeypatch.syspath_prepend(str(plugins.folder))
    entries = [str(attack_path), plugins.aggregator_module]
    load_plugins(entries)
    shipped = shipped_sources(entries)

    plugins.unregister()  # a fresh worker on another machine: nothing imported,
    shutil.rmtree(plugins.folder)  # no file,
    monkeypatch.undo()  # and not the grid process's sys.path
    importlib.invalidate_caches()
    with pytest.raises(ConfigError, match=r"plugins\[0\]: cannot import .*no such file"):
        load_plugins(entries)

    install_sources(shipped, "g.toml cell x")
    assert plugins.attack in attacks.REGISTRY and plugins.aggregator in defenses.AGGREGATORS
    module = sys.modules[plugins.attack_module]
    assert module.__file__ == str(attack_path) and getattr(module, SOURCE_ATTRIBUTE) == shipped[0].text
    assert "class FirstRowPlus" in "".join(linecache.getlines(str(attack_path)))  # tracebacks show its lines
    load_plugins(entries)  # what the cell's config parse then does: both found imported
    install_sources(shipped)  # a worker's next cell: imported once, not registered twice


def test_a_shipped_plugin_that_fails_is_a_config_error_naming_its_entry(make_plugins):
    plugins = make_plugins("broken")
    path = plugins.folder / "broken_plugin_grid.py"
    path.write_text("raise RuntimeError('not on this node')\n")
    shipped = shipped_sources(["json", str(path)])
    path.unlink()
    with pytest.raises(ConfigError, match=r"invalid config g\.toml:\n  plugins\[1\]: cannot import .*broken_plugin_grid"
                                          r"\.py' \(shipped with the cell\) \(RuntimeError: not on this node\)"):
        install_sources(shipped, "g.toml")
    assert "broken_plugin_grid" not in sys.modules
