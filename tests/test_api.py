"""The Python entry points (robust_pfl.run, robust_pfl.run_grid): a dict, a TOML path
and a validated config give the same rows as the command line; a class registered in
the notebook's process can be named in the config; bad configs fail at load naming the
field."""

from __future__ import annotations

from robust_pfl.engine.types import AttackBase

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import torch

import attacks
import robust_pfl
from robust_pfl.api import RUN_COLUMNS, experiment_config
from robust_pfl.cli import main
from robust_pfl.config import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


def small_run(**changes) -> dict:
    data = {
        "seeds": [0, 1],
        "rounds": 3,
        "eval_every": 1,
        "task": {"clusters": 2, "clients_per_cluster": 3},
        "byzantine": {"total": 1},
        "attack": {"name": "large_gradient"},
        "methods": [{"name": "global", "lr": 0.01}, {"name": "fc", "lr": 0.01}],
    }
    data.update(changes)
    return data


def as_toml(data: dict, path: Path) -> Path:
    lines = [f"seeds = {data['seeds']}", f"rounds = {data['rounds']}", f"eval_every = {data['eval_every']}",
             "[task]", "clusters = 2", "clients_per_cluster = 3", "[byzantine]", "total = 1",
             "[attack]", 'name = "large_gradient"']
    for method in data["methods"]:
        lines += ["[[methods]]", f'name = "{method["name"]}"', f"lr = {method['lr']}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_returns_the_tidy_rows_of_every_method_seed_and_round():
    frame = robust_pfl.run(small_run())
    assert list(frame.columns) == list(RUN_COLUMNS)
    assert set(frame["method"]) == {"global", "fc"} and set(frame["seed"]) == {0, 1}
    assert set(frame["round"]) == {0, 1, 2, 3}
    accuracy = frame[frame["metric"] == "test_loss"]
    assert len(accuracy) == 2 * 2 * 4  # methods x seeds x evaluated rounds


def test_a_dict_a_toml_file_and_the_command_line_agree(tmp_path):
    """The same config through every entry point: bit-identical rows (the run is
    seeded and deterministic on the CPU)."""
    data = small_run()
    from_dict = robust_pfl.run(data)
    path = as_toml(data, tmp_path / "run.toml")
    from_file = robust_pfl.run(path)
    assert main(["run", str(path), "--out", str(tmp_path / "cli")]) == 0
    from_cli = pd.read_csv(tmp_path / "cli" / "history.csv")
    pd.testing.assert_frame_equal(from_dict, from_file)
    pd.testing.assert_frame_equal(from_dict, from_cli[list(RUN_COLUMNS)], check_dtype=False)
    from_config = robust_pfl.run(experiment_config(data))
    pd.testing.assert_frame_equal(from_dict, from_config)


def test_out_dir_writes_what_the_command_line_writes(tmp_path):
    frame = robust_pfl.run(small_run(seeds=[0]), out_dir=tmp_path)
    assert (tmp_path / "history.csv").exists() and (tmp_path / "summary.json").exists()
    assert len(frame) == len(pd.read_csv(tmp_path / "history.csv"))


@dataclasses.dataclass(frozen=True)
class ShiftedCopy(AttackBase):
    """A user's own attack, as in a notebook: every Byzantine row is the first honest
    message plus ``shift``."""

    name = "test_shifted_copy"
    summary = "first honest message plus a constant"
    needs = frozenset()
    shift: float = 5.0

    def __call__(self, honest: torch.Tensor, context) -> torch.Tensor:
        rows = int(context.byzantine.sum())
        return honest[..., :1, :].expand(*honest.shape[:-2], rows, honest.shape[-1]) + self.shift


@pytest.fixture
def user_attack():
    """ShiftedCopy registered for one test (the suites over the registry must not see it)."""
    attacks.register(ShiftedCopy)
    try:
        yield ShiftedCopy
    finally:
        attacks.REGISTRY.pop(ShiftedCopy.name)


def test_an_attack_registered_in_the_process_is_named_from_the_config(user_attack):
    """Without attack and under the user's attack the honest results differ (the attack
    reaches the aggregate), and its option is validated like a built-in's."""
    clean = robust_pfl.run(small_run(attack={"name": "none"}, methods=[{"name": "global", "lr": 0.01}]))
    shifted = robust_pfl.run(small_run(attack={"name": "test_shifted_copy", "shift": 50.0},
                                       methods=[{"name": "global", "lr": 0.01}]))
    last = lambda frame: frame[(frame["metric"] == "train_loss") & (frame["round"] == 3)]["value"].to_numpy()  # noqa: E731
    assert not (last(clean) == last(shifted)).all()
    with pytest.raises(ConfigError, match="shift"):
        robust_pfl.run(small_run(attack={"name": "test_shifted_copy", "shfit": 1.0}))


def test_a_bad_config_fails_at_load_naming_the_field():
    with pytest.raises(ConfigError, match="rounds"):
        robust_pfl.run(small_run(rounds=-1))
    with pytest.raises(ConfigError, match="no_such_method"):
        robust_pfl.run(small_run(methods=[{"name": "no_such_method"}]))


def test_run_grid_returns_one_column_per_axis(tmp_path):
    grid = {**small_run(seeds=[0]), "grid": {"attack": [{"name": "none"}, {"name": "bit_flip"}]}}
    grid.pop("attack")
    frame = robust_pfl.run_grid(grid, out_dir=tmp_path)
    assert {"cell", "method", "seed", "attack", "round", "metric", "value"} <= set(frame.columns)
    assert set(frame["attack"]) == {"none", "bit_flip"}
    again = robust_pfl.run_grid(grid, out_dir=tmp_path)  # finished cells are read, not run again
    pd.testing.assert_frame_equal(frame.reset_index(drop=True), again.reset_index(drop=True))
    assert len(robust_pfl.run_grid(grid)) == len(frame)  # a temporary store


def test_the_readmes_python_example_runs_as_written(monkeypatch):
    """The README's "From Python" block, executed verbatim from the repository root: it
    registers its attack, runs 50 rounds of the quick start under it and plots."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    section = text.split("## From Python", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(root)
    namespace: dict = {}
    try:
        exec(compile(block, "README.md", "exec"), namespace)
    finally:
        attacks.REGISTRY.pop("shift", None)
    accuracy = namespace["accuracy"]
    assert set(accuracy["round"]) >= {0, 50} and set(accuracy["method"]) == set(namespace["frame"]["method"])


@pytest.mark.parametrize("entry", ["cli", "run", "run_to_dir"])
def test_a_run_validates_its_config_once(entry, tmp_path, monkeypatch):
    """Validation (registries, data, device) runs once per run, whichever entry
    point starts it (counted where its checks run, for :func:`validate` and
    :func:`parse_and_validate` alike)."""
    import robust_pfl.experiments as experiments

    calls = []
    original = experiments._validated
    monkeypatch.setattr(experiments, "_validated", lambda *a, **k: calls.append(1) or original(*a, **k))
    config = small_run(seeds=[0], rounds=1)
    if entry == "cli":
        assert main(["run", str(as_toml(config, tmp_path / "c.toml")), "--out", str(tmp_path / "out")]) == 0
    else:
        robust_pfl.run(config, out_dir=tmp_path / "out" if entry == "run_to_dir" else None)
    assert len(calls) == 1
