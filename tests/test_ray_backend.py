"""Ray backend: a grid run as Ray tasks on a local instance stores the same results as
the local backend; a cell that raises, or whose worker dies, is an errored cell and
the others go on; ``jobs`` caps the cells in flight; outcomes arrive as cells finish."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

import pandas
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs Ray: pip install 'robust-pfl[ray]'")

from robust_pfl.backends import LocalBackend, make_backend  # noqa: E402
from robust_pfl.cells import CellOutcome, CellTask  # noqa: E402
from robust_pfl.cli import main  # noqa: E402
from robust_pfl.config import ConfigError  # noqa: E402
from robust_pfl.grid import read_results, run_grid  # noqa: E402
from robust_pfl.grid_file import Grid, Resources, expand_grid  # noqa: E402
from robust_pfl.ray_backend import RayBackend  # noqa: E402

# Workers cannot import this test module by name; ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TINY_GRID = {
    "seeds": [0],
    "rounds": 4,
    "eval_every": 2,
    "task": {"clusters": 2, "clients_per_cluster": 3},
    "byzantine": {"total": 1},
    "methods": [{"name": "fc"}, {"name": "global", "aggregator": "median", "label": "global+median"}],
    "grid": {"attack": [{"name": "none"}, {"name": "large_gradient"}]},
}


def tiny_grid_with_a_failing_cell() -> Grid:
    """The 2 attacks x 2 methods x 1 seed grid plus a cell whose config fails when it
    runs (``rounds = 0``), as a cell that raises mid-grid."""
    grid = expand_grid(TINY_GRID, "tiny.toml")
    broken = replace(grid.cells[0], cell="f" * 16, config={**grid.cells[0].config, "rounds": 0})
    return replace(grid, cells=[*grid.cells, broken])


def comparable(frame: pandas.DataFrame) -> pandas.DataFrame:
    """Rows in a fixed order, wall-clock values removed."""
    frame = frame.copy()
    frame.loc[frame["metric"] == "cell_seconds", "value"] = float("nan")
    return frame.sort_values(["cell", "metric", "round"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def local_ray():
    """A local instance started the way ``--backend ray`` starts one, shared by the
    module's tests (start-up is seconds); other backends in the module reuse it."""
    backend = RayBackend()
    yield backend
    backend.close()


def test_tiny_grid_on_a_local_ray_instance_matches_the_local_backend(tmp_path, local_ray, single_thread):
    grid = tiny_grid_with_a_failing_cell()
    run_grid(grid, tmp_path / "local", LocalBackend(), progress=False)
    summary = run_grid(grid, tmp_path / "ray", local_ray, progress=False)

    local, on_ray = read_results(tmp_path / "local"), read_results(tmp_path / "ray")
    pandas.testing.assert_frame_equal(comparable(local), comparable(on_ray), check_exact=True)
    assert summary["backend"] == "ray" and summary["cells"] == 5 and summary["errors"] == 1
    failed = on_ray[on_ray["status"] == "error"]
    assert list(failed["cell"]) == ["f" * 16] and list(failed["metric"]) == ["cell_seconds"]
    assert failed["error"].iloc[0].startswith("ConfigError") and "rounds" in failed["error"].iloc[0]
    assert set(on_ray.loc[on_ray["status"] == "ok", "cell"]) == {cell.cell for cell in grid.cells[:4]}


def test_backend_ray_without_ray_installed_names_the_extra(tmp_path, monkeypatch, capsys):
    grid_file = tmp_path / "g.toml"
    grid_file.write_text('rounds = 2\n[[methods]]\nname = "global"\n[grid]\nseed = [0, 1]\n')
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` finds without Ray
    assert main(["grid", str(grid_file), "--backend", "ray", "--out", str(tmp_path / "out")]) == 2
    assert "backend 'ray' needs Ray: pip install 'robust-pfl[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "results.csv").exists()


# Stand-ins for execute_cell: the task's config says how long to take and whether to die.


def timed_cell(task: CellTask) -> CellOutcome:
    """Sleeps ``config["sleep"]`` seconds; the rows are the wall-clock start and end."""
    start = time.time()
    time.sleep(task.config["sleep"])
    rows = [{"round": 0, "metric": "start", "value": start}, {"round": 0, "metric": "end", "value": time.time()}]
    return CellOutcome(task.cell, rows, None, time.time() - start)


def dying_cell(task: CellTask) -> CellOutcome:
    """Kills its worker process (as a segfault or the OOM killer would) when asked."""
    if task.config.get("die"):
        os._exit(1)
    return timed_cell(task)


class Interrupted(BaseException):
    """Not an ``Exception``: escapes execute_cell's ``except Exception``."""


def interrupted_cell(task: CellTask) -> CellOutcome:
    raise Interrupted("stopped at round 3\nsecond line")


class TimedRayBackend(RayBackend):
    cell_function = staticmethod(timed_cell)


class DyingRayBackend(RayBackend):
    cell_function = staticmethod(dying_cell)


class InterruptedRayBackend(RayBackend):
    cell_function = staticmethod(interrupted_cell)


def tasks(*configs: dict) -> list[CellTask]:
    return [CellTask(f"c{i}", config, f"cell c{i}", None, 1) for i, config in enumerate(configs)]


def test_outcomes_arrive_in_finishing_order(local_ray):
    backend = TimedRayBackend()
    list(backend.map_unordered(tasks({"sleep": 0.0}, {"sleep": 0.0})))  # workers started and warm
    order = [o.cell for o in backend.map_unordered(tasks({"sleep": 1.5}, {"sleep": 0.0}))]
    assert order == ["c1", "c0"]


def test_jobs_caps_the_cells_in_flight(local_ray):
    backend = TimedRayBackend(jobs=1)
    outcomes = list(backend.map_unordered(tasks(*[{"sleep": 0.3}] * 3)))
    spans = sorted((o.rows[0]["value"], o.rows[1]["value"]) for o in outcomes)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))


def test_a_dead_worker_is_an_errored_cell_and_the_others_finish(local_ray):
    backend = DyingRayBackend()
    outcomes = {o.cell: o for o in backend.map_unordered(tasks({"sleep": 0.0}, {"die": True}, {"sleep": 0.0}))}
    assert sorted(outcomes) == ["c0", "c1", "c2"]
    assert outcomes["c1"].error.startswith("WorkerCrashedError: ") and outcomes["c1"].rows == []
    assert outcomes["c0"].error is None and outcomes["c2"].error is None


def test_an_exception_escaping_the_cell_is_named_with_its_first_line(local_ray):
    (outcome,) = InterruptedRayBackend().map_unordered(tasks({}))
    assert (outcome.cell, outcome.rows, outcome.error) == ("c0", [], "Interrupted: stopped at round 3")


def test_a_cell_larger_than_the_local_instance_is_refused(local_ray):
    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(ConfigError, match=rf"resources\.cpus = {cpus + 1:g} per cell.* {cpus:g} CPUs"):
        RayBackend(resources=Resources(cpus=cpus + 1))
    with pytest.raises(ConfigError, match=r"resources\.gpus = 1 per cell.* 0 GPUs"):
        RayBackend(resources=Resources(cpus=1, gpus=1))
    assert ray.is_initialized()  # a connection the backend did not open stays open


class FakeRay:
    """Records the ``ray.init``/``ray.shutdown`` calls a backend makes."""

    def __init__(self, initialized: bool) -> None:
        self.initialized, self.calls = initialized, []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        self.initialized = True

    def shutdown(self):
        self.calls.append(("shutdown", {}))
        self.initialized = False


@pytest.fixture
def fake_ray(monkeypatch):
    fake = FakeRay(initialized=False)
    monkeypatch.setattr(ray, "init", fake.init)
    monkeypatch.setattr(ray, "shutdown", fake.shutdown)
    monkeypatch.setattr(ray, "is_initialized", lambda: fake.initialized)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    return fake


def test_without_address_a_new_quiet_local_instance_is_started_and_shut_down(fake_ray):
    RayBackend().close()
    (call, kwargs), (last, _) = fake_ray.calls
    assert (call, kwargs["address"], last) == ("init", "local", "shutdown")
    assert kwargs["include_dashboard"] is False and kwargs["log_to_driver"] is False


def test_with_an_address_the_cluster_is_joined_and_only_disconnected(fake_ray):
    RayBackend(address="auto", resources=Resources(cpus=64)).close()  # no local capacity check
    (call, kwargs), (last, _) = fake_ray.calls
    assert (call, kwargs["address"], last) == ("init", "auto", "shutdown")
    assert "include_dashboard" not in kwargs  # the cluster's own setting


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_an_address_nobody_listens_on_fails_fast_naming_it(fake_ray, address):
    with pytest.raises(ConfigError, match=r"Ray address '.*127\.0\.0\.1:1' \(--address\): cannot reach"):
        RayBackend(address=address)
    assert fake_ray.calls == []


def test_a_connection_the_caller_opened_is_reused_and_left_open(fake_ray):
    fake_ray.initialized = True
    RayBackend().close()
    assert fake_ray.calls == [] and fake_ray.initialized
