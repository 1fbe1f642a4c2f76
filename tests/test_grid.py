"""The grid results store and runner: one tidy CSV that pandas reads in one call, each
finished cell appended once, errors recorded while the other cells go on, reruns
that skip finished cells and never store a cell twice, and backends that agree."""

from __future__ import annotations

import fcntl
import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from robust_pfl import experiments
from robust_pfl.backends import LocalBackend, make_backend
from robust_pfl.cells import CellOutcome, CellTask, execute_cell
from robust_pfl.cli import main
from robust_pfl.config import ConfigError
from robust_pfl.grid import read_results, run_grid
from robust_pfl.grid_file import expand_grid

pytestmark = pytest.mark.usefixtures("single_thread")

COLUMNS = ["cell", "method", "seed", "attack", "byzantine.total", "n_clients", "n_byzantine", "status", "error",
           "round", "metric", "value", "final"]
ROUNDS = (0, 1, 2)


def grid_data(**changes) -> dict:
    data = {
        "seeds": [0, 1],
        "rounds": 2,
        "eval_every": 1,
        "task": {"clusters": 2, "clients_per_cluster": 3},
        "methods": [
            {"name": "global", "lr": 0.01},
            {"name": "global", "aggregator": "median", "label": "median", "lr": 0.01},
        ],
        "grid": {"attack": [{"name": "none"}, {"name": "large_gradient"}], "byzantine": {"total": [0, 2]}},
    }
    data.update(changes)
    return data


def fake_runs(monkeypatch, calls: list, fail: str | None = None) -> None:
    """Replace the training run by rows known in advance: metrics ``a`` and ``b`` at
    rounds 0-2 (value 10 * seed + round, + 0.5 for b) and ``c`` at round 0 only; a
    cell whose attack is ``fail`` raises."""

    def run(payload, source, **kwargs):
        calls.append(source)
        if payload["attack"]["name"] == fail:
            raise RuntimeError("boom\nsecond line")
        seed = payload["seeds"][0]
        rows = [{"round": r, "metric": m, "value": 10.0 * seed + r + (0.5 if m == "b" else 0.0)}
                for r in ROUNDS for m in ("a", "b")]
        return rows + [{"round": 0, "metric": "c", "value": 1.0}]

    monkeypatch.setattr(experiments, "run_cell_config", run)


def test_store_is_one_tidy_csv_with_every_axis_as_a_column(tmp_path, monkeypatch):
    fake_runs(monkeypatch, [])
    grid = expand_grid(grid_data(), "g")
    summary = run_grid(grid, tmp_path)
    frame = pd.read_csv(tmp_path / "results.csv")
    assert list(frame.columns) == COLUMNS
    assert len(frame) == len(grid.cells) * (2 * len(ROUNDS) + 1 + 1)
    assert summary["ran"] == summary["cells"] == len(grid.cells) == 16 and summary["errors"] == 0
    for cell in grid.cells:
        rows = frame[frame["cell"] == cell.cell]
        for column, value in cell.axes.items():
            assert (rows[column] == value).all()
        assert (rows["n_clients"] == 6 + cell.axes["byzantine.total"]).all()
        assert (rows["n_byzantine"] == cell.axes["byzantine.total"]).all()
        a = rows[rows["metric"] == "a"]
        assert a["value"].tolist() == [10.0 * cell.axes["seed"] + r for r in ROUNDS]
    assert (frame["status"] == "ok").all() and frame["error"].isna().all()


def test_final_marks_each_metrics_last_round_and_cell_seconds_ends_each_block(tmp_path, monkeypatch):
    fake_runs(monkeypatch, [])
    run_grid(expand_grid(grid_data(), "g"), tmp_path)
    frame = pd.read_csv(tmp_path / "results.csv")
    metric, last_round = frame["metric"], frame["round"]
    expected = ((metric.isin(["a", "b"]) & (last_round == 2)) | ((metric == "c") & (last_round == 0))
                | (metric == "cell_seconds"))
    assert frame["final"].dtype == bool and (frame["final"] == expected).all()
    for _, block in frame.groupby("cell", sort=False):
        assert block["metric"].tolist()[-1] == "cell_seconds" and (block["metric"] == "cell_seconds").sum() == 1
        assert block.index.tolist() == list(range(block.index[0], block.index[0] + len(block)))  # one contiguous block
        assert block["value"].iloc[-1] >= 0


def write_grid_file(path: Path, extra: str = "") -> Path:
    path.write_text(
        'seeds = [0, 1]\nrounds = 2\n[task]\nclusters = 2\nclients_per_cluster = 3\n[[methods]]\nname = "global"\n'
        '[grid]\nattack = [{ name = "none" }, { name = "large_gradient" }, { name = "alie" }]\n' + extra
    )
    return path


def test_an_errored_cell_is_recorded_the_others_go_on_and_it_reruns_once(tmp_path, monkeypatch, capsys):
    path, out = write_grid_file(tmp_path / "g.toml"), tmp_path / "out"
    calls: list = []
    fake_runs(monkeypatch, calls, fail="large_gradient")
    assert main(["grid", str(path), "--out", str(out)]) == 1  # a cell errored
    assert "6 cells: 6 ran, 0 skipped (finished before), 2 errored" in capsys.readouterr().out
    frame = pd.read_csv(out / "results.csv")
    errors = frame[frame["status"] == "error"]
    assert sorted(errors["seed"]) == [0, 1] and (errors["attack"] == "large_gradient").all()
    assert (errors["error"] == "RuntimeError: boom second line").all() and (errors["metric"] == "cell_seconds").all()
    assert frame[frame["status"] == "ok"]["cell"].nunique() == 4
    calls.clear()
    fake_runs(monkeypatch, calls)
    assert main(["grid", str(path), "--out", str(out)]) == 0
    assert len(calls) == 2 and all("attack=large_gradient" in source for source in calls)
    frame = pd.read_csv(out / "results.csv")
    assert (frame["status"] == "ok").all()
    assert frame.groupby("cell")["metric"].apply(lambda m: (m == "cell_seconds").sum()).eq(1).all()
    assert frame["cell"].nunique() == 6


def test_a_rerun_skips_finished_cells(tmp_path, monkeypatch):
    calls: list = []
    fake_runs(monkeypatch, calls)
    grid = expand_grid(grid_data(), "g")
    run_grid(grid, tmp_path)
    before = (tmp_path / "results.csv").read_bytes()
    calls.clear()
    summary = run_grid(grid, tmp_path)
    assert calls == [] and (summary["ran"], summary["skipped"]) == (0, 16)
    assert (tmp_path / "results.csv").read_bytes() == before


def test_changed_settings_give_new_keys_and_do_not_reuse_old_results(tmp_path, monkeypatch):
    calls: list = []
    fake_runs(monkeypatch, calls)
    run_grid(expand_grid(grid_data(), "g"), tmp_path)
    calls.clear()
    changed = expand_grid(grid_data(rounds=3), "g")
    assert run_grid(changed, tmp_path)["ran"] == 16 and len(calls) == 16
    frame = read_results(tmp_path)
    assert frame["cell"].nunique() == 32  # the old cells are kept beside the new ones


def test_a_header_lacking_the_grids_columns_is_widened(tmp_path, monkeypatch):
    fake_runs(monkeypatch, [])
    run_grid(expand_grid(grid_data(), "g"), tmp_path)
    wider = grid_data(grid={"attack": [{"name": "none"}], "task": {"dim": [3, 4]}})
    run_grid(expand_grid(wider, "g"), tmp_path)
    frame = pd.read_csv(tmp_path / "results.csv")
    assert list(frame.columns) == [*COLUMNS[:5], "task.dim", *COLUMNS[5:]]
    old, new = frame[frame["task.dim"].isna()], frame[frame["task.dim"].notna()]
    assert old["cell"].nunique() == 16 and new["cell"].nunique() == 8
    assert new["byzantine.total"].isna().all() and set(new["task.dim"]) == {3, 4}


def test_a_block_cut_by_a_kill_is_dropped_and_its_cell_runs_once_more(tmp_path, monkeypatch):
    calls: list = []
    fake_runs(monkeypatch, calls)
    grid = expand_grid(grid_data(), "g")
    run_grid(grid, tmp_path)
    store = tmp_path / "results.csv"
    lines = store.read_text().splitlines(keepends=True)
    last_block = [line for line in lines if line.startswith(grid.cells[-1].cell)]
    store.write_text("".join(lines[: -1]))  # the last cell's block without its cell_seconds row
    assert grid.cells[-1].cell not in set(read_results(tmp_path)["cell"])  # readers see complete blocks only
    store.write_text("".join(lines[: -3]) + lines[-3][:10])  # and a line cut mid-way
    calls.clear()
    with pytest.warns(RuntimeWarning, match=rf"results.csv: dropped line {len(lines) - 2}, not rows of 13 fields"):
        run_grid(grid, tmp_path)
    assert len(calls) == 1
    frame = pd.read_csv(store)
    assert (frame["metric"] == "cell_seconds").sum() == 16
    assert len(frame[frame["cell"] == grid.cells[-1].cell]) == len(last_block)


@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00binary", b"cell,status\n"])
def test_a_file_that_is_no_store_is_a_config_error_naming_it(tmp_path, monkeypatch, content):
    """An empty, binary or foreign results.csv stops the grid before any cell runs
    (``robust-pfl grid`` exits 2 on a ConfigError), and readers refuse it alike."""
    calls: list = []
    fake_runs(monkeypatch, calls)
    (tmp_path / "results.csv").write_bytes(content)
    with pytest.raises(ConfigError, match=r"results\.csv is not a grid results store"):
        run_grid(expand_grid(grid_data(), "g"), tmp_path)
    with pytest.raises(ConfigError, match=r"results\.csv is not a grid results store"):
        read_results(tmp_path)
    assert calls == [] and (tmp_path / "results.csv").read_bytes() == content


def test_duplicate_cells_are_refused(tmp_path):
    grid = expand_grid(grid_data(), "g")
    twice = type(grid)(grid.source, grid.columns, grid.cells + grid.cells[:1], grid.resources)
    with pytest.raises(ValueError, match="distinct"):
        run_grid(twice, tmp_path)


def test_local_backend_with_two_processes_gives_the_same_results(tmp_path):
    grid = expand_grid(grid_data(rounds=5, grid={"attack": [{"name": "none"}, {"name": "alie"}]}), "g")
    run_grid(grid, tmp_path / "one")
    backend = LocalBackend(jobs=2)
    try:
        run_grid(grid, tmp_path / "two", backend)
    finally:
        backend.close()
    one, two = (comparable(read_results(tmp_path / name)) for name in ("one", "two"))
    assert set(one["cell"]) == {cell.cell for cell in grid.cells} and one.equals(two)


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by cell, metric and round; wall times blanked."""
    frame = frame.assign(value=frame["value"].where(frame["metric"] != "cell_seconds"))
    return frame.sort_values(["cell", "metric", "round"]).reset_index(drop=True)


def test_a_long_cell_gets_a_checkpoint_file_removed_once_it_is_stored(tmp_path):
    class Recording:
        name = "recording"
        tasks: list[CellTask] = []

        def map_unordered(self, tasks):
            for task in tasks:
                self.tasks.append(task)
                Path(task.checkpoint).write_text("state")
                yield CellOutcome(task.cell, [{"round": 2, "metric": "a", "value": 1.0}], None, 0.1)

        def close(self):
            pass

    grid = expand_grid(grid_data(checkpoint_every=1), "g")
    backend = Recording()
    run_grid(grid, tmp_path, backend)
    assert [t.checkpoint for t in backend.tasks] == [str(tmp_path / "checkpoints" / f"{c.cell}.pt") for c in grid.cells]
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_checkpointed_cells_store_the_same_rows_and_leave_no_checkpoint(tmp_path):
    plain = expand_grid(grid_data(rounds=4, grid={"attack": [{"name": "alie"}]}), "g")
    checkpointed = expand_grid(grid_data(rounds=4, checkpoint_every=2, grid={"attack": [{"name": "alie"}]}), "g")
    run_grid(plain, tmp_path / "plain")
    run_grid(checkpointed, tmp_path / "checkpointed")
    assert list((tmp_path / "checkpointed" / "checkpoints").iterdir()) == []
    keys = {c.cell: p.cell for c, p in zip(checkpointed.cells, plain.cells)}  # same cells, other keys
    with_checkpoints = comparable(read_results(tmp_path / "checkpointed")).assign(
        cell=lambda frame: frame["cell"].map(keys)
    )
    pd.testing.assert_frame_equal(comparable(with_checkpoints), comparable(read_results(tmp_path / "plain")))


def test_an_interrupted_checkpointed_cell_resumes_mid_run(tmp_path, monkeypatch, capsys):
    """A cell that fails after its checkpoint at round 2 is recorded as errored and
    keeps its checkpoint; the rerun steps only rounds 2-5 and stores what an
    uninterrupted run stores.  Under --verbose, each checkpoint and the resume are
    reported on stderr."""
    from robust_pfl.engine.federation import Federation

    monkeypatch.setenv("ROBUST_PFL_VERBOSE", "1")

    one_cell = {"seeds": [0], "methods": [{"name": "fc", "lr": 0.05, "heavy_ball": 0.9}],
                "grid": {"attack": [{"name": "large_gradient"}], "byzantine": {"total": [2]}}}
    grid = expand_grid(grid_data(rounds=6, checkpoint_every=2, **one_cell), "g")
    run_grid(grid, tmp_path / "whole")
    batches, real = [], Federation.sample_batch

    def sample_batch(self, *args, **kwargs):
        batches.append(1)
        if len(batches) == 4 and failing:
            raise RuntimeError("interrupted in round 3")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Federation, "sample_batch", sample_batch)
    failing = True
    capsys.readouterr()
    first = run_grid(grid, tmp_path / "resumed")
    assert first["errors"] == 1 and "interrupted in round 3" in next(iter(first["errored"].values()))
    reported = capsys.readouterr().err
    assert "round 2 of 6 checkpointed" in reported and "round 4 of 6" not in reported
    assert [path.name for path in (tmp_path / "resumed" / "checkpoints").iterdir()] == [f"{grid.cells[0].cell}.pt"]
    failing, batches[:] = False, []
    second = run_grid(grid, tmp_path / "resumed")
    assert second["errors"] == 0 and len(batches) == 4  # rounds 2, 3, 4 and 5 only
    lines = [line for line in capsys.readouterr().err.splitlines() if grid.cells[0].cell in line]
    assert [line.split(": ", 1)[1].split(" (")[0] for line in lines] == [
        "resumed at round 2 of 6", "round 4 of 6 checkpointed", "round 6 of 6 checkpointed"]
    pd.testing.assert_frame_equal(comparable(read_results(tmp_path / "resumed")), comparable(read_results(tmp_path / "whole")))


def test_a_second_run_on_the_same_out_is_refused(tmp_path):
    with open(tmp_path / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(ConfigError, match="in use by another grid run"):
            run_grid(expand_grid(grid_data(), "g"), tmp_path)


def test_execute_cell_records_an_exception_and_restores_torch_settings(monkeypatch):
    def fail(payload, source, **kwargs):
        assert torch.get_num_threads() == 2
        raise ValueError("bad")

    monkeypatch.setattr(experiments, "run_cell_config", fail)
    threads = torch.get_num_threads()
    outcome = execute_cell(CellTask("k", {}, "s", None, threads=2))
    assert (outcome.cell, outcome.rows, outcome.error) == ("k", [], "ValueError: bad")
    assert torch.get_num_threads() == threads and math.isfinite(outcome.seconds)


def test_make_backend_names_what_is_wrong(monkeypatch):
    with pytest.raises(ConfigError, match=r"unknown backend 'slurm'; allowed: \['local', 'ray'\]"):
        make_backend("slurm")
    with pytest.raises(ConfigError, match="--address applies to the ray backend only"):
        make_backend("local", address="10.0.0.1:6379")
    assert make_backend("local", jobs=None).jobs == 1
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):  # as if Ray were not installed
        return None if name == "ray" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match=r"backend 'ray' needs Ray: pip install 'robust-pfl\[ray\]'"):
        make_backend("ray")


# -- the attack-table shortcut runs grid files -----------------------------------------------
def test_attack_table_quick_mode_overrides_rounds_and_seeds_of_the_shipped_files():
    from robust_pfl.recipes import attack_table

    for name, spec in attack_table.TABLES.items():
        grid, _ = attack_table.load(name, quick=True)
        assert {c.config["rounds"] for c in grid.cells} == {spec.quick.rounds}
        assert {c.axes["seed"] for c in grid.cells} == set(range(spec.quick.seeds))
    grid, full = attack_table.load("digits", seeds=2)
    assert {c.axes["seed"] for c in grid.cells} == {0, 1} and full == attack_table.Mode(150, 3)


def test_attack_table_verdicts():
    from robust_pfl.recipes.attack_table import breaks

    errors = {("none", "A"): 1e-3, ("x", "A"): 0.02, ("x", "B"): math.nan, ("y", "B"): 1e-2}
    assert breaks(errors, "relative_error") == {("x", "A"), ("x", "B")}  # above 1e-2, or not finite
    accuracy = {("none", "A"): 90.0, ("x", "A"): 79.9, ("y", "A"): 80.0, ("x", "B"): math.nan, ("none", "B"): 50.0}
    assert breaks(accuracy, "accuracy") == {("x", "A"), ("x", "B")}  # > 10 points below its own no-attack value
    # a backdoor table also breaks where the attack success rate passes 50 %
    success = {("x", "A"): 49.9, ("y", "A"): 50.1, ("none", "B"): math.nan}
    assert breaks(accuracy, "backdoor", success) == {("x", "A"), ("x", "B"), ("y", "A"), ("none", "B")}


def test_a_backdoor_table_cell_is_accuracy_then_attack_success_rate():
    from robust_pfl.recipes import attack_table

    grid, _ = attack_table.load("backdoor", quick=True)
    attacks_ = attack_table.labels(grid, "attack")
    methods = attack_table.labels(grid, "method")
    assert attacks_ == ["none", "badnets", "dba", "model_replacement"] and methods[:3] == ["FC", "MC", "CLoVE"]
    values = {("badnets", "FC"): 91.25, ("none", "FC"): 92.0}
    success = {("badnets", "FC"): 98.04}
    lines = attack_table.markdown(values, {("badnets", "FC")}, grid, "backdoor", True, success).splitlines()
    row = [c.strip() for c in lines[2].strip("|").split("|")]
    assert row[:3] == ["FC", "92.0 / –", "91.2 / 98.0 ✗"]  # no attack: no success rate recorded


def test_attack_table_with_a_row_per_defense_is_the_transpose():
    """The systems table has a row per defense: every (attack, defense) value and ✗
    lands at the transposed position."""
    from robust_pfl.recipes import attack_table

    grid, _ = attack_table.load("systems", quick=True)
    attacks_ = attack_table.labels(grid, "attack")
    methods = attack_table.labels(grid, "method")
    values = {(a, m): 10.0 * i + j for i, a in enumerate(attacks_) for j, m in enumerate(methods)}
    broken = {(attacks_[1], methods[2])}
    by_attack = attack_table.markdown(values, broken, grid, "accuracy").splitlines()
    by_defense = attack_table.markdown(values, broken, grid, "accuracy", defense_rows=True).splitlines()
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    assert cells(by_defense[0])[1:] == attacks_ and [cells(r)[0] for r in by_defense[2:]] == methods
    for i in range(len(attacks_)):
        for j in range(len(methods)):
            assert cells(by_attack[2 + i])[1 + j] == cells(by_defense[2 + j])[1 + i]
    assert cells(by_defense[2 + 2])[1 + 1].endswith("✗")
