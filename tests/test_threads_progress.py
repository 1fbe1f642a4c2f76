"""One thread policy for every command (``--threads`` before or after the subcommand,
default one torch thread) and progress that shows where stderr is not a terminal
(periodic lines, a line per finished method x seed, grid cell or theory check)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest
import torch

from robust_pfl import cli, experiments
from robust_pfl.config import parse_config
from robust_pfl.engine import progress
from robust_pfl.engine.progress import ProgressLines, progress_bar

ROOT = Path(__file__).resolve().parents[1]

TINY = """\
seeds = [0]
rounds = 4
eval_every = 2
[task]
name = "synthetic_linear"
clusters = 2
clients_per_cluster = 3
[[methods]]
name = "fc"
lr = 0.05
[[methods]]
name = "local"
lr = 0.05
"""


@pytest.fixture
def tiny_config(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture
def threads_seen(monkeypatch):
    """Replace the run with a hook that records torch's thread count inside it."""
    seen: list[int] = []

    def run_experiment(config, out, resume=False, validated=False, **extra):
        seen.append(torch.get_num_threads())
        return {"final": {}}

    monkeypatch.setattr(experiments, "run_experiment", run_experiment)
    return seen


@pytest.fixture
def two_threads():
    """torch on two threads around the test (what torch picks on a 2-core machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def test_threads_after_the_subcommand_set_torchs_threads(tiny_config, tmp_path, threads_seen, two_threads):
    assert cli.main(["run", str(tiny_config), "--out", str(tmp_path / "a"), "--threads", "3"]) == 0
    assert cli.main(["--threads", "3", "run", str(tiny_config), "--out", str(tmp_path / "b")]) == 0
    assert threads_seen == [3, 3]
    assert torch.get_num_threads() == 2  # main() restores the caller's count


class FakeClock:
    """A :class:`LoadClock` whose other processes keep ``load[0]`` cores busy."""

    def __init__(self, load: list[float | None]) -> None:
        self.load = load

    def since(self) -> float:
        return 60.0

    def others(self) -> float | None:
        return self.load[0]


@pytest.mark.parametrize("others, expected", [(0.0, 2), (0.4, 2), (0.6, 1), (1.0, 1), (3.0, 1), (None, 1)])
def test_the_default_for_run_is_the_free_cores(tiny_config, tmp_path, monkeypatch, two_threads, others, expected):
    """No --threads: ``auto``; the run's work gets the cores other processes leave free
    (None: no /proc/stat, one thread)."""
    from robust_pfl.engine import threads

    seen, real = [], experiments.run_method
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads, "LoadClock", lambda: FakeClock([others]))
    monkeypatch.setattr(experiments, "run_method", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    torch.set_num_threads(3)
    assert cli.DEFAULT_THREADS == "auto"
    assert cli.main(["run", str(tiny_config), "--out", str(tmp_path / "out")]) == 0
    assert seen == [expected, expected]  # fc and local
    assert torch.get_num_threads() == 3  # restored
    assert cli.main(["run", str(tiny_config), "--out", str(tmp_path / "again"), "--threads", "auto"]) == 0
    assert seen[2:] == [expected, expected]


def test_auto_threads_follow_the_load_while_running(monkeypatch, two_threads):
    from robust_pfl.engine.threads import AutoThreads

    load, slept = [0.0], []
    policy = AutoThreads(cores=2, every=5.0, clock=FakeClock(load), sleep=slept.append)
    torch.set_num_threads(1)
    policy.check()
    assert torch.get_num_threads() == 2 and slept == [0.0]  # the first check decides at once
    load[0] = 1.0  # another job starts: checked again only after `every` seconds
    policy.clock.since = lambda: 1.0
    policy.check()
    assert torch.get_num_threads() == 2
    policy.clock.since = lambda: 6.0
    policy.check()
    assert torch.get_num_threads() == 1
    load[0] = 0.1  # it ends
    policy.check()
    assert torch.get_num_threads() == 2


def test_load_clock_counts_other_processes_only():
    from robust_pfl.engine.threads import LoadClock, free_threads

    busy, own, now = iter([100.0, 103.0]), iter([5.0, 6.0]), iter([10.0, 12.0])
    clock = LoadClock(busy=lambda: next(busy), own=lambda: next(own), clock=lambda: next(now))
    assert clock.others() == pytest.approx(1.0)  # 3 busy CPU-seconds in 2 s, 1 of them this process's
    assert LoadClock(busy=lambda: None).others() is None
    assert [free_threads(4, x) for x in (0.0, 0.5, 1.4, 2.6, 9.0)] == [4, 3, 3, 1, 1]


def test_theory_report_takes_threads_after_the_subcommand(tmp_path, monkeypatch, two_threads):
    import theory_checks.report as report

    seen = []

    def write_report(out, budget="quick", names=None, seeds=1, runner=None):
        seen.append(torch.get_num_threads())
        (tmp_path / "r.md").write_text("# Theory checks\n")  # the command heads it with its provenance
        return {"statuses": {}, "kinds": {}, "contradictions": [], "seconds": 0.0,
                "paths": {"report": str(tmp_path / "r.md")}}

    monkeypatch.setattr(report, "write_report", write_report)
    assert cli.main(["theory", "report", "--quick", "--out", str(tmp_path), "--threads", "2"]) == 0
    assert cli.main(["theory", "report", "--quick", "--out", str(tmp_path)]) == 0
    assert seen == [2, 1]


def test_threads_after_grid_set_each_cells_threads(tmp_path, monkeypatch):
    from robust_pfl import grid as grid_module

    seen = []
    monkeypatch.setattr(grid_module, "run_grid",
                        lambda grid, out, backend: seen.append(grid.resources.threads) or
                        {"cells": 0, "ran": 0, "skipped": 0, "errors": 0, "errored": {}, "results": ""})
    path = tmp_path / "g.toml"
    path.write_text(TINY + "[grid]\nbyzantine.total = [0, 1]\n")
    assert cli.main(["grid", str(path), "--out", str(tmp_path / "out"), "--threads", "2"]) == 0
    assert cli.main(["grid", str(path), "--out", str(tmp_path / "out")]) == 0
    assert seen == [2, 1]  # without --threads: the grid's [resources] cpus (default 1)


def test_bad_thread_count_after_the_subcommand_exits_2(tiny_config, capsys):
    assert cli.main(["run", str(tiny_config), "--threads", "0"]) == 2
    assert "--threads must be >= 1" in capsys.readouterr().err


def test_every_subcommand_takes_threads_and_quiet():
    parser = cli.build_parser()
    for argv in (["run", "c.toml"], ["reproduce", "fig3"], ["grid", "g.toml"], ["attack-table"],
                 ["theory", "report"], ["plot", "r.csv"], ["attacks"]):
        args = parser.parse_args([*argv, "--threads", "4", "--quiet"])
        assert (args.threads, args.quiet) == (4, True)
        args = parser.parse_args(["--threads", "4", "--quiet", *argv])  # before: not undone by the subcommand
        assert (args.threads, args.quiet) == (4, True)
        assert (parser.parse_args(argv).threads, parser.parse_args(argv).quiet) == (None, False)


def test_progress_lines_when_stderr_is_not_a_terminal(tiny_config, tmp_path):
    """A run with stderr to a pipe writes periodic lines (method, round, elapsed, ETA)
    and one per finished method x seed."""
    env = {**os.environ, "ROBUST_PFL_PROGRESS_INTERVAL": "0"}
    env.pop("ROBUST_PFL_QUIET", None)
    finished = subprocess.run(
        [sys.executable, "-m", "robust_pfl.cli", "run", str(tiny_config), "--out", str(tmp_path / "out")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300,
    )
    assert finished.returncode == 0, finished.stderr
    lines = finished.stderr.splitlines()
    periodic = [line for line in lines if "round" in line and "ETA" in line]
    assert periodic and all(line.startswith("robust-pfl run: ") and "elapsed" in line for line in periodic)
    assert any("fc seed=0 round 2/4" in line for line in periodic)
    assert any(line.startswith("robust-pfl run: fc seed=0 done (") for line in lines)
    assert any(line.startswith("robust-pfl run: local seed=0 done (") for line in lines)
    assert lines[-1].startswith("robust-pfl run: local seed=0 done (") and "; 8/8 (100%), " in lines[-1]


def test_quiet_silences_progress(tiny_config, tmp_path, capsys):
    assert cli.main(["run", str(tiny_config), "--out", str(tmp_path / "loud")]) == 0
    assert "robust-pfl run: fc seed=0 done" in capsys.readouterr().err
    assert cli.main(["run", str(tiny_config), "--out", str(tmp_path / "quiet"), "--quiet"]) == 0
    assert "robust-pfl run" not in capsys.readouterr().err
    assert "ROBUST_PFL_QUIET" not in os.environ  # restored after the command


def test_grid_reports_each_finished_cell(tmp_path, capsys):
    from robust_pfl.grid import run_grid
    from robust_pfl.grid_file import expand_grid
    import tomllib

    grid = expand_grid(tomllib.loads(TINY + "[grid]\nbyzantine.total = [0, 1]\n"), "tiny.toml")
    run_grid(grid, tmp_path / "out")
    lines = [line for line in capsys.readouterr().err.splitlines() if " done: " in line]
    assert len(lines) == 4
    for count, line in enumerate(lines, start=1):
        assert line.startswith(f"grid tiny.toml: cell {count}/4 done: ") and " s); " in line
    assert sum("method=fc" in line for line in lines) == 2


def test_theory_report_reports_each_check(tmp_path, monkeypatch, capsys):
    from theory_checks.report import write_report
    from theory_checks.statements import registry
    from theory_checks.statements.registry import Statement
    from theory_checks.types import CheckResult

    statements = {name: Statement(name, "Eq. (1)", f"claim of {name}", "exact",
                                  lambda budget, seed, name=name: CheckResult(name, "holds"), "")
                  for name in ("a", "b")}
    monkeypatch.setattr(registry, "STATEMENTS", statements)
    write_report(tmp_path, budget="quick", seeds=2)
    err = capsys.readouterr().err
    for name in ("a", "b"):
        for seed in (0, 1):
            assert f"theory report (quick): {name} seed={seed}: holds (" in err
    with pytest.raises(ValueError, match="unknown statements"):
        write_report(tmp_path, names=["nosuch"])


def test_progress_lines_are_rate_limited(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    clock = iter([0.0, 1.0, 2.0, 12.0, 13.0, 30.0, 31.0, 32.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with ProgressLines(10, "job", interval=10.0) as bar:  # start at t = 0
        bar.set_postfix_str("m seed=0")
        bar.update()  # t = 1: too soon
        bar.update()  # t = 2: too soon
        bar.update()  # t = 12: a line (then t = 13 for its clock)
        bar.update(7)  # t = 30: the end, no periodic line
    lines = stream.getvalue().splitlines()
    assert lines[0] == "job: 3/10 (30%), m seed=0, 13 s elapsed, ETA 30 s"
    assert lines[1].startswith("job: 10/10 (100%), finished, ")
    assert len(lines) == 2


def test_a_bar_on_a_terminal_and_in_jupyter(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress_bar(3, "job")
    assert not isinstance(bar, ProgressLines)
    bar.update(1)
    bar.item_done("no line: the bar shows it")
    bar.close()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert not isinstance(progress_bar(3, "job"), ProgressLines)
    monkeypatch.delitem(sys.modules, "ipykernel")
    assert isinstance(progress_bar(3, "job"), ProgressLines)
    assert not isinstance(progress_bar(3, "job", enabled=False), ProgressLines)


# -- the ETA's cost model (issue 44) -------------------------------------------------------------
def test_eta_after_a_costly_first_item_follows_the_cost_model(monkeypatch):
    """Two items of 10 units: the first costs 1 a unit, the second 0.1.  The first
    takes 10 s, so the cost model leaves 1 s (10 x 0.1 at its pace of 1 s per unit of
    cost); extrapolating by units would say 10 s, the error the issue saw (FC first)."""
    naive = ProgressLines(20, "job")
    assert naive.remaining(10.0) is None  # nothing done: no ETA
    naive.n = 10
    assert naive.remaining(10.0) == pytest.approx(10.0)  # without costs: by units
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    clock = iter([0.0, 10.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    bar = ProgressLines(20, "job", interval=1e9, costs=progress.WorkCosts([(10, 1.0), (10, 0.1)], 20))
    bar.item_done("first done", advance=10)  # t = 10
    line = stream.getvalue().strip()
    assert line == "job: first done; 10/20 (50%), 10 s elapsed, ETA 1.0 s"


def test_eta_of_units_finishing_out_of_order_counts_their_own_cost():
    """A grid's cells finish in any order: the cost given with them, not the next in
    line, is what is done."""
    bar = ProgressLines(2, "grid", interval=1e9, costs=progress.WorkCosts([(1, 9.0), (1, 1.0)], 2))
    bar.update(1, cost=1.0)  # the cheap cell finished first
    assert bar.remaining(5.0) == pytest.approx(45.0)  # 5 s for a cost of 1; 9 left


def test_a_bar_advances_by_cost_share(monkeypatch):
    """On a terminal the tqdm bar counts cost scaled to the units, so its own rate and
    ETA are the cost model's."""
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress_bar(20, "job", enabled=True, costs=[(10, 1.0), (10, 0.1)])
    bar.update(10)
    assert bar.bar.n == pytest.approx(20 * 10 / 11)
    bar.close()


def test_a_run_weighs_its_methods_rounds_by_their_estimated_cost(tiny_config, monkeypatch):
    """run_table hands the bar each method's rounds at its estimated seconds a round
    (robust_pfl.costs.round_seconds), and FC's clustering rounds cost more than Local's."""
    seen = {}
    real = experiments.progress_bar

    def spy(total, description, enabled=None, interval=None, costs=None):
        seen.update(total=total, costs=costs)
        return real(total, description, False)

    monkeypatch.setattr(experiments, "progress_bar", spy)
    config = experiments.validate(parse_config({**tomllib.loads(TINY), "seeds": [0, 1]}))
    experiments.run_table(config, validated=True)
    fc, local = experiments.built(config).round_seconds
    assert seen == {"total": 16, "costs": [(4, fc), (4, local), (4, fc), (4, local)]}
    assert fc > local


def test_a_grid_weighs_each_cell_by_its_estimate(tmp_path, monkeypatch):
    """run_grid hands the bar each cell's cost estimate (a cell of FC outweighs one of
    Local), and each finished cell counts that cost, whatever order cells finish in."""
    from robust_pfl import grid as grid_module
    from robust_pfl.grid_file import expand_grid

    seen, real = {}, grid_module.progress_bar

    def spy(total, description, enabled=None, interval=None, costs=None):
        bar = real(total, description, True, 1e9, costs)
        seen.update(costs=costs, bar=bar)
        return bar

    monkeypatch.setattr(grid_module, "progress_bar", spy)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # lines, not a bar
    grid = expand_grid(tomllib.loads(TINY + "[grid]\nbyzantine.total = [0]\n"), "tiny.toml")
    grid_module.run_grid(grid, tmp_path / "out")
    fc, local = (cell.seconds for cell in grid.cells)
    assert seen["costs"] == [(1, fc), (1, local)] and fc > local > 0
    assert seen["bar"].cost_done == pytest.approx(fc + local)


# -- checkpoint lines only under --verbose (issue 44) ----------------------------------------------
CHECKPOINTED = TINY.replace("rounds = 4\n", "rounds = 4\ncheckpoint_every = 2\n", 1)


@pytest.mark.parametrize("command, extra", [("run", ""), ("grid", "[grid]\nbyzantine.total = [0]\n")])
def test_checkpoint_lines_only_under_verbose(tmp_path, capsys, command, extra):
    """A checkpointed run or grid writes no line per checkpoint by default (they were
    230 of the 261 lines of ``reproduce fig6 --quick``); ``--verbose`` adds them."""
    config = tmp_path / "tiny.toml"
    config.write_text(CHECKPOINTED + extra)
    for flags, expected in (([], 0), (["--verbose"], 4)):  # 2 methods x checkpoints at rounds 2 and 4
        out = tmp_path / f"out{len(flags)}"
        assert cli.main([command, str(config), "--out", str(out), *flags]) == 0
        err = capsys.readouterr().err
        assert sum("checkpointed" in line for line in err.splitlines()) == expected, err
        assert "ROBUST_PFL_VERBOSE" not in os.environ  # restored after the command


def test_a_run_is_bit_identical_at_one_and_two_threads():
    """What the thread policy relies on when it changes the count mid-run: the quick
    start's task with a 75,010-parameter MLP (above torch's parallel grain, so sums and
    products split across threads), FC, the median and Global under large gradients."""
    import robust_pfl

    config = tomllib.loads((Path(__file__).resolve().parents[1] / "configs" / "quickstart.toml").read_text())
    config.update(rounds=6, eval_every=3)
    config["task"]["model"] = {"name": "mlp", "hidden": [1000]}
    config["methods"] = [m for m in config["methods"] if m.get("label", m["name"]) in ("fc", "global+median", "global")]
    histories = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            histories.append(robust_pfl.run(config, progress=False))
    finally:
        torch.set_num_threads(before)
    assert histories[0].equals(histories[1])
