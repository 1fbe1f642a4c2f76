"""The device helpers of :mod:`robust_pfl.engine.devices` on the CPU: one comparison that
reads ``cuda`` as the current CUDA device, ``auto`` resolution, default memory
budgets, the engine switch, and ``--device`` on every command that runs work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import defenses
from robust_pfl.engine import devices
from robust_pfl.cli import main
from robust_pfl.config import ConfigError, load_config, parse_config
from robust_pfl.engine.devices import describe_device, engine, memory_budget_mb, resolve_device, same_device, using_engine
from robust_pfl.experiments import validate
from robust_pfl.grid_file import Grid, GridCell, Resources, load_grid
from test_defense_conformance import make_federation, make_task  # the conformance suite's small task

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("cpu", "cpu", True),
        ("cpu", "cpu:0", True),
        ("cpu", torch.device("cpu"), True),
        ("cuda:0", "cuda:1", False),
        ("cpu", "cuda:0", False),
        ("meta", "cpu", False),
    ],
)
def test_same_device_compares_type_and_index(a, b, same):
    assert same_device(a, b) is same
    assert same_device(b, a) is same


def test_plain_cuda_is_the_current_cuda_device(monkeypatch):
    """``torch.device("cuda") != torch.device("cuda:0")``, but both name device 0 while
    it is current: the comparison whose absence crashed the first CUDA round."""
    assert torch.device("cuda") != torch.device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert same_device("cuda", "cuda:0")
    assert not same_device("cuda", "cuda:1")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert same_device("cuda", "cuda:1") and not same_device("cuda", "cuda:0")


def test_auto_resolves_to_cuda_only_where_cuda_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("auto") == torch.device("cuda:1")


def test_a_card_has_one_name(monkeypatch):
    """``cuda`` resolves to the current card's index, so a grid cell on ``cuda`` and
    one on ``cuda:0`` (device 0 current) are one run with one key."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("cuda") == resolve_device("cuda:0") == torch.device("cuda:0")
    assert resolve_device("cuda:1") == torch.device("cuda:1")


def test_absent_devices_are_refused_naming_what_exists(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"2 CUDA device\(s\): cuda:0..cuda:1"):
        resolve_device("cuda:2")


@pytest.fixture
def fresh_cuda_reading():
    """The per-process reading of a card's memory, emptied before and after (the
    faked readings must not reach other tests)."""
    devices.available_cuda_bytes.cache_clear()
    yield
    devices.available_cuda_bytes.cache_clear()


@pytest.mark.usefixtures("fresh_cuda_reading")
def test_cpu_budget_is_the_engine_default_and_cuda_a_share_of_free_memory(monkeypatch):
    assert memory_budget_mb("cpu", 1024) == 1024
    assert memory_budget_mb(torch.device("cpu"), 256) == 256
    free = 80 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 141 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 6 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 << 30)
    # a quarter of what is free to the driver (80 GiB) and cached unused by torch (4 GiB)
    assert memory_budget_mb("cuda:0", 1024) == int((84 << 30) * devices.CUDA_BUDGET_SHARE) >> 20 == 21504
    devices.available_cuda_bytes.cache_clear()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 141 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2 << 30)  # nothing cached unused
    assert memory_budget_mb("cuda:0", 1024) == 1024  # never below the CPU's value


def test_engine_is_blocked_on_the_cpu_batched_on_accelerators_and_overridable():
    assert engine("cpu") == "blocked" and engine("meta") == "blocked"
    assert engine("cuda") == "batched" and engine("cuda:1") == "batched" and engine("mps") == "batched"
    with using_engine("batched"):
        assert engine("cpu") == "batched"
        with using_engine("blocked"):
            assert engine("cuda") == "blocked"
        assert engine("cpu") == "batched"
    assert engine("cpu") == "blocked"
    with pytest.raises(ValueError, match="'blocked' or 'batched'"):
        with using_engine("gpu"):  # type: ignore[arg-type]
            pass


def test_describe_device_names_the_cpu():
    assert describe_device("cpu") == "cpu"


def fc(**options):
    fed = make_federation(make_task(0, byzantine_total=0), 0)
    return defenses.build("fc", fed, {"lr": 0.1, **options})


def test_fc_budget_defaults_from_the_device_and_keeps_a_configured_value(monkeypatch):
    assert fc().budget_mb == 1024
    assert fc(memory_budget_mb=7).budget_mb == 7
    # the default is asked of the federation's device
    asked = []
    monkeypatch.setattr(
        "defenses.clustering_algorithms.memory_budget_mb", lambda device, default: asked.append((device, default)) or 5
    )
    assert fc().budget_mb == 5 and asked == [(torch.device("cpu"), 1024)]


# -- configs and commands ----------------------------------------------------------------


def config_data(device: str) -> dict:
    return {"device": device, "rounds": 2, "task": {"clusters": 2, "clients_per_cluster": 2},
            "methods": [{"name": "local", "lr": 0.1}]}


def test_config_accepts_auto_and_validation_resolves_it():
    config = parse_config(config_data("auto"))
    assert config.device == "auto"
    assert validate(config).device == ("cuda:0" if CUDA else "cpu")


def test_bad_device_fails_at_load_naming_field_and_values():
    with pytest.raises(ConfigError) as error:
        parse_config(config_data("gpu"))
    assert "device" in str(error.value) and "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'" in str(error.value)


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_refused_at_validation():
    with pytest.raises(ConfigError, match=r"device: 'cuda' requested but CUDA is not available"):
        validate(parse_config(config_data("cuda")))


def write_config(tmp_path: Path, device: str = "cpu", grid: dict | None = None) -> Path:
    lines = [f'device = "{device}"', "rounds = 2", "eval_every = 1", "seeds = [0]",
             "[task]", "clusters = 2", "clients_per_cluster = 2",
             "[[methods]]", 'name = "local"', "lr = 0.1"]
    if grid is not None:
        lines += ["[grid]"] + [f"{key} = {json.dumps(value)}" for key, value in grid.items()]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_config_device_argument_replaces_the_file_device(tmp_path):
    path = write_config(tmp_path, device="cuda:3")
    assert load_config(path).device == "cuda:3"
    assert load_config(path, device="cpu").device == "cpu"
    with pytest.raises(ConfigError, match="device"):
        load_config(path, device="tpu")


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("command", [["run"], ["grid"]])
def test_device_option_overrides_the_config_and_is_checked(command, tmp_path, capsys):
    path = write_config(tmp_path, device="cpu")
    status = main([*command, str(path), "--device", "cuda", "--out", str(tmp_path / "out")])
    assert status == 2
    assert "device: 'cuda' requested but CUDA is not available" in capsys.readouterr().err
    # the file's own device is the CPU: without --device the command runs
    assert main([*command, str(path), "--out", str(tmp_path / "out")]) == 0


def test_device_auto_on_the_command_line_runs_where_the_config_names_an_absent_gpu(tmp_path):
    path = write_config(tmp_path, device="cuda:7")
    assert main(["run", str(path), "--device", "auto", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["config"]["device"] == ("cuda:0" if CUDA else "cpu")


@pytest.mark.parametrize("figure", ["fig2", "fig3", "fig7"])
def test_reproduce_refuses_device_for_recipes_that_run_on_the_cpu(figure, capsys):
    assert main(["reproduce", figure, "--device", "cpu", "--quick"]) == 2
    assert "--device applies to table1 and fig6" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["reproduce", "table1"], ["reproduce", "fig6"], ["attack-table"]])
def test_recipe_commands_accept_device(command):
    from robust_pfl.cli import build_parser

    assert build_parser().parse_args([*command, "--device", "cuda:1"]).device == "cuda:1"


def test_grid_device_override_changes_the_cell_keys_and_auto_keys_the_picked_device(tmp_path):
    path = write_config(tmp_path, device="cpu", grid={"method.lr": [0.1, 0.2]})
    on_file = load_grid(path)
    auto = load_grid(path, device="auto")
    assert [cell.config["device"] for cell in auto.cells] == ["cuda:0" if CUDA else "cpu"] * 2
    if not CUDA:  # auto picked the CPU: the same runs, so the same cells
        assert [c.cell for c in auto.cells] == [c.cell for c in on_file.cells]


def test_grid_sweeping_device_cannot_be_overridden(tmp_path):
    path = write_config(tmp_path, grid={"device": ["cpu", "auto"]})
    with pytest.raises(ConfigError, match="--device cpu would replace the grid's own device axis"):
        load_grid(path, device="cpu")


def cell(device: str) -> GridCell:
    return GridCell("k" + device, {}, {"device": device}, 4, 0)


def test_ray_reserves_a_gpu_per_cell_on_cuda_unless_the_file_says_otherwise():
    cpu_grid = Grid("g", [], [cell("cpu")], Resources(cpus=2.0))
    assert cpu_grid.cell_resources() == Resources(cpus=2.0, gpus=0.0)
    cuda_grid = Grid("g", [], [cell("cpu"), cell("cuda:0")], Resources(cpus=2.0))
    assert cuda_grid.uses_cuda and cuda_grid.cell_resources() == Resources(cpus=2.0, gpus=1.0)
    shared = Grid("g", [], [cell("cuda")], Resources(cpus=1.0, gpus=0.25))
    assert shared.cell_resources().gpus == 0.25
    none = Grid("g", [], [cell("cuda")], Resources(cpus=1.0, gpus=0.0))  # the file says 0: none
    assert none.cell_resources().gpus == 0.0


