"""Acceptance: a grid killed (SIGKILL) at random points and rerun until done loses no
finished cell, stores none twice, and ends equal to an uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from robust_pfl.grid import read_results, run_grid
from robust_pfl.grid_file import load_grid

pytestmark = pytest.mark.usefixtures("single_thread")

GRID = """seeds = [0, 1]
rounds = 100
eval_every = 25
[task]
clusters = 2
clients_per_cluster = 3
[byzantine]
total = 2
[[methods]]
name = "fc"
lr = 0.01
[[methods]]
name = "global"
aggregator = "median"
label = "median"
lr = 0.01
[grid]
attack = [{ name = "none" }, { name = "large_gradient" }, { name = "alie" }]
"""
KILLS = 4
MAX_PAUSE = 0.3  # seconds
ROOT = Path(__file__).resolve().parents[1]


def start(path: Path, out: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "robust_pfl.cli", "--threads", "1", "grid", str(path), "--out", str(out)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_at_random_point(process: subprocess.Popen, out: Path, rng: random.Random) -> bool:
    """SIGKILL the run at a random point: once it is past start-up (it has rewritten
    ``grid.json``) and has stored 0, 1 or 2 more cells, after a random pause of up to
    ``MAX_PAUSE`` s (within a cell, a write, or the store's clean-up on open);
    ``False`` if it finished first."""
    marker, store = out / "grid.json", out / "results.csv"
    launched = time.time_ns()
    wait_for(process, lambda: marker.exists() and marker.stat().st_mtime_ns >= launched)
    stored = store.read_text().count(",cell_seconds,") if store.exists() else 0
    more = rng.randint(0, 2)
    wait_for(process, lambda: store.read_text().count(",cell_seconds,") >= stored + more)
    time.sleep(rng.uniform(0.0, MAX_PAUSE))
    if process.poll() is not None:
        return False
    os.kill(process.pid, signal.SIGKILL)
    return process.wait() == -signal.SIGKILL


def wait_for(process: subprocess.Popen, condition) -> None:
    while process.poll() is None and not condition():
        time.sleep(0.01)


def finished_blocks(out: Path) -> dict[str, pd.DataFrame]:
    if not (out / "results.csv").exists():
        return {}
    frame = read_results(out)
    return {cell: rows.reset_index(drop=True) for cell, rows in frame.groupby("cell")}


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.assign(value=frame["value"].where(frame["metric"] != "cell_seconds"))
    return frame.sort_values(["cell", "metric", "round"]).reset_index(drop=True)


@pytest.mark.slow  # six grid processes, 47 s; the default run kills a run (test_checkpoint) and a benchmark (test_worst_case)
def test_killed_grid_loses_nothing_and_ends_as_an_uninterrupted_run(tmp_path):
    path = tmp_path / "kill.toml"
    path.write_text(GRID)
    reference = tmp_path / "reference"
    cells = run_grid(load_grid(path), reference)["cells"]

    out, rng = tmp_path / "killed", random.Random(17)
    seen: dict[str, pd.DataFrame] = {}
    partial = 0
    for _ in range(KILLS):
        if not kill_at_random_point(start(path, out), out, rng):
            break
        blocks = finished_blocks(out)
        for cell, rows in seen.items():  # every cell finished before a kill is there, unchanged (never rerun)
            pd.testing.assert_frame_equal(blocks[cell], rows)
        seen.update(blocks)
        partial += 0 < len(blocks) < cells
    assert partial >= 1, "no kill landed while cells were being stored"
    done = start(path, out)
    assert done.wait(timeout=120) == 0
    frame = pd.read_csv(out / "results.csv")  # the raw file, cleaned by the last run's open
    assert (frame.groupby("cell")["metric"].apply(lambda m: int((m == "cell_seconds").sum())) == 1).all()
    assert frame["cell"].nunique() == cells and (frame["status"] == "ok").all()
    for cell, rows in seen.items():
        pd.testing.assert_frame_equal(finished_blocks(out)[cell], rows)
    pd.testing.assert_frame_equal(comparable(frame), comparable(pd.read_csv(reference / "results.csv")))


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited one not yet reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_pool_workers_end_with_a_killed_grid_process():
    """``--jobs N``: SIGKILL of the grid's process leaves no worker running its cell
    for nobody (nor idling afterwards, nor racing a rerun for the cell's checkpoint)."""
    process = subprocess.Popen([sys.executable, "-c", POOL_KILLED, "2.0"], cwd=ROOT,  # workers busy with cells
                               stdout=subprocess.PIPE, text=True)
    with process.stdout:  # the workers inherit the pipe: read the line, not to its end
        workers = [int(pid) for pid in process.stdout.readline().split()]
    try:
        assert process.wait(timeout=120) == -signal.SIGKILL and len(workers) == 2
        deadline = time.monotonic() + 15
        while any(map(alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(alive, workers)), "pool workers outlived the grid process"
    finally:
        for pid in filter(alive, workers):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_whose_grid_died_while_it_started_exits_before_taking_a_cell():
    """A pool worker imports for seconds before its initializer runs; if the grid's
    process died meanwhile, the initializer ends the worker at once (exit status 1),
    before it could take a queued cell and write for nobody."""
    script = "import os\nfrom robust_pfl.backends import exit_with_parent\nexit_with_parent(os.getppid() + 10**7)\nprint('took a cell')"
    finished = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 1 and "took a cell" not in finished.stdout


POOL_KILLED = """
import os, signal, sys, threading, time
from robust_pfl.backends import LocalBackend
from robust_pfl.cells import CellTask
config = {"seeds": [0], "rounds": 10**6, "task": {"clusters": 1, "clients_per_cluster": 2},
          "methods": [{"name": "local"}]}
backend = LocalBackend(jobs=2)
tasks = [CellTask(str(i), config, "busy cell", None, 1) for i in range(2)]
threading.Thread(target=lambda: next(backend.map_unordered(tasks)), daemon=True).start()
while backend._pool is None or len(backend._pool._processes) < 2:
    time.sleep(0.01)
print(*backend._pool._processes, flush=True)
time.sleep(float(sys.argv[1]))  # < 2 s: the workers are still starting (importing torch)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0])
def test_no_worker_of_a_grid_killed_while_they_start_is_alive_a_second_later(delay):
    """Workers are armed on their first import of the package, before torch: a grid
    SIGKILLed while they start leaves none alive one second later (a worker still in
    the interpreter's own start-up finds its parent gone and exits when it reaches the
    package)."""
    process = subprocess.Popen([sys.executable, "-c", POOL_KILLED, str(delay)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    with process.stdout:
        workers = [int(pid) for pid in process.stdout.readline().split()]
    try:
        assert process.wait(timeout=120) == -signal.SIGKILL and len(workers) == 2
        time.sleep(1.0)
        assert not any(map(alive, workers)), "a pool worker outlived the killed grid by a second"
    finally:
        for pid in filter(alive, workers):
            os.kill(pid, signal.SIGKILL)
