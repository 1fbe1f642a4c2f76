"""The table recipes end to end at toy size: files written, every cell present, the
checks computed from the numbers, and a rerun served from the resumable store."""

from __future__ import annotations

import json

import pandas as pd

from robust_pfl import experiments
from robust_pfl.recipes import attack_table, table1


def test_table1_tiny_on_embedded_digits(tmp_path, monkeypatch):
    monkeypatch.setattr(table1, "DIGITS_QUICK", table1.Mode(epochs=1, seeds=1, clients_per_cluster=2, batch=16))
    summary = table1.main(tmp_path, quick=True)
    assert {key.split(" | ")[1] for key in summary["results"]} == set(table1.PAPER)
    assert {key.split(" | ")[0] for key in summary["results"]} == set(table1.KINDS)
    for metrics in summary["results"].values():
        assert 0.0 <= metrics["test_accuracy"] <= 1.0
    text = (tmp_path / "table1.md").read_text()
    assert "embedded digits" in text and "| FC |" in text and "paper" not in text.split("\n\n")[1]
    for check in summary["orderings"]:  # each claim's verdict follows from the numbers
        better, worse = check["claim"].split(" > ")
        gap = summary["results"][f"{check['task']} | {better}"]["test_accuracy"] - (
            summary["results"][f"{check['task']} | {worse}"]["test_accuracy"]
        )
        assert check["holds"] == (gap > 0)
    store = tmp_path / "grid" / "results.csv"
    assert pd.read_csv(store)["cell"].nunique() == len(table1.KINDS) * len(table1.PAPER)
    before = store.read_bytes()
    table1.main(tmp_path, quick=True)  # resumed: nothing runs again
    assert store.read_bytes() == before


TINY_TABLE = """seeds = [0]
rounds = 300
eval_every = 300
dtype = "float64"
[task]
clusters = 1
clients_per_cluster = 20
[byzantine]
total = 5
[[methods]]
label = "mean"
name = "global"
lr = 0.01
heavy_ball = 0.9
[[methods]]
label = "median"
name = "global"
aggregator = "median"
lr = 0.01
heavy_ball = 0.9
[[methods]]
label = "FC"
name = "fc"
radius = { policy = "quantile", q = 0.5 }
lr = 0.01
heavy_ball = 0.9
[grid]
attack = [{ name = "none" }, { name = "large_gradient" }, { name = "constant", value = nan, label = "constant(nan)" }]
"""


def test_attack_table_tiny(tmp_path, monkeypatch):
    (tmp_path / "attack_table.toml").write_text(TINY_TABLE)
    monkeypatch.setattr(attack_table, "CONFIGS", tmp_path)
    tiny = attack_table.Table("attack_table.toml", attack_table.Mode(rounds=30, seeds=1), "relative_error")
    monkeypatch.setattr(attack_table, "TABLES", {"synthetic": tiny})
    summary = attack_table.main(tmp_path / "out", quick=True)
    table = summary["tables"]["synthetic"]
    assert len(table["values"]) == 9
    error = table["values"]
    assert "large_gradient | mean" in table["breaks"]  # an undefended mean under 1e6 gradients
    assert error["large_gradient | mean"] > 1e6 * error["large_gradient | median"]
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written["tables"]["synthetic"]["breaks"] == table["breaks"]
    text = (tmp_path / "out" / "attack_table.md").read_text()
    assert text.startswith("Quick mode") and "| large_gradient | " in text
    assert set(pd.read_csv(tmp_path / "out" / "history.csv")["attack"]) == {"none", "large_gradient", "constant(nan)"}
    calls: list = []  # a rerun finds every cell in the store and runs none
    real = experiments.run_cell_config
    monkeypatch.setattr(experiments, "run_cell_config", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert attack_table.main(tmp_path / "out", quick=True)["tables"]["synthetic"]["values"] == error and calls == []


def test_table1_exit_status_follows_the_orderings(tmp_path, monkeypatch):
    """The full run exits 1 when a claimed ordering fails, 0 when all hold; a quick run
    decides no claim and exits 0 whatever its table shows."""
    from robust_pfl.cli import main

    tiny = table1.Mode(epochs=1, seeds=1, clients_per_cluster=2, batch=16)
    monkeypatch.setattr(table1, "DIGITS_FULL", tiny)
    monkeypatch.setattr(table1, "DIGITS_QUICK", tiny)
    status = main(["reproduce", "table1", "--out", str(tmp_path / "full")])
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert status == (0 if all(check["holds"] for check in summary["orderings"]) else 1)
    assert main(["reproduce", "table1", "--quick", "--out", str(tmp_path / "quick")]) == 0
    assert "quick mode: a smoke run; it decides no claim" in (tmp_path / "quick" / "table1.md").read_text()
    # and the failing case is reached: force an ordering to fail
    monkeypatch.setattr(table1, "orderings", lambda results: [{"task": "rotation", "claim": "FC > Local",
                                                               "gap_points": -1.0, "holds": False}])
    assert main(["reproduce", "table1", "--out", str(tmp_path / "forced")]) == 1
