"""The worst-case benchmark end to end (issues 41, 53): tuning that never reads the
test split, racing against the full factorial, a benchmark killed and resumed, the
file's errors, and the command's outputs (the verdicts on hand-made runs:
tests/test_benchmark_verdicts.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from robust_pfl.cli import main
from robust_pfl.config import ConfigError
from robust_pfl.experiments import worst_cluster_mean
from robust_pfl.grid import read_results
from robust_pfl.worst_case import run_benchmark
from robust_pfl.worst_case.plan import BACKDOOR, ROBUST, build_plan
from robust_pfl.worst_case.loading import load_benchmark

ROOT = Path(__file__).resolve().parents[1]

TINY = textwrap.dedent("""
    rounds = 4
    eval_every = 1
    batch_size = 8
    seeds = [0, 1, 2]

    [task]
    name = "image"
    dataset = "digits"
    kind = "private_label"
    clusters = 2
    clients_per_cluster = 4
    model = { name = "mlp", hidden = [8] }

    [benchmark]
    fractions = [0.0, 0.2]
    attacks = ["alie", "bit_flip"]
    backdoors = []

    [[benchmark.heterogeneity]]
    label = "K2"

    [[defenses]]
    label = "FC"
    name = "fc"
    tune = { lr = [0.02, 0.2] }

    [[defenses]]
    label = "Global+krum"
    name = "global"
    aggregator = "krum"
    lr = 0.1
""")


def tiny(tmp_path: Path, text: str = TINY) -> Path:
    path = tmp_path / "bench.toml"
    path.write_text(text)
    return path


def test_worst_cluster_mean_by_hand():
    values = torch.tensor([1.0, 0.5, 0.2, 0.4, 9.0])
    clusters = torch.tensor([0, 0, 1, 1, 1])
    honest = torch.tensor([True, True, True, True, False])
    assert worst_cluster_mean(values, clusters, honest) == pytest.approx(0.3)


# -- end to end -----------------------------------------------------------------------------
def test_a_tiny_benchmark_runs_and_writes_its_tables(tmp_path, capsys, monkeypatch):
    import matplotlib

    # a level label with TeX in it, and a matplotlibrc asking for LaTeX: the labels are
    # still drawn as text (no LaTeX run, no mathtext parse) and the figures written
    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)
    path = tiny(tmp_path, TINY.replace('label = "K2"', "label = 'K2 $\\frac{1}$'"))
    out = tmp_path / "out"
    assert main(["benchmark", str(path), "--out", str(out), "--page", str(tmp_path / "page" / "b.md")]) == 0
    table = pd.read_csv(out / "worst_case.csv")
    assert set(table["method"]) == {"FC", "Global+krum"}
    assert set(table["fraction"]) == {0.0, 0.2}
    assert set(table.loc[table["fraction"] == 0.2, "worst_attack"]) <= {"alie", "bit_flip"}
    tuning = pd.read_csv(out / "tuning.csv")
    assert set(tuning.loc[tuning["method"] == "FC", "candidates"]) == {2}
    page = (tmp_path / "page" / "b.md").read_text()
    assert "Worst-case test accuracy" in page and "b_worst_case_heatmaps.png" in page
    assert (tmp_path / "page" / "b_worst_case_heatmaps.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["results", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| FC (" in text and "f = 0.2" in text
    assert main(["results", str(out), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("method,heterogeneity,fraction,worst")


def test_tuning_chooses_the_same_settings_when_the_test_labels_change(tmp_path, monkeypatch):
    """The test split's labels replaced (every test label moved to the next class): the
    test accuracies change, the chosen settings do not."""
    import robust_pfl.experiments as experiments

    path = tiny(tmp_path)
    first = run_benchmark(path, tmp_path / "a", say=lambda line: None, progress=False)
    original = experiments._dataset

    def relabelled(name, data_dir):
        data = original(name, data_dir)
        return replace(data, test_labels=(data.test_labels + 1) % data.num_classes)

    monkeypatch.setattr(experiments, "_dataset", relabelled)
    second = run_benchmark(path, tmp_path / "b", say=lambda line: None, progress=False)
    both = first.finals.merge(second.finals, on="cell", suffixes=("", "_relabelled"))
    assert len(both) and not both["test_accuracy"].equals(both["test_accuracy_relabelled"])
    assert both["validation_accuracy"].tolist() == both["validation_accuracy_relabelled"].tolist()
    # the seeds an open verdict takes may differ (they read test accuracies); the choices may not
    assert first.chosen.equals(second.chosen)


def test_combinations_that_cannot_run_are_listed_not_applicable(tmp_path):
    text = TINY.replace('fractions = [0.0, 0.2]', 'fractions = [0.0, 0.3]').replace(
        'aggregator = "krum"', 'aggregator = "bulyan"')
    spec = load_benchmark(tiny(tmp_path, text))
    plan = build_plan(spec)
    skipped = [row for row in plan.not_applicable if row["method"] == "Global+krum"]
    assert {row["fraction"] for row in skipped} == {0.3}
    assert all("bulyan" in row["reason"] for row in skipped)
    assert all(key[0] == "FC" for key in plan.combos if key[3] == 0.3)


def test_the_default_attack_set_is_every_registered_attack_and_backdoors_apart(tmp_path):
    import attacks
    from robust_pfl.engine.types import BackdoorAttack
    from robust_pfl.worst_case.plan import attack_set

    text = TINY.replace('attacks = ["alie", "bit_flip"]\nbackdoors = []\n', "")
    entries = attack_set(load_benchmark(tiny(tmp_path, text)))
    backdoors = {n for n, cls in attacks.REGISTRY.items() if issubclass(cls, BackdoorAttack)}
    assert {e.label for e in entries if e.section == BACKDOOR} == backdoors
    assert {e.label for e in entries if e.section == ROBUST} == set(attacks.REGISTRY) - backdoors - {"none"}


def test_a_killed_benchmark_resumes_without_recomputing_a_finished_cell(tmp_path):
    path = tiny(tmp_path, TINY.replace("rounds = 4", "rounds = 40"))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "robust_pfl.cli", "benchmark", str(path), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True)
    store = out / "results.csv"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if store.exists() and store.read_text().count("cell_seconds") >= 3:
                break
            time.sleep(0.05)
        assert process.poll() is None, f"the benchmark ended (status {process.returncode}) before the kill:\n{log.read_text()}"
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    finished = set(read_results(out)["cell"])
    assert len(finished) >= 3 and not (out / "worst_case.csv").exists()  # killed mid-run
    result = run_benchmark(path, out, say=lambda line: None, progress=False)
    assert result.summary["skipped"] == len(finished) and result.summary["ran"] == len(result.plan.cells) - len(finished)
    blocks = read_results(out)
    per_cell = blocks[blocks["metric"] == "cell_seconds"].groupby("cell").size()
    assert (per_cell == 1).all() and len(per_cell) == len(result.plan.cells)
    again = run_benchmark(path, tmp_path / "fresh", say=lambda line: None, progress=False)
    assert again.table.drop(columns=[]).equals(result.table)  # the same runs and verdicts as without the kill


def test_a_run_whose_every_cell_errored_exits_1_listing_the_errors(tmp_path, capsys, monkeypatch):
    import robust_pfl.experiments as experiments

    def fails(*args, **kwargs):
        raise RuntimeError("no cell runs here")

    monkeypatch.setattr(experiments, "run_cell_config", fails)
    text = TINY.replace("seeds = [0, 1, 2]", "seeds = [0, 1]").replace('attacks = ["alie", "bit_flip"]',
                                                                       'attacks = ["alie"]')
    assert main(["benchmark", str(tiny(tmp_path, text)), "--out", str(tmp_path / "out")]) == 1
    printed = capsys.readouterr().out
    errors = [line for line in printed.splitlines() if line.startswith("  error in cell ")]
    # the first stage makes each defense's reference, clean and under alie, with the two
    # initial seeds; with none finished nothing more is asked: every run made errored
    assert len(errors) == 2 * 2 * 2 and all(line.endswith("RuntimeError: no cell runs here") for line in errors)
    assert f"{len(errors)} ran, 0 skipped (finished before), {len(errors)} errored" in printed


@pytest.mark.parametrize("where", ["out is a file", "page is a directory", "page under a file", "out under a file"])
def test_out_and_page_are_checked_before_any_cell_runs(tmp_path, capsys, where):
    path = tiny(tmp_path)
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "folder").mkdir()
    out, page = tmp_path / "out", []
    if where == "out is a file":
        out = tmp_path / "file"
    elif where == "out under a file":
        out = tmp_path / "file" / "out"
    elif where == "page is a directory":
        page = ["--page", str(tmp_path / "folder")]
    else:
        page = ["--page", str(tmp_path / "file" / "b.md")]
    assert main(["benchmark", str(path), "--out", str(out), *page]) == 2
    err = capsys.readouterr().err
    option = "--page" if "page" in where else "--out"
    assert f"error: {option} " in err and ("is a file, not a directory" in err or "a directory; give" in err
                                         or "a file, not a directory" in err), err
    assert not (tmp_path / "out").exists() and not (tmp_path / "file" / "out").exists()  # nothing ran


def test_a_mistaken_file_starts_no_backend(tmp_path, capsys, monkeypatch):
    """A mistake is reported before the backend (a Ray cluster, a pool) is made."""
    import robust_pfl.backends as backends

    made = []
    monkeypatch.setattr(backends, "make_backend", lambda *args, **kwargs: made.append(args))
    path = tiny(tmp_path, TINY.replace('attacks = ["alie", "bit_flip"]', 'attacks = ["alei"]'))
    assert main(["benchmark", str(path), "--out", str(tmp_path / "out"), "--backend", "ray"]) == 2
    assert "benchmark.attacks[0]: unknown attack 'alei' (did you mean 'alie'?)" in capsys.readouterr().err
    assert made == []


def test_planning_says_how_far_it_is_when_it_takes_long(tmp_path, monkeypatch):
    import robust_pfl.worst_case.plan as plan_module

    monkeypatch.setattr(plan_module, "PROGRESS_SECONDS", 0.0)  # every combination "takes long"
    lines = []
    plan = build_plan(load_benchmark(tiny(tmp_path)), say=lines.append)
    total = len(plan.combos) + len(plan.not_applicable)
    assert lines[-1].startswith(f"planning: {total} of {total} combinations checked")
    assert [int(line.split()[1]) for line in lines] == list(range(1, total + 1))


# -- the file's errors ----------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    (("fractions = [0.0, 0.2]", "fractions = [0.0, 0.6]"),
     "benchmark.fractions: each must be a Byzantine share in [0, 0.5), got [0.6]"),
    (("tune = { lr = [0.02, 0.2] }", "tune = { lr = [] }"), "defenses[0].tune: lr: give at least one value"),
    (("[benchmark]\n", "[benchmark]\ntolerence = 5\n"), "benchmark.tolerence: unknown key (did you mean 'tolerance'?)"),
    (("rounds = 4\n", "rounds = 4\n[byzantine]\ntotal = 2\n"), "byzantine: set per cell by the benchmark"),
    (('label = "Global+krum"', 'label = "FC"'), "defenses: labels must be distinct, got ['FC', 'FC']"),
])
def test_a_bad_benchmark_file_names_the_field(tmp_path, change, message):
    with pytest.raises(ConfigError) as error:
        load_benchmark(tiny(tmp_path, TINY.replace(*change)))
    assert message in str(error.value)


@pytest.mark.parametrize("change, message", [
    (("rounds = 4", "rounds = 0"), "\n  rounds: must be an integer >= 1, got 0"),
    (('aggregator = "krum"', 'aggregator = "krumm"'), "\n  defenses[1].aggregator: aggregator.name must be one of"),
    (('[[benchmark.heterogeneity]]\nlabel = "K2"', '[[benchmark.heterogeneity]]\nlabel = "K2"\ntrain_per_client = 5000'),
     "\n  benchmark.heterogeneity[0].train_per_client: 5000 train"),
])
def test_a_file_whose_clean_run_fails_is_an_error_at_load_naming_the_field_it_wrote(tmp_path, change, message):
    """A level or defense setting whose run without Byzantine clients is invalid is the
    file's error, at load, blamed on the field the file wrote (not the run config's
    ``methods[0]`` or ``task``), never a combination that is not applicable."""
    with pytest.raises(ConfigError) as error:
        load_benchmark(tiny(tmp_path, TINY.replace(*change)))
    assert message in str(error.value)


def test_profiles_narrow_the_run_and_unknown_ones_are_refused(tmp_path):
    text = TINY + '\n[benchmark.subsets.small]\ndefenses = ["FC"]\nattacks = ["alie"]\nrounds = 2\n'
    path = tiny(tmp_path, text)
    spec = load_benchmark(path, subset="small")
    plan = build_plan(spec)
    assert {key[0] for key in plan.combos} == {"FC"}
    assert {key[4] for key in plan.combos} == {"none", "alie"}
    quick = load_benchmark(path, quick=True)
    assert quick.base["rounds"] == 4  # the quick profile's 10 rounds never lengthen a shorter file
    assert quick.seeds == [0] and quick.benchmark.tune is False
    with pytest.raises(ConfigError, match="--subset 'nope'"):
        load_benchmark(path, subset="nope")
    bad = tiny(tmp_path, TINY + '\n[benchmark.subsets.small]\nattacks = ["alei"]\n')
    with pytest.raises(ConfigError, match="unknown \\['alei'\\]"):
        build_plan(load_benchmark(bad, subset="small"))


def test_the_shipped_benchmark_file_loads_and_plans_its_quick_profile():
    path = ROOT / "configs" / "benchmark_digits.toml"
    spec = load_benchmark(path)
    labels = {d.display for d in spec.defenses}
    assert {"FC", "MC", "PFL-TC", "IFCA", "CFL", "CLoVE", "Ditto", "Local"} <= labels
    assert sum(d.name == "global" for d in spec.defenses) >= 8
    assert len(spec.benchmark.fractions) >= 4 and 0.0 in spec.benchmark.fractions
    assert len(spec.benchmark.heterogeneity) >= 2 and len(spec.seeds) >= 4 and spec.benchmark.initial_seeds == 2
    assert {spec.rounds_of(d) for d in spec.defenses} == {100, 150}  # run lengths per defense
    tried = {d.display: [table for _, table in d.candidates(True)] for d in spec.defenses if d.tune}
    assert all(len({table.get("lr") for table in tables}) >= 3 for tables in tried.values())  # lr around the file's
    radii = [table["radius"] for table in tried["FC"]]
    assert {"theory", "quantile"} <= {r["policy"] for r in radii} and max(r.get("q", 0) for r in radii) > 0.2
    assert len({table["alpha"] for table in tried["MC"]}) >= 3 and len({table["lam"] for table in tried["Ditto"]}) >= 2
    assert spec.benchmark.attacks == "all"
    quick = build_plan(load_benchmark(path, quick=True))
    assert quick.combos and json.dumps([list(key) for key in list(quick.combos)[:3]])


def test_cells_are_shared_with_a_grid_of_the_same_runs(tmp_path):
    """A grid whose cells are runs the benchmark already made (same task, method,
    attack, Byzantine fraction, seed, evaluations) finds them finished in the same
    store."""
    from robust_pfl.grid import run_grid
    from robust_pfl.grid_file import expand_grid

    out = tmp_path / "out"
    result = run_benchmark(tiny(tmp_path), out, say=lambda line: None, progress=False)
    import tomllib

    base = tomllib.loads(TINY)
    del base["benchmark"], base["defenses"]
    chosen = result.chosen.set_index(["method", "fraction"]).loc[("FC", 0.2), "candidate"]
    lr = float(chosen.split("=")[1])
    base["task"]["validation_per_client"] = 10
    base.update(byzantine={"fraction": 0.2}, eval_every=4, seeds=[0, 1],
                methods=[{"label": "FC", "name": "fc", "lr": lr}], grid={"attack": [{"name": "alie"}]})
    summary = run_grid(expand_grid(base, "same.toml"), out, progress=False)
    assert summary["cells"] == 2 and summary["skipped"] == 2 and summary["ran"] == 0


def test_the_page_restates_each_verdict_from_the_numbers(tmp_path):
    from robust_pfl.worst_case.report import statements

    result = run_benchmark(tiny(tmp_path), tmp_path / "out", say=lambda line: None, progress=False)
    lines = statements(result.breakdown, result.table)
    assert len(lines) == len(result.breakdown) == 2
    for line, row in zip(lines, result.breakdown.itertuples()):
        assert line.startswith(f"**{row.method}** ({row.heterogeneity}): {row.verdict}")
        assert f"{100 * row.clean:.1f}%" in line
