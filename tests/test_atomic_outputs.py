"""Outputs are written atomically, and summary.json is the completion mark: wherever
a summary.json exists, every output beside it is from the same finished call
(robust_pfl.engine.results module docstring), whatever point a run is killed at."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from robust_pfl.engine import results
from robust_pfl.engine.results import SUMMARY, save_png, write_outputs

OUTPUTS = ("table.md", "history.csv", "figure.png")


class Killed(BaseException):
    """Stands for a kill: nothing after it runs (BaseException, like KeyboardInterrupt)."""


def generation(out: Path, name: str) -> int:
    """The generation a file was written by (every file of generation g holds g)."""
    text = (out / name).read_text()
    return json.loads(text)["generation"] if name == SUMMARY else int(text.split()[-1])


def write_generation(out: Path, g: int) -> None:
    files = {name: f"{name} {g}" for name in OUTPUTS[:2]}
    files["figure.png"] = lambda path: path.write_text(f"figure.png {g}")
    write_outputs(out, {"generation": g}, files)


def assert_invariant(out: Path) -> None:
    """A summary.json certifies every output beside it; no temporary file is left."""
    names = sorted(p.name for p in out.iterdir())
    assert [n for n in names if n.startswith(".")] == []
    if SUMMARY in names:
        g = generation(out, SUMMARY)
        assert {generation(out, n) for n in OUTPUTS} == {g}


def fail(path: Path) -> None:
    raise Killed()


@pytest.mark.parametrize("stage", range(len(OUTPUTS) + 1))
def test_a_failure_while_staging_leaves_the_previous_set(tmp_path, stage):
    write_generation(tmp_path, 1)
    files = {name: f"{name} 2" for name in OUTPUTS}
    summary = {"generation": 2}
    if stage < len(OUTPUTS):
        files[OUTPUTS[stage]] = fail
    else:
        summary = {"generation": object()}  # not JSON: the summary itself fails to stage
    with pytest.raises((Killed, TypeError)):
        write_outputs(tmp_path, summary, files)
    assert_invariant(tmp_path)
    assert {generation(tmp_path, n) for n in (*OUTPUTS, SUMMARY)} == {1}


@pytest.mark.parametrize("moves", range(len(OUTPUTS) + 2))
def test_a_kill_at_any_move_never_leaves_a_stale_summary(tmp_path, monkeypatch, moves):
    """Kill after ``moves`` successful renames (0 .. all of them, summary included)."""
    write_generation(tmp_path, 1)
    done = []
    real_replace = os.replace

    def replace(source, target):
        if len(done) == moves:
            raise Killed()
        real_replace(source, target)
        done.append(Path(target).name)

    monkeypatch.setattr(results.os, "replace", replace)
    if moves <= len(OUTPUTS):
        with pytest.raises(Killed):
            write_generation(tmp_path, 2)
    else:
        write_generation(tmp_path, 2)
    assert done == [*OUTPUTS, SUMMARY][:moves]
    assert_invariant(tmp_path)
    assert (tmp_path / SUMMARY).exists() == (moves in (len(OUTPUTS) + 1,))
    assert {generation(tmp_path, n) for n in OUTPUTS[:moves]} <= {2}


def test_summary_cannot_be_passed_as_a_file(tmp_path):
    with pytest.raises(ValueError, match="summary.json is written from the summary, not from files"):
        write_outputs(tmp_path, {}, {SUMMARY: "{}"})


CHILD = """
import sys
from pathlib import Path
from robust_pfl.engine.results import write_outputs
out = Path(sys.argv[1])
g = 0
while True:
    g += 1
    files = {name: f"{name} {g}" * 2000 for name in ("table.md", "history.csv", "figure.png")}
    write_outputs(out, {"generation": g}, files)
"""


def test_sigkilled_writers_never_leave_new_outputs_next_to_a_stale_summary(tmp_path):
    """Real SIGKILLs at several moments of a writer that rewrites its outputs in a loop."""
    out = tmp_path / "out"
    for delay in (0.05, 0.11, 0.17, 0.23, 0.29):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], cwd=Path(__file__).resolve().parents[1])
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if (out / SUMMARY).exists():  # a kill can leave a staged file too; it is never read
            g = json.loads((out / SUMMARY).read_text())["generation"]
            for name in ("table.md", "history.csv", "figure.png"):
                assert (out / name).read_text() == f"{name} {g}" * 2000
    # the next write of the same files sweeps what the killed ones left staged
    write_outputs(out, {"generation": 0}, {name: "final" for name in ("table.md", "history.csv", "figure.png")})
    assert sorted(path.name for path in out.iterdir()) == sorted(["table.md", "history.csv", "figure.png", SUMMARY])


def test_a_temporary_left_by_a_killed_write_is_removed_by_the_next_write_of_that_file(tmp_path):
    left = tmp_path / ".history.csv.k2j4x9.csv"
    other = tmp_path / ".notes.md.a1b2c3.md"  # another file's temporary: not this write's to remove
    left.write_text("partial")
    other.write_text("partial")
    write_outputs(tmp_path, {"generation": 1}, {"history.csv": "round,value\n"})
    assert not left.exists() and other.exists()


# -- every recipe and `run` write through write_outputs --------------------------------------
@pytest.fixture
def replaced(monkeypatch):
    """The paths moved into place by os.replace, in order, with whether a summary.json
    was present beside each at that moment."""
    log: list[tuple[Path, bool]] = []
    real_replace = os.replace

    def replace(source, target):
        log.append((Path(target), (Path(target).parent / SUMMARY).exists()))
        real_replace(source, target)

    monkeypatch.setattr(results.os, "replace", replace)
    return log


def assert_written_last_by_replace(out: Path, log: list[tuple[Path, bool]], expected: set[str]) -> None:
    """Every file in ``out`` (but a grid's lock) was moved into place by one os.replace,
    summary.json last, and none while an old summary.json was present (a grid's store
    in a folder below has its own summary.json)."""
    names = [path.name for path, _ in log if path.parent == out]
    assert {p.name for p in out.iterdir() if p.is_file() and p.name != ".lock"} == expected | {SUMMARY}
    assert sorted(names[:-1]) == sorted(expected) and names[-1] == SUMMARY
    assert not any(present for path, present in log if path.parent == out)


TINY_TABLE = """rounds = 2
[task]
clusters = 1
clients_per_cluster = 4
[byzantine]
total = 1
[[methods]]
name = "global"
aggregator = "median"
[grid]
attack = [{ name = "none" }]
"""


def test_attack_table_outputs_are_atomic_and_summary_last(tmp_path, monkeypatch, replaced):
    from robust_pfl.recipes import attack_table

    (tmp_path / "attack_table.toml").write_text(TINY_TABLE)
    monkeypatch.setattr(attack_table, "CONFIGS", tmp_path)
    tiny = attack_table.Table("attack_table.toml", attack_table.Mode(rounds=2, seeds=1), "relative_error")
    monkeypatch.setattr(attack_table, "TABLES", {"synthetic": tiny})
    out = tmp_path / "out"
    attack_table.main(out, quick=True)
    first = [(path.name, present) for path, present in replaced if path.parent == out]
    replaced.clear()
    attack_table.main(out, quick=True)  # a rerun replaces a complete set
    assert first == [(path.name, present) for path, present in replaced if path.parent == out]
    assert_written_last_by_replace(out, replaced, {"attack_table.md", "history.csv"})


def test_table1_outputs_are_atomic_and_summary_last(tmp_path, monkeypatch, replaced):
    from robust_pfl import experiments
    from robust_pfl.recipes import table1

    monkeypatch.setattr(table1, "DIGITS_QUICK", table1.Mode(epochs=1, seeds=1, clients_per_cluster=2, batch=16))
    monkeypatch.setattr(table1, "methods", lambda kind, clients: {"Local": {"name": "local"}})
    final = [{"round": 1, "metric": metric, "value": 0.5} for metric in ("test_accuracy", "test_loss")]
    # no training: the writes are tested
    monkeypatch.setattr(experiments, "run_cell_config", lambda payload, source, **options: final)
    table1.main(tmp_path, quick=True)
    assert_written_last_by_replace(tmp_path, replaced, {"table1.md", "history.csv"})


def test_fig7_outputs_are_atomic_and_summary_last(tmp_path, monkeypatch, replaced):
    from robust_pfl.recipes import fig7

    monkeypatch.setattr(fig7, "STDS", (0.5,))
    monkeypatch.setattr(fig7, "QUICK", fig7.Mode(iterations=3, repeats=1))
    fig7.run(tmp_path, quick=True)
    assert_written_last_by_replace(tmp_path, replaced, {"fig7.md", "fig7.png", "history.csv"})
    assert (tmp_path / "fig7.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fig2_outputs_are_atomic_and_summary_last(tmp_path, monkeypatch, replaced):
    from robust_pfl.recipes import fig2

    monkeypatch.setattr(fig2, "QUICK", fig2.Mode(rounds=4, every=2, seeds=1))
    fig2.run(tmp_path, quick=True, progress=False)
    assert_written_last_by_replace(tmp_path, replaced, {"fig2.md", "fig2.png", "history.csv"})


def test_fig3_outputs_are_atomic_and_summary_last(tmp_path, monkeypatch, replaced):
    from robust_pfl.recipes import fig3
    from robust_pfl.engine.results import ResultTable

    def run_method(spec, config, seed, on_round=None, task=None):  # no training: the writes are tested
        table = ResultTable()
        for round_index in (0, config.rounds):
            metrics = {"param_error": 1.0 / (1 + round_index), "validation_loss": 1.0, "test_loss": 1.0}
            table.add(spec.display, seed, round_index, metrics)
        return table

    monkeypatch.setattr(fig3, "run_method", run_method)
    fig3.run(tmp_path, quick=True, progress=False)
    assert_written_last_by_replace(tmp_path, replaced, {"fig3.md", "fig3.png", "history.csv"})


def test_run_command_outputs_are_atomic_and_summary_last(tmp_path, replaced):
    from robust_pfl.engine.results import ResultTable, write_results

    table = ResultTable()
    table.add("local", 0, 1, {"loss": 1.0})
    write_results(table, tmp_path, {})
    assert_written_last_by_replace(tmp_path, replaced, {"history.csv"})


# -- PNGs -------------------------------------------------------------------------------------
def test_save_png_replaces_atomically_and_keeps_the_old_file_on_failure(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(1, 1))
    target = tmp_path / "plot.png"
    save_png(figure, target)
    first = target.read_bytes()
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        save_png(figure, target, dpi=-1)  # matplotlib rejects it mid-write
    plt.close(figure)
    assert target.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_theory_report_figures_use_the_core_helper_and_the_core_needs_no_theory_checks():
    import theory_checks.report_figures as report_figures

    assert report_figures.save_png is save_png
    probe = "import sys, robust_pfl.engine.results; print('theory_checks' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "False"
