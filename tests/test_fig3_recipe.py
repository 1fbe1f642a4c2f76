"""The Fig. 3 reproduction (Werner et al. Sec. 4.1): grid, outputs, and the claims."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from robust_pfl.recipes import fig3


def test_radius_grid_follows_cluster_fraction():
    """At K = 16 the official quantile 0.25 exceeds the cluster fraction 1/16; the
    issue requires the grid to include q = 1/K there."""
    quantiles = {r["q"] for r in fig3.radius_grid(16)}
    assert 1 / 16 in quantiles and 0.25 in quantiles
    assert all(r["strict"] for r in fig3.radius_grid(4))


def test_only_fc_searches_radii():
    mode = fig3.Mode(rounds=1, learning_rates=(1e-3, 1e-2), seeds=1, eval_every=1)
    assert len(fig3.candidates("local", 4, mode)) == 2
    assert len(fig3.candidates("fc", 4, mode)) == 2 * len(fig3.radius_grid(4))
    assert all(c["heavy_ball"] == 0.9 for c in fig3.candidates("global", 4, mode))


def test_tiny_run_writes_tidy_results(tmp_path):
    """End to end on a tiny grid: files exist, history is tidy with one panel per
    setting, the chosen learning rate comes from the grid, and the acceptance checks
    are reported for each claim."""
    mode = fig3.Mode(rounds=4, learning_rates=(1e-3,), seeds=2, eval_every=2)
    summary = fig3.run(tmp_path, mode=mode, progress=False)
    history = pd.read_csv(tmp_path / "history.csv")
    assert set(history["setting"]) == {"K=4,n=4", "K=4,n=16", "K=16,n=4"}
    assert set(history["method"]) == set(fig3.LABELS.values())
    assert set(history["seed"]) == {0, 1}
    assert (tmp_path / "fig3.png").stat().st_size > 0
    table = (tmp_path / "fig3.md").read_text()
    assert table.count("| K=") == 3 and "FC" in table
    saved = json.loads((tmp_path / "summary.json").read_text())
    for methods in saved["settings"].values():
        for result in methods.values():
            assert result["chosen"]["lr"] == 1e-3
            assert len(result["param_error_per_seed"]) == 2
    assert set(summary["checks"]) == {
        "K=4,n=4: FC below Local",
        "K=4,n=4: FC below Global",
        "K=4,n=16: FC below Local",
        "K=4,n=16: FC below Global",
        "K=4,n=16: FC within 25% of GT (final error)",
        "K=4,n=16: FC within 25% of GT (rounds to 1e-6)",
    }


def test_rounds_to_reach_is_first_hit():
    from robust_pfl.engine.results import ResultTable

    table = ResultTable()
    for round_index, value in [(0, 5.0), (10, 1e-3), (20, 1e-7), (30, 1e-9)]:
        table.add("FC", 0, round_index, {"param_error": value, "test_loss": 0.0})
    assert fig3.rounds_to_reach(table, 1e-6) == 20
    assert fig3.rounds_to_reach(table, 1e-12) is None


def test_selection_prefers_faster_convergence_and_rejects_divergence():
    """Two runs ending at the same round-off value: the one that got there sooner scores
    lower; a run with a non-finite validation loss is never chosen."""
    from robust_pfl.engine.results import ResultTable

    fast, slow, diverged = ResultTable(), ResultTable(), ResultTable()
    for round_index, (a, b, c) in enumerate([(1.0, 1.0, 1.0), (1e-20, 1e-3, float("inf")), (1e-26, 1e-26, 1.0)]):
        fast.add("FC", 0, round_index, {"validation_loss": a})
        slow.add("FC", 0, round_index, {"validation_loss": b})
        diverged.add("FC", 0, round_index, {"validation_loss": c})
    assert fig3.selection_score(fast) < fig3.selection_score(slow)
    assert fig3.selection_score(diverged) == float("inf")


@pytest.mark.slow
def test_full_reproduction_meets_the_papers_claims(tmp_path):
    """Full mode (800 rounds, 3 seeds, learning-rate grid): FC below Local and Global
    at (4, 4) and (4, 16), and within 25% of GT at (4, 16) (the issue's acceptance):
    in final error (both at round-off counts as equal) and in rounds to reach 1e-6."""
    summary = fig3.run(tmp_path, progress=False)
    failed = [claim for claim, ok in summary["checks"].items() if not ok]
    assert not failed, failed
