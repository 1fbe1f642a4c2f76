"""The worst-case benchmark (issue 41): analysis on hand-made frames with known
answers, tuning that never reads the test split, the interval, a benchmark killed and
resumed, the file's errors, and the command's outputs."""

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
from robust_pfl.worst_case import analysis, run_benchmark
from robust_pfl.worst_case.plan import BACKDOOR, CLEAN, ROBUST, build_plan
from robust_pfl.worst_case.spec import load_benchmark

ROOT = Path(__file__).resolve().parents[1]

TINY = textwrap.dedent("""
    rounds = 4
    eval_every = 2
    batch_size = 8
    seeds = [0, 1]

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


# -- the interval ---------------------------------------------------------------------------
def test_the_interval_of_a_sample_with_a_known_answer():
    """[1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.302652729911275 (tables), so the
    half-width is 4.302652729911275 / sqrt(3) = 2.4841377..."""
    mean, low, high = analysis.t_interval([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0)
    assert high - mean == pytest.approx(4.302652729911275 / math.sqrt(3), rel=1e-9)
    assert mean - low == pytest.approx(high - mean, rel=1e-12)


def test_the_interval_is_clipped_to_its_bounds_and_absent_for_one_value():
    assert analysis.t_interval([0.0, 1.0], bounds=(0.0, 1.0))[1:] == (0.0, 1.0)
    mean, low, high = analysis.t_interval([0.7])
    assert mean == 0.7 and math.isnan(low) and math.isnan(high)
    assert all(math.isnan(v) for v in analysis.t_interval([0.5, math.inf]))


# -- worst case, breakdown, tuning on a hand-made frame -------------------------------------
def frame(rows: list[tuple]) -> pd.DataFrame:
    """Rows (defense, candidate, fraction, attack, seed, test, validation, worst cluster)."""
    out = []
    for method, candidate, fraction, attack, seed, test, validation, cluster in rows:
        out.append({"method": method, "candidate": candidate, "heterogeneity": "H", "fraction": fraction,
                    "attack": attack, "seed": seed, "section": CLEAN if fraction == 0 else ROBUST,
                    "test_accuracy": test, "validation_accuracy": validation,
                    "worst_cluster_test_accuracy": cluster, "attack_success_rate": math.nan})
    return pd.DataFrame(out)


HAND = frame([
    # D: clean 0.9; at 0.1 the worst attack is "b" (0.85 and 0.83: mean 0.84); at 0.3, "a" at 0.5
    ("D", "x", 0.0, "none", 0, 0.90, 0.9, 0.80), ("D", "x", 0.0, "none", 1, 0.90, 0.9, 0.80),
    ("D", "x", 0.1, "a", 0, 0.88, 0.8, 0.70), ("D", "x", 0.1, "a", 1, 0.88, 0.8, 0.70),
    ("D", "x", 0.1, "b", 0, 0.85, 0.8, 0.60), ("D", "x", 0.1, "b", 1, 0.83, 0.8, 0.62),
    ("D", "x", 0.3, "a", 0, 0.50, 0.5, 0.20), ("D", "x", 0.3, "a", 1, 0.50, 0.5, 0.30),
    ("D", "x", 0.3, "b", 0, 0.86, 0.8, 0.80), ("D", "x", 0.3, "b", 1, 0.86, 0.8, 0.80),
    # E holds everywhere but is worse clean
    ("E", "x", 0.0, "none", 0, 0.70, 0.7, 0.70), ("E", "x", 0.1, "a", 0, 0.69, 0.7, 0.69),
    ("E", "x", 0.1, "b", 0, 0.68, 0.7, 0.68), ("E", "x", 0.3, "a", 0, 0.66, 0.7, 0.66),
    ("E", "x", 0.3, "b", 0, 0.65, 0.7, 0.65),
])


def test_the_worst_case_of_a_hand_made_frame():
    table = analysis.worst_case(HAND, analysis.tune(HAND)).set_index(["method", "fraction"])
    assert table.loc[("D", 0.1), "worst"] == pytest.approx(0.84)
    assert table.loc[("D", 0.1), "worst_attack"] == "b"
    assert table.loc[("D", 0.3), "worst"] == pytest.approx(0.50)
    assert table.loc[("D", 0.3), "worst_attack"] == "a"
    assert table.loc[("D", 0.3), "worst_cluster"] == pytest.approx(0.25)  # mean of 0.2 and 0.3 under "a"
    assert table.loc[("D", 0.1), "clean"] == pytest.approx(0.90)
    assert table.loc[("D", 0.1), "attacks"] == 2 and table.loc[("D", 0.1), "seeds"] == 2
    assert table.loc[("E", 0.3), "worst"] == pytest.approx(0.65)


def test_the_breakdown_fraction_of_a_hand_made_frame():
    table = analysis.worst_case(HAND, analysis.tune(HAND))
    result = analysis.breakdown(table, [0.0, 0.1, 0.3], tolerance=10).set_index("method")
    assert result.loc["D", "holds_up_to"] == 0.1 and result.loc["D", "breaks_at"] == 0.3
    assert "under a" in result.loc["D", "why"]
    assert result.loc["E", "holds_up_to"] == 0.3 and math.isnan(result.loc["E", "breaks_at"])
    # a tolerance of 5 points: D's 0.84 at 0.1 is 6 points below its clean 0.90
    strict = analysis.breakdown(table, [0.0, 0.1, 0.3], tolerance=5).set_index("method")
    assert strict.loc["D", "holds_up_to"] == 0.0 and strict.loc["D", "breaks_at"] == 0.1


def test_a_defense_whose_clean_accuracy_is_near_chance_gets_no_verdict():
    table = analysis.worst_case(HAND, analysis.tune(HAND))
    result = analysis.breakdown(table, [0.0, 0.1, 0.3], tolerance=10, chance=0.65).set_index("method")
    assert bool(result.loc["E", "vacuous"]) and not bool(result.loc["D", "vacuous"])  # E's clean 0.70 <= 0.75


def test_a_fraction_a_defense_cannot_run_is_where_it_breaks():
    table = analysis.worst_case(HAND, analysis.tune(HAND))
    without = table[~((table["method"] == "E") & (table["fraction"] == 0.3))]
    result = analysis.breakdown(without, [0.0, 0.1, 0.3], tolerance=10).set_index("method")
    assert result.loc["E", "holds_up_to"] == 0.1 and result.loc["E", "breaks_at"] == 0.3
    assert result.loc["E", "why"] == "not applicable"


def test_the_best_defense_per_cell():
    best = analysis.best_defense(analysis.worst_case(HAND, analysis.tune(HAND))).set_index("fraction")
    assert best.loc[0.1, "best"] == "D" and best.loc[0.3, "best"] == "E"


def test_tuning_takes_the_candidate_of_highest_worst_case_validation_accuracy():
    """Candidate "big" is better on average but worse under its worst attack."""
    rows = frame([
        ("D", "small", 0.2, "a", 0, 0.1, 0.70, 0.1), ("D", "small", 0.2, "b", 0, 0.1, 0.72, 0.1),
        ("D", "big", 0.2, "a", 0, 0.9, 0.95, 0.9), ("D", "big", 0.2, "b", 0, 0.9, 0.60, 0.9),
    ])
    chosen = analysis.tune(rows)
    assert chosen["candidate"].tolist() == ["small"]
    assert chosen["validation_worst"].tolist() == [pytest.approx(0.70)]
    assert analysis.worst_case(rows, chosen)["worst"].tolist() == [pytest.approx(0.1)]  # test read after


def test_tuning_reads_no_test_column():
    rows = frame([
        ("D", "p", 0.2, "a", 0, 0.1, 0.70, 0.1), ("D", "q", 0.2, "a", 0, 0.9, 0.60, 0.9),
    ])
    scrambled = rows.assign(test_accuracy=[0.99, 0.0], worst_cluster_test_accuracy=[0.0, 0.99])
    assert analysis.tune(rows).equals(analysis.tune(scrambled))
    assert analysis.tune(rows)["candidate"].tolist() == ["p"]
    assert analysis.tune(rows.assign(validation_accuracy=[0.6, 0.7]))["candidate"].tolist() == ["q"]  # can fail


def test_worst_cluster_mean_by_hand():
    values = torch.tensor([1.0, 0.5, 0.2, 0.4, 9.0])
    clusters = torch.tensor([0, 0, 1, 1, 1])
    honest = torch.tensor([True, True, True, True, False])
    assert worst_cluster_mean(values, clusters, honest) == pytest.approx(0.3)


# -- end to end -----------------------------------------------------------------------------
def test_a_tiny_benchmark_runs_and_writes_its_tables(tmp_path, capsys):
    path = tiny(tmp_path)
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
    assert "| FC |" in text and "f = 0.2" in text
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
    assert not first.finals["test_accuracy"].equals(second.finals["test_accuracy"])
    assert first.finals["validation_accuracy"].tolist() == second.finals["validation_accuracy"].tolist()
    assert first.chosen.equals(second.chosen)


def test_combinations_that_cannot_run_are_listed_not_applicable(tmp_path):
    text = TINY.replace('fractions = [0.0, 0.2]', 'fractions = [0.0, 0.3]').replace(
        'aggregator = "krum"', 'aggregator = "bulyan"')
    spec = load_benchmark(tiny(tmp_path, text))
    plan = build_plan(spec)
    skipped = [row for row in plan.not_applicable if row["method"] == "Global+krum"]
    assert {row["fraction"] for row in skipped} == {0.3}
    assert all("bulyan" in row["reason"] for row in skipped)
    assert all(cell.axes["method"] == "FC" for cell in plan.cells if cell.axes["fraction"] == 0.3)


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
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    store = out / "results.csv"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if store.exists() and store.read_text().count("cell_seconds") >= 3:
                break
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    finished = set(read_results(out)["cell"])
    assert 0 < len(finished) < 18 and not (out / "worst_case.csv").exists()  # killed mid-run
    result = run_benchmark(path, out, say=lambda line: None, progress=False)
    assert result.summary["skipped"] >= len(finished) > 0
    assert result.summary["ran"] == len(result.plan.cells) - result.summary["skipped"]
    blocks = read_results(out)
    per_cell = blocks[blocks["metric"] == "cell_seconds"].groupby("cell").size()
    assert (per_cell == 1).all() and len(per_cell) == len(result.plan.cells)


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
    (("rounds = 4", "rounds = 0"), "rounds: must be an integer >= 1, got 0"),
    (('aggregator = "krum"', 'aggregator = "krumm"'), "defenses[1] (Global+krum, as given)"),
    (('[[benchmark.heterogeneity]]\nlabel = "K2"', '[[benchmark.heterogeneity]]\nlabel = "K2"\ntrain_per_client = 5000'),
     "at level 'K2'"),
])
def test_a_file_whose_clean_run_fails_is_an_error_not_a_combination_that_is_not_applicable(tmp_path, change, message):
    spec = load_benchmark(tiny(tmp_path, TINY.replace(*change)))
    with pytest.raises(ConfigError) as error:
        build_plan(spec)
    assert "a run without Byzantine clients fails" in str(error.value) and message in str(error.value)


def test_profiles_narrow_the_run_and_unknown_ones_are_refused(tmp_path):
    text = TINY + '\n[benchmark.subsets.small]\ndefenses = ["FC"]\nattacks = ["alie"]\nrounds = 2\n'
    path = tiny(tmp_path, text)
    spec = load_benchmark(path, subset="small")
    plan = build_plan(spec)
    assert {c.axes["method"] for c in plan.cells} == {"FC"}
    assert {c.axes["attack"] for c in plan.cells} == {"none", "alie"}
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
    assert len(spec.benchmark.heterogeneity) >= 2 and len(spec.seeds) == 3
    assert spec.benchmark.attacks == "all"
    quick = build_plan(load_benchmark(path, quick=True))
    assert quick.cells and json.dumps([c.axes for c in quick.cells[:3]])


def test_cells_are_shared_with_a_grid_of_the_same_runs(tmp_path):
    """A grid whose cells are runs the benchmark already made (same task, method,
    attack, Byzantine fraction, seed) finds them finished in the same store."""
    from robust_pfl.grid import run_grid
    from robust_pfl.grid_file import expand_grid

    out = tmp_path / "out"
    run_benchmark(tiny(tmp_path), out, say=lambda line: None, progress=False)
    import tomllib

    base = tomllib.loads(TINY)
    del base["benchmark"], base["defenses"]
    base.update(byzantine={"fraction": 0.2}, methods=[{"label": "FC", "name": "fc", "lr": 0.2}],
                grid={"attack": [{"name": "alie"}, {"name": "bit_flip"}]})
    summary = run_grid(expand_grid(base, "same.toml"), out, progress=False)
    assert summary["cells"] == 4 and summary["skipped"] == 4 and summary["ran"] == 0


def test_the_page_restates_each_verdict_from_the_numbers():
    from robust_pfl.worst_case.report import statements

    table = analysis.worst_case(HAND, analysis.tune(HAND))
    lines = statements(analysis.breakdown(table, [0.0, 0.1, 0.3], tolerance=5), table, 5)
    d = next(line for line in lines if line.startswith("**D**"))
    assert "holds at no Byzantine fraction" in d and "84.0% (b)" in d and "90.0% clean" in d
    e = next(line for line in lines if line.startswith("**E**"))
    assert "up to f = 0.3" in e and "65.0%" in e
