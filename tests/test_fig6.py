"""``reproduce fig6``: the grid it runs, the aggregators' f, the claim it checks, and a
tiny end-to-end run that resumes."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import defenses
from robust_pfl import cli
from robust_pfl.recipes import fig6


@pytest.mark.parametrize("byzantine, clients", [(50, 250), (200, 400), (10, 50), (40, 80)])
def test_aggregator_f_is_the_byzantine_count_capped_where_the_rule_allows(byzantine, clients):
    """f is the Byzantine count unless the rule refuses it at this N; then the largest
    f the rule accepts (one more is refused)."""
    specs = fig6.aggregators(byzantine, clients)
    for label in ("Global+krum", "Global+trimmed_mean"):
        spec = specs[label]
        defenses.make_aggregator(spec).check(clients)
        assert spec["f"] <= byzantine
        if spec["f"] < byzantine:
            with pytest.raises(ValueError):
                defenses.make_aggregator({**spec, "f": spec["f"] + 1}).check(clients)


def test_digits_grid_has_the_papers_placements_and_lengths(single_thread):
    grid = fig6.merged(fig6.grids(fig6.DIGITS, None, quick=True, panels=fig6.PANELS), "test")
    honest = 4 * fig6.DIGITS.clients_per_cluster
    by_panel: dict[tuple[str, str], list] = {}
    for cell in grid.cells:
        by_panel.setdefault((cell.axes["attack"], cell.axes.get("byzantine", "none")), []).append(cell)
    assert {key: len(cells) for key, cells in by_panel.items()} == {
        ("reference", "none"): 2,  # FC and Global without Byzantine clients
        ("large_gradient", "official"): 7,
        ("large_gradient", "paper_text"): 7,
        ("bit_flip", "official"): 7,
        ("bit_flip", "paper_text"): 7,
    }
    for (panel, placement), cells in by_panel.items():
        byzantine = {"none": 0, "official": fig6.DIGITS.byzantine, "paper_text": 4 * fig6.DIGITS.byzantine}[placement]
        steps = {"reference": fig6.QUICK_BIT_FLIP_STEPS, "large_gradient": fig6.DIGITS.large_gradient_steps,
                 "bit_flip": fig6.QUICK_BIT_FLIP_STEPS}[panel]
        for cell in cells:
            assert (cell.n_byzantine, cell.n_clients) == (byzantine, honest + byzantine)
            assert cell.config["rounds"] == steps
            assert (cell.config.get("checkpoint_every") is not None) == (steps > fig6.DIGITS.checkpoint_every)
    fc = next(c for c in by_panel[("bit_flip", "official")] if c.axes["method"] == "FC")
    assert fc.config["methods"][0]["radius"] == {"policy": "quantile", "q": 0.2, "rule": "official"}
    assert fc.config["attack"]["source"] == "client_model"


def test_merged_grid_starts_the_long_fc_cells_first(single_thread):
    """Longest first: the same cells, every FC cell ahead of every other, FC's by
    decreasing client-steps, the others in the order the parts gave them."""
    parts = fig6.grids(fig6.DIGITS, None, quick=True, panels=fig6.PANELS)
    given = [cell for grid in parts for cell in grid.cells]
    ordered = fig6.merged(parts, "test").cells
    assert sorted(c.cell for c in ordered) == sorted(c.cell for c in given)
    is_fc = [c.axes["method"] == "FC" for c in ordered]
    assert is_fc == sorted(is_fc, reverse=True)
    fc_work = [c.config["rounds"] * c.n_clients for c in ordered if c.axes["method"] == "FC"]
    assert fc_work == sorted(fc_work, reverse=True)
    assert fc_work[0] == fig6.QUICK_BIT_FLIP_STEPS * 4 * (fig6.DIGITS.clients_per_cluster + fig6.DIGITS.byzantine)
    others = [c.cell for c in ordered if c.axes["method"] != "FC"]
    assert others == [c.cell for c in given if c.axes["method"] != "FC"]


def _frame(fc: float, clean: float, global_: float) -> pd.DataFrame:
    rows = []
    for attack, placement, method, value in [
        ("large_gradient", "official", "FC", fc),
        ("large_gradient", "official", "Global", global_),
        ("reference", None, "FC", clean),
    ]:
        rows.append({"attack": attack, "byzantine": placement, "method": method, "metric": "test_accuracy",
                     "round": 30, "value": value, "final": True, "status": "ok"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "fc, clean, global_, holds, beats",
    [(0.90, 0.92, 0.10, True, True), (0.88, 0.92, 0.10, False, True), (0.90, 0.92, 0.61, True, False)],
)
def test_claim_is_within_three_points_of_clean_fc_and_thirty_above_global(fc, clean, global_, holds, beats):
    frame = _frame(fc, clean, global_)
    [claim] = fig6.checks(frame, fig6.finals(frame))
    assert (claim["fc_holds"], claim["beats_global"]) == (holds, beats)


def test_tiny_run_writes_its_outputs_and_resumes(tmp_path, monkeypatch, single_thread):
    tiny = fig6.Scale("digits", 3, 2, 8, large_gradient_steps=4, bit_flip_steps=12, checkpoint_every=4)
    monkeypatch.setattr(fig6, "DIGITS", tiny)
    monkeypatch.setattr(fig6, "QUICK_BIT_FLIP_STEPS", 8)
    status = fig6.main(tmp_path, quick=True, panels=("bit_flip",))
    assert status == 0  # quick mode: a smoke run that decides no claim
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["holds"] is None
    assert (tmp_path / "fig6.png").stat().st_size > 0
    assert "bit_flip (official)" in (tmp_path / "fig6.md").read_text()
    assert not any((tmp_path / "grid" / "checkpoints").glob("*.pt"))  # removed once stored
    fig6.main(tmp_path, quick=True, panels=("bit_flip",))
    again = json.loads((tmp_path / "grid" / "summary.json").read_text())
    assert again["ran"] == 0 and again["skipped"] == again["cells"] == 16


def test_cli_passes_panel_quick_and_data_dir(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(fig6, "main", lambda out, **kw: calls.append((out, kw)) or 0)
    args = ["reproduce", "fig6", "--quick", "--panel", "large_gradient", "--data-dir", "d", "--out", str(tmp_path)]
    assert cli.main(args) == 0
    [(out, kw)] = calls
    assert out == tmp_path and kw["quick"] and kw["data_dir"] == "d" and kw["panels"] == ("large_gradient",)


def test_an_errored_cell_fails_the_figure(tmp_path, monkeypatch, single_thread):
    """A cell that raises leaves its panel unchecked: the figure exits 1 and names it."""
    tiny = fig6.Scale("digits", 3, 2, 8, large_gradient_steps=4, bit_flip_steps=12, checkpoint_every=4)
    monkeypatch.setattr(fig6, "DIGITS", tiny)
    real = fig6.run_grid

    def failing(grid, out, backend=None):
        summary = real(grid, out, backend)
        return {**summary, "errored": {grid.cells[-1].cell: "RuntimeError: boom"}}

    monkeypatch.setattr(fig6, "run_grid", failing)
    assert fig6.main(tmp_path, quick=True, panels=("large_gradient",)) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not summary["holds"] and "RuntimeError: boom" in (tmp_path / "fig6.md").read_text()


@pytest.mark.parametrize(
    "args, named",
    [(["fig6", "--seeds", "2"], "--seeds"), (["fig3", "--jobs", "2"], "--jobs"), (["fig7", "--backend", "ray"], "--backend")],
)
def test_options_a_recipe_does_not_take_are_refused(args, named, capsys):
    assert cli.main(["reproduce", *args]) == 2
    assert named in capsys.readouterr().err
