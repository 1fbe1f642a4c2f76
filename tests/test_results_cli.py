"""Tidy results (ResultTable, history.csv, summary.json) and the ``robust-pfl run``
command line end to end."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from robust_pfl.cli import main
from robust_pfl.engine.results import ResultTable, write_results

HISTORY_COLUMNS = ["method", "seed", "round", "metric", "value"]


# -- ResultTable.final ----------------------------------------------------------------------
def test_final_picks_last_round_per_run_and_averages_seeds():
    table = ResultTable()
    # rows arrive out of round order: "last" means the largest round, not the last row
    table.add("fc", 0, 10, {"loss": 1.0, "acc": 0.9})
    table.add("fc", 0, 0, {"loss": 5.0, "acc": 0.1})
    table.add("fc", 0, 5, {"loss": 2.0, "acc": 0.5})
    table.add("fc", 1, 0, {"loss": 6.0, "acc": 0.2})
    table.add("fc", 1, 10, {"loss": 3.0, "acc": 0.7})
    table.add("global", 0, 10, {"loss": 8.0})
    table.add("global", 0, 20, {"loss": 4.0})

    final = table.final()

    assert set(final) == {"fc", "global"}
    assert set(final["fc"]) == {"loss", "acc"}
    assert final["fc"]["loss"]["per_seed"] == {"0": 1.0, "1": 3.0}
    assert final["fc"]["loss"]["mean"] == pytest.approx(2.0)  # (1 + 3) / 2
    assert final["fc"]["acc"]["per_seed"] == {"0": 0.9, "1": 0.7}
    assert final["fc"]["acc"]["mean"] == pytest.approx(0.8)  # (0.9 + 0.7) / 2
    assert final["global"]["loss"] == {"per_seed": {"0": 4.0}, "mean": 4.0}


def test_final_uses_each_seeds_own_last_round():
    table = ResultTable()
    table.add("m", 0, 3, {"x": 1.0})
    table.add("m", 0, 7, {"x": 2.0})  # seed 0 ran 7 rounds
    table.add("m", 1, 3, {"x": 10.0})  # seed 1 only 3
    final = table.final()
    assert final["m"]["x"]["per_seed"] == {"0": 2.0, "1": 10.0}
    assert final["m"]["x"]["mean"] == pytest.approx(6.0)


def test_table_rows_are_tidy_and_extend_concatenates():
    a, b = ResultTable(), ResultTable()
    a.add("fc", 0, 1, {"loss": 1.5, "acc": 0.5})
    b.add("local", 2, 4, {"loss": 2.5})
    a.extend(b)
    assert a.rows == [
        {"method": "fc", "seed": 0, "round": 1, "metric": "loss", "value": 1.5},
        {"method": "fc", "seed": 0, "round": 1, "metric": "acc", "value": 0.5},
        {"method": "local", "seed": 2, "round": 4, "metric": "loss", "value": 2.5},
    ]


# -- write_results --------------------------------------------------------------------------
def test_write_results_writes_history_and_summary(tmp_path):
    table = ResultTable()
    table.add("fc", 0, 0, {"loss": 4.0})
    table.add("fc", 0, 10, {"loss": 1.25})
    table.add("fc", 1, 10, {"loss": 0.75})
    out = tmp_path / "nested" / "run"  # created on demand

    summary = write_results(table, out, {"config": {"rounds": 10}})

    history = pd.read_csv(out / "history.csv")
    assert list(history.columns) == HISTORY_COLUMNS
    assert len(history) == 3
    assert history["value"].tolist() == [4.0, 1.25, 0.75]
    assert history["round"].tolist() == [0, 10, 10]

    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == summary
    assert on_disk["config"] == {"rounds": 10}
    assert on_disk["final"]["fc"]["loss"]["mean"] == pytest.approx(1.0)
    # atomic writes leave no temporary files behind
    assert sorted(p.name for p in out.iterdir()) == ["history.csv", "summary.json"]


def _strict_json(text: str):
    """RFC 8259 JSON: NaN / Infinity are not allowed."""

    def reject(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=reject)


def test_summary_json_is_standard_json_even_with_non_finite_metrics(tmp_path):
    """A diverged undefended baseline reports an infinite loss (e.g. Global under a 1e38
    attack in float32).  summary.json must still be valid JSON for non-Python readers
    (jq, JavaScript), which reject the bare tokens Infinity and NaN."""
    table = ResultTable()
    table.add("global", 0, 5, {"test_loss": math.inf, "param_error": math.nan, "ok": 1.0})
    write_results(table, tmp_path, {})
    parsed = _strict_json((tmp_path / "summary.json").read_text())
    assert parsed["final"]["global"]["ok"]["mean"] == 1.0


# -- the command line -----------------------------------------------------------------------
TINY = """
seeds = [0, 1]
rounds = 5
eval_every = 2
dtype = "float64"

[task]
clusters = 2
clients_per_cluster = 2
dim = 4
samples_per_client = 3
validation_samples = 5
test_samples = 5
scale = 10.0

[byzantine]
total = 1

[attack]
name = "large_gradient"

[[methods]]
name = "local"
lr = 0.01

[[methods]]
name = "global"
label = "fedavg"
lr = 0.01
"""


def write_config(tmp_path: Path, text: str, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_cli_run_end_to_end(tmp_path, capsys):
    config = write_config(tmp_path, TINY)
    out = tmp_path / "out"

    assert main(["run", str(config), "--out", str(out)]) == 0
    assert "summary.json" in capsys.readouterr().out

    history = pd.read_csv(out / "history.csv")
    assert list(history.columns) == HISTORY_COLUMNS
    assert set(history["method"]) == {"local", "fedavg"}  # the label names the run
    assert set(history["seed"]) == {0, 1}
    # evaluated rounds: the initial models, every eval_every rounds, and the last round
    assert set(history["round"]) == {0, 2, 4, 5}
    metrics = set(history["metric"])
    assert {"test_loss", "nonfinite_models"} <= metrics
    # exactly one row per (method, seed, evaluated round, metric)
    key = ["method", "seed", "round", "metric"]
    assert not history.duplicated(key).any()
    assert len(history) == 2 * 2 * 4 * len(metrics)
    # honest models stay finite under the attack
    assert (history.loc[history["metric"] == "nonfinite_models", "value"] == 0).all()

    summary = json.loads((out / "summary.json").read_text())
    final = summary["final"]
    assert set(final) == {"local", "fedavg"}
    # summary.json agrees with history.csv: last round, averaged over the seeds
    last = history[history["round"] == 5]
    for method, metrics_of in final.items():
        assert set(metrics_of) == metrics
        for metric, entry in metrics_of.items():
            rows = last[(last["method"] == method) & (last["metric"] == metric)]
            assert sorted(entry["per_seed"]) == ["0", "1"]
            for seed, value in entry["per_seed"].items():
                (expected,) = rows.loc[rows["seed"] == int(seed), "value"].tolist()
                assert value == pytest.approx(expected, rel=1e-12)
            assert entry["mean"] == pytest.approx(rows["value"].mean(), rel=1e-12)


def test_cli_run_is_reproducible(tmp_path):
    config = write_config(tmp_path, TINY)
    finals, histories = [], []
    for name in ("a", "b"):
        out = tmp_path / name
        assert main(["run", str(config), "--out", str(out)]) == 0
        finals.append(json.loads((out / "summary.json").read_text())["final"])
        histories.append((out / "history.csv").read_text())
    assert finals[0] == finals[1]
    assert histories[0] == histories[1]


def test_cli_seed_changes_results(tmp_path):
    """Not vacuous: the reproducibility above is not because results ignore the seed."""
    outs = []
    for seed in (0, 1):
        config = write_config(tmp_path, TINY.replace("seeds = [0, 1]", f"seeds = [{seed}]"), f"s{seed}.toml")
        out = tmp_path / f"s{seed}"
        assert main(["run", str(config), "--out", str(out)]) == 0
        outs.append(json.loads((out / "summary.json").read_text())["final"])
    assert outs[0]["local"]["test_loss"]["mean"] != outs[1]["local"]["test_loss"]["mean"]


@pytest.mark.parametrize(
    "change, field",
    [
        (("rounds = 5", "rounds = 0"), "rounds"),
        (('name = "local"', 'name = "no_such_method"'), "methods[0]"),
        (('name = "large_gradient"', 'name = "no_such_attack"'), "attack"),
        (("lr = 0.01\n\n[[methods]]", "lr = -1\n\n[[methods]]"), "methods[0].lr"),
    ],
)
def test_cli_invalid_config_exits_2_naming_the_field(tmp_path, capsys, change, field):
    old, new = change
    assert old in TINY
    config = write_config(tmp_path, TINY.replace(old, new, 1))
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 2
    assert field in capsys.readouterr().err
    assert not (out / "summary.json").exists()


def test_cli_missing_config_exits_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "absent.toml"), "--out", str(tmp_path / "out")]) == 2
    assert "absent.toml" in capsys.readouterr().err
