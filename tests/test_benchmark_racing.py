"""Racing against the full factorial (issue 53, item 3): on a small benchmark whose
full factorial also runs, racing attacks and candidates and adding seeds only where a
verdict is open names the same worst attack and reaches the same verdicts, with fewer
runs.

The full factorial runs first (every candidate, attack and seed; ``racing = false``,
all four seeds from the start, one look at the level the racing run's looks are each
taken at: ``1 - 0.05 / 3``).  The racing benchmark then runs in a copy of its store:
every run it asks for is already there, so it makes none, and its allocation reads
only the runs it asked for (:func:`robust_pfl.worst_case.allocation.allocate`)."""

from __future__ import annotations

import shutil
import textwrap

import pandas as pd
import pytest

from robust_pfl.worst_case import run_benchmark

RACING = textwrap.dedent("""
    rounds = 30
    eval_every = 5
    batch_size = 16
    seeds = [0, 1, 2, 3]

    [task]
    name = "image"
    dataset = "digits"
    kind = "private_label"
    clusters = 2
    clients_per_cluster = 5
    train_per_client = 40
    model = { name = "mlp", hidden = [32] }

    [benchmark]
    fractions = [0.0, 0.2]
    attacks = ["ball_edge", "gaussian_noise", "large_gradient", "alie"]
    backdoors = []
    plateau = 10
    initial_seeds = 2

    [[benchmark.heterogeneity]]
    label = "K2"

    [[defenses]]
    label = "FC"
    name = "fc"
    lr = 0.1
    heavy_ball = 0.9
    tune = [{}, { lr = 0.05 }]

    [[defenses]]
    label = "Global+median"
    name = "global"
    aggregator = "median"
    lr = 0.1
    heavy_ball = 0.9
""")
FULL = RACING.replace("initial_seeds = 2", "initial_seeds = 4\nracing = false\nconfidence = 0.98333333333333333")


def test_racing_names_the_same_worst_attack_and_verdict_as_the_full_factorial(tmp_path):
    (tmp_path / "full.toml").write_text(FULL)
    (tmp_path / "racing.toml").write_text(RACING)
    full = run_benchmark(tmp_path / "full.toml", tmp_path / "full", say=lambda line: None, progress=False)
    shutil.copytree(tmp_path / "full", tmp_path / "racing", ignore=shutil.ignore_patterns(".lock"))
    racing = run_benchmark(tmp_path / "racing.toml", tmp_path / "racing", say=lambda line: None, progress=False)
    assert racing.rule.level == pytest.approx(full.rule.level)  # the verdicts' intervals at one level
    assert racing.summary["ran"] == 0  # every run it asked for was in the full factorial's store
    assert len(racing.plan.factorial_cells) < len(full.plan.factorial_cells) == full.plan.full_factorial()
    columns = ["method", "heterogeneity", "fraction", "worst_attack", "candidate"]
    pd.testing.assert_frame_equal(racing.table[columns], full.table[columns])
    pd.testing.assert_frame_equal(racing.breakdown[["method", "verdict"]], full.breakdown[["method", "verdict"]])
    verdicts = dict(zip(full.breakdown["method"], full.breakdown["verdict"]))
    assert verdicts["FC"] == "breaks at f = 0.2"  # something was decided: the comparison can differ
    assert racing.table["attacks_dropped"].sum() > 0  # and racing dropped something
