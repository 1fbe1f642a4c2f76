"""One rule for every recipe's ``--quick``: a smoke run that exits 0 when it ran, says
``quick mode: a smoke run; it decides no claim ...`` and issues no verdict, even where
its numbers would fail (or pass) a claim.  The expensive parts are stubbed or shrunk."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from robust_pfl import cli
from robust_pfl.recipes import QUICK_SENTENCE, attack_table, fig2, fig3, fig6, fig7, table1

from test_user_errors import _tiny_attack_table  # the shrunk synthetic table

ROOT = Path(__file__).resolve().parents[1]
#: Words of a verdict, in any recipe's output.
VERDICT = re.compile(r"\[ok\]|FAILED|All claimed orderings hold|do not hold|NOT within|within \d+ points|\[x\]|\[ \]")

pytestmark = pytest.mark.usefixtures("single_thread")


def run(argv: list[str], capsys) -> tuple[int, str]:
    status = cli.main(argv)
    return status, capsys.readouterr().out


def test_the_sentence():
    assert QUICK_SENTENCE == ("quick mode: a smoke run; it decides no claim — run without --quick to check the "
                              "paper's claims")


def test_table1_quick_decides_no_ordering(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(table1, "DIGITS_QUICK", table1.Mode(epochs=1, seeds=1, clients_per_cluster=2, batch=16))
    for holds in (True, False):  # an ordering that holds or fails: quick mode says neither
        monkeypatch.setattr(table1, "orderings", lambda results, holds=holds: [
            {"task": "rotation", "claim": "FC > Local", "gap_points": 1.0 if holds else -1.0, "holds": holds}])
        status, out = run(["reproduce", "table1", "--quick", "--out", str(tmp_path)], capsys)
        assert status == 0 and QUICK_SENTENCE in out and not VERDICT.search(out)
        text = (tmp_path / "table1.md").read_text()
        assert QUICK_SENTENCE in text and not VERDICT.search(text)
        assert json.loads((tmp_path / "summary.json").read_text())["checked"] is False


def test_table1_quick_exits_1_when_a_cell_errored(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(table1, "DIGITS_QUICK", table1.Mode(epochs=1, seeds=1, clients_per_cluster=2, batch=16))
    real = table1.run_grid
    monkeypatch.setattr(table1, "run_grid", lambda grid, out, backend=None: {
        **real(grid, out, backend), "errored": {grid.cells[0].cell: "RuntimeError: boom"}})
    status, out = run(["reproduce", "table1", "--quick", "--out", str(tmp_path)], capsys)
    assert status == 1 and "RuntimeError: boom" in out


def test_fig3_quick(tmp_path, monkeypatch, capsys):
    from robust_pfl.engine.results import ResultTable

    def run_method(spec, config, seed, on_round=None, task=None):  # every method alike: the claims fail
        table = ResultTable()
        for round_index in (0, config.rounds):
            table.add(spec.display, seed, round_index, {"param_error": 1.0, "validation_loss": 1.0, "test_loss": 1.0})
        return table

    monkeypatch.setattr(fig3, "run_method", run_method)
    status, out = run(["reproduce", "fig3", "--quick", "--out", str(tmp_path)], capsys)
    assert status == 0 and QUICK_SENTENCE in out and not VERDICT.search(out)
    assert QUICK_SENTENCE in (tmp_path / "fig3.md").read_text()


def test_fig6_quick(tmp_path, monkeypatch, capsys):
    tiny = fig6.Scale("digits", 3, 2, 8, large_gradient_steps=4, bit_flip_steps=12, checkpoint_every=4)
    monkeypatch.setattr(fig6, "DIGITS", tiny)
    for holds in (True, False):  # the claim met or missed: quick mode says neither
        monkeypatch.setattr(fig6, "FC_TOLERANCE", 1000.0 if holds else -1.0)
        status, out = run(["reproduce", "fig6", "--quick", "--panel", "large_gradient", "--out", str(tmp_path)],
                          capsys)
        assert status == 0 and QUICK_SENTENCE in out and not VERDICT.search(out)
        text = (tmp_path / "fig6.md").read_text()
        assert QUICK_SENTENCE in text and not VERDICT.search(text)
        assert "large_gradient (official placement, 4 steps): FC " in text  # the numbers, without a verdict
        assert json.loads((tmp_path / "summary.json").read_text())["holds"] is None


FIG2_SUMMARY = {"seconds": 0.0, "A2": 2.0, "Delta2": 0.5, "A2_supremum": 1.0, "gap_at_zero": 1.0,
                "gap_at_vanishing_point": 0.0, "checks": {"ratio bounded": False, "every estimate finite": True}}


@pytest.mark.parametrize("quick", [True, False])
def test_fig2_quick_checks_nothing_the_full_run_does(tmp_path, monkeypatch, capsys, quick):
    summary = {**FIG2_SUMMARY, "mode": "quick" if quick else "full"}
    monkeypatch.setattr(fig2, "run", lambda out, quick=False, seeds=None: summary)
    status, out = run(["reproduce", "fig2", *(["--quick"] if quick else []), "--out", str(tmp_path)], capsys)
    text = fig2.markdown(summary)
    if quick:
        assert status == 0 and QUICK_SENTENCE in out and not VERDICT.search(out)
        assert QUICK_SENTENCE in text and "- [not checked] ratio bounded" in text and not VERDICT.search(text)
    else:
        assert status == 1 and "[FAILED] ratio bounded" in out and QUICK_SENTENCE not in out
        assert "- [ ] ratio bounded" in text and QUICK_SENTENCE not in text


@pytest.mark.parametrize("quick", [True, False])
def test_fig7_quick_checks_nothing_the_full_run_does(tmp_path, monkeypatch, capsys, quick):
    entry = {"curve": [3.0, 1.0, 2.0], "elbow": 2, "theory_rounds": 1, "decreasing_to_elbow": False}
    summary = {"seconds": 0.0, "mode": "quick" if quick else "full", "stds": {"0.5": entry}}
    monkeypatch.setattr(fig7, "run", lambda out, quick=False, seeds=None: summary)
    status, out = run(["reproduce", "fig7", *(["--quick"] if quick else []), "--out", str(tmp_path)], capsys)
    if quick:
        assert status == 0 and QUICK_SENTENCE in out and not VERDICT.search(out)
    else:
        assert status == 1 and "FAILED" in out and QUICK_SENTENCE not in out


def test_attack_table_quick(tmp_path, monkeypatch, capsys):
    out_dir = _tiny_attack_table(tmp_path, monkeypatch, attack_table, rounds=10)
    status, out = run(["attack-table", "--quick", "--out", str(out_dir)], capsys)
    sentence = attack_table.QUICK_TABLE_SENTENCE
    assert sentence == "quick mode: a smoke run; it decides no claim — run without --quick to decide which defenses break"
    assert status == 0 and sentence in out and sentence in (out_dir / "attack_table.md").read_text()
    real = attack_table.run_grid
    monkeypatch.setattr(attack_table, "run_grid", lambda grid, out, backend=None: {
        **real(grid, out, backend), "errored": {grid.cells[0].cell: "RuntimeError: boom"}})
    status, out = run(["attack-table", "--quick", "--out", str(out_dir)], capsys)
    assert status == 1 and "RuntimeError: boom" in out


def test_the_readme_states_the_rule():
    text = (ROOT / "README.md").read_text()
    assert "quick mode: a smoke run; it decides no claim" in text
