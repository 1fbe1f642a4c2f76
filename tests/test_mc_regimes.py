"""The MC regime suite (robust_pfl/recipes/mc_regimes.py): its regimes span what the
suite claims to vary, selection never looks past the selection regimes and picks by
validation accuracy among the candidates that keep the clusters, the bars flag what
they should, and the page's block is replaced in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from robust_pfl.recipes import mc_regimes
from robust_pfl.recipes.mc_regimes import REGIMES, Outcome, Suite, select, verdicts, write_block


def test_the_regimes_span_the_claimed_ranges():
    selection = [regime for regime in REGIMES if regime.role == "selection"]
    evaluation = [regime for regime in REGIMES if regime.role == "evaluation"]
    assert len(REGIMES) >= 10 and selection and evaluation
    assert len({regime.name for regime in REGIMES}) == len(REGIMES)
    rounds = [regime.rounds for regime in REGIMES]
    assert min(rounds) == 30 and max(rounds) == 600
    clusters = [regime.task["clusters"] for regime in REGIMES]
    assert min(clusters) == 2 and max(clusters) == 8
    assert {regime.task["kind"] for regime in REGIMES} >= {"private_label", "rotation", "label_skew", "dirichlet"}
    assert any(regime.byzantine for regime in evaluation) and any(not regime.byzantine for regime in evaluation)
    per_client = [regime.task.get("train_per_client") for regime in REGIMES]
    assert 15 in per_client


class _Scripted(Suite):
    """A suite whose runs are given: ``table[label][regime] = (validation, ari)``; it
    records every regime it was asked about."""

    def __init__(self, table, asked):
        super().__init__(Path("unused"), mc_regimes.FULL)
        self.table, self.asked = table, asked

    def outcome(self, regime, label, method, seed):
        self.asked.append(regime.role)
        validation, ari = self.table[label.removeprefix("MC [").removesuffix("]")][regime.name]
        return Outcome(validation, 0.0, ari, 0.0, 0.0)


def test_selection_takes_the_best_validation_accuracy_among_candidates_that_keep_the_clusters(monkeypatch):
    names = [regime.name for regime in REGIMES if regime.role == "selection"]
    table = {
        "fast": {name: (0.95, 0.5 if name == names[0] else 1.0) for name in names},  # best, loses one regime's clusters
        "steady": {name: (0.90, 0.9) for name in names},
        "slow": {name: (0.85, 1.0) for name in names},
    }
    monkeypatch.setattr(mc_regimes, "CANDIDATES", {name: {} for name in table})
    asked: list[str] = []
    winner, scores = select(_Scripted(table, asked))
    assert winner == "steady"
    assert scores["fast"]["worst ARI"] == 0.5
    assert scores["steady"]["mean"] == pytest.approx(0.90)
    assert set(asked) == {"selection"}  # the evaluation regimes are never run while choosing


def _row(mc, fc, local):
    return {"regime": "r", "MC [x]": {"test": mc[0], "ari": mc[1]}, "FC": {"test": fc[0], "ari": fc[1]},
            "Local": {"test": local, "ari": None}}


def test_the_bars_by_hand():
    assert verdicts([_row((0.90, 1.0), (0.93, 1.0), 0.80)], "x") == ["- r: meets every bar"]
    assert verdicts([_row((0.79, 1.0), (0.83, 1.0), 0.80)], "x") == ["- r: below Local"]
    assert verdicts([_row((0.85, 1.0), (0.91, 1.0), 0.80)], "x") == ["- r: 6.0 points below FC"]
    assert verdicts([_row((0.90, 0.5), (0.93, 0.8), 0.80)], "x") == ["- r: ARI 0.50 where FC's models give 0.80"]
    assert verdicts([_row((0.90, 0.5), (0.93, 0.7), 0.80)], "x") == ["- r: meets every bar"]  # FC below the bar too


def test_the_page_block_is_replaced_in_place(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"head\n{mc_regimes.BEGIN}\nold\n{mc_regimes.END}\ntail\n")
    write_block(page, "new\n")
    assert page.read_text() == f"head\n{mc_regimes.BEGIN}\nnew\n{mc_regimes.END}\ntail\n"
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    with pytest.raises(ValueError, match="no <!-- mc-regimes:begin -->"):
        write_block(bare, "new\n")
