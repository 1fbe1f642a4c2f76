"""``robust-pfl plot``: figures of a grid store or a run history (robust_pfl.plotting).

Stores here are small hand-written tables in the grid store's and the run history's
column layouts, so every plotted number has a hand-computed counterpart."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from robust_pfl import plotting  # noqa: E402
from robust_pfl.cli import main  # noqa: E402
from robust_pfl.config import ConfigError  # noqa: E402
from robust_pfl.engine.results import write_files  # noqa: E402

AXES = ["attack", "method", "seed", "byzantine.total"]
FIGURES = ("curves", "heatmap", "byzantine_fraction")  # the three figures


def store_rows(finals: dict[tuple[str, str, int, int], float], clients: int = 20, rounds: int = 4,
               metric: str = "test_accuracy") -> list[dict]:
    """A grid store's rows: one ok cell per (attack, method, seed, byzantine) key whose
    metric climbs linearly to ``finals[key]`` at round ``rounds``, a ``test_loss``
    beside it, and the ``cell_seconds`` row that closes each block."""
    rows = []
    for number, ((attack, method, seed, byzantine), final) in enumerate(finals.items()):
        cell = {"cell": f"{number:016x}", "attack": attack, "method": method, "seed": seed,
                "byzantine.total": byzantine, "n_clients": clients, "n_byzantine": byzantine,
                "status": "ok", "error": ""}
        for round_index in range(0, rounds + 1, 2):
            last = round_index == rounds
            rows.append({**cell, "round": round_index, "metric": metric,
                         "value": final * round_index / rounds, "final": last})
            rows.append({**cell, "round": round_index, "metric": "test_loss", "value": 1.0 / (1 + round_index),
                         "final": last})
        rows.append({**cell, "round": rounds, "metric": "cell_seconds", "value": 0.5, "final": True})
    return rows


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or list(rows[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


# attack x method x seed at 2 of 20 clients Byzantine (fraction 0.1), accuracies as fractions
FINALS = {
    ("none", "fc", 0, 2): 0.90, ("none", "fc", 1, 2): 0.80,
    ("none", "global", 0, 2): 0.70, ("none", "global", 1, 2): 0.50,
    ("large_gradient", "fc", 0, 2): 0.85, ("large_gradient", "fc", 1, 2): 0.75,
    ("large_gradient", "global", 0, 2): 0.10, ("large_gradient", "global", 1, 2): 0.20,
}


def view_of(path: Path, metric: str | None = None) -> plotting.MetricView:
    results = plotting.load_results(path)
    return plotting.metric_view(results, plotting.choose_metric(results, metric))


# -- figures on disk -------------------------------------------------------------------------
def test_grid_store_gives_every_figure_as_png_and_pdf(tmp_path, capsys):
    """Two Byzantine fractions: all three figures, each a PNG that opens and a PDF,
    written into RESULTS/plots with no temporary file left; the command prints them."""
    finals = {**FINALS, **{(a, m, s, 4): v / 2 for (a, m, s, _), v in FINALS.items()}}
    write_csv(tmp_path / "results.csv", store_rows(finals))

    assert main(["plot", str(tmp_path)]) == 0

    out = tmp_path / "plots"
    printed = capsys.readouterr().out
    expected = {f"{name}-test_accuracy.{kind}" for name in FIGURES for kind in ("png", "pdf")}
    assert {p.name for p in out.iterdir()} == expected  # nothing else: no staged temporaries
    for name in FIGURES:
        image = matplotlib.image.imread(out / f"{name}-test_accuracy.png")
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert (out / f"{name}-test_accuracy.pdf").read_bytes().startswith(b"%PDF")
        assert str(out / f"{name}-test_accuracy.png") in printed and str(out / f"{name}-test_accuracy.pdf") in printed
    assert "skipped" not in printed


def test_one_fraction_skips_the_fraction_figure_with_a_note(tmp_path):
    """The note says why, and no stale fraction figure stays beside the new ones."""
    write_csv(tmp_path / "store.csv", store_rows(FINALS))
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "byzantine_fraction-test_accuracy.png").write_text("an earlier call's figure")

    report = plotting.plot_results(tmp_path / "store.csv", tmp_path / "figures")

    assert sorted(p.name for p in report.files) == [
        "curves-test_accuracy.pdf", "curves-test_accuracy.png", "heatmap-test_accuracy.pdf", "heatmap-test_accuracy.png"]
    assert all(p.stat().st_size > 0 for p in report.files)
    assert not (tmp_path / "figures" / "byzantine_fraction-test_accuracy.png").exists()
    assert report.notes == ["byzantine_fraction: skipped (one Byzantine fraction in the data: 0.1)"]


def test_run_history_plots_with_the_configs_attack(tmp_path, capsys):
    """A run's history.csv (leading extra column ``setting``): one attack, named by the
    config in summary.json beside it, so no heatmap; no fraction axis, so that figure
    is skipped too."""
    rows = [
        {"setting": setting, "method": method, "seed": seed, "round": r, "metric": "param_error",
         "value": 10.0 ** (-r) * (1 + seed)}
        for setting in ("K=4", "K=16") for method in ("fc", "local") for seed in (0, 1) for r in range(4)
    ]
    write_csv(tmp_path / "history.csv", rows)
    (tmp_path / "summary.json").write_text(json.dumps({"config": {"attack": {"name": "large_gradient"}}}))

    results = plotting.load_results(tmp_path)
    assert results.kind == "run"
    assert set(results.frame["attack"]) == {"large_gradient"}
    assert set(results.frame["setting"]) == {"setting=K=4", "setting=K=16"}
    assert main(["plot", str(tmp_path / "history.csv"), "--out", str(tmp_path / "p")]) == 0
    printed = capsys.readouterr().out
    assert "plotted param_error" in printed
    assert "byzantine_fraction: skipped (history.csv records no Byzantine fraction)" in printed
    assert "heatmap: skipped (one attack in the data: large_gradient; the curves show it)" in printed
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["curves-param_error.pdf", "curves-param_error.png"]


def test_a_backdoor_runs_success_rate_is_plotted_beside_its_accuracy(tmp_path, capsys):
    """A history recording ``attack_success_rate`` (a backdoor run) gets its figures
    too, in percent, without ``--metric``; ``--metric`` still plots only that one."""
    rows = [
        {"method": "global", "seed": 0, "round": r, "metric": metric, "value": value}
        for r in range(3) for metric, value in (("test_accuracy", 0.5 + 0.1 * r), ("attack_success_rate", 0.3 * r))
    ]
    write_csv(tmp_path / "history.csv", rows)
    (tmp_path / "summary.json").write_text(json.dumps({"config": {"attack": {"name": "badnets"}}}))
    assert main(["plot", str(tmp_path / "history.csv"), "--out", str(tmp_path / "p")]) == 0
    printed = capsys.readouterr().out
    assert "plotted test_accuracy" in printed and "plotted attack_success_rate" in printed
    names = {p.name for p in (tmp_path / "p").iterdir()}
    assert {"curves-attack_success_rate.png", "curves-attack_success_rate.pdf"} <= names
    view = plotting.metric_view(plotting.load_results(tmp_path), "attack_success_rate")
    assert view.percent and view.label == "Attack success rate (%)"
    assert sorted(view.frame["value"].round(6)) == [0.0, 30.0, 60.0]
    assert main(["plot", str(tmp_path / "history.csv"), "--out", str(tmp_path / "q"), "--metric", "test_accuracy"]) == 0
    assert "attack_success_rate" not in capsys.readouterr().out


# -- what the figures show -------------------------------------------------------------------
def test_heatmap_shows_hand_computed_means_over_seeds_in_percent(tmp_path):
    """Cells are the mean over seeds of each run's last-round value, in percent:
    none/fc (90 + 80) / 2 = 85, none/global (70 + 50) / 2 = 60, large_gradient/fc
    (85 + 75) / 2 = 80, large_gradient/global (10 + 20) / 2 = 15; the figure writes
    exactly these numbers, baseline attack first."""
    write_csv(tmp_path / "results.csv", store_rows(FINALS))
    view = view_of(tmp_path)
    assert view.percent and view.label == "Test accuracy (%)"

    (table,) = plotting.heatmap_tables(view)

    assert list(table.mean.index) == ["none", "large_gradient"]
    assert list(table.mean.columns) == ["fc", "global"]
    expected = [[85.0, 60.0], [80.0, 15.0]]
    assert table.mean.to_numpy().ravel().tolist() == pytest.approx(sum(expected, []))
    assert table.runs.to_numpy().tolist() == [[2, 2], [2, 2]]
    figure = plotting.heatmap_figure(view, [table])
    try:
        texts = {(round(t.get_position()[1] - 0.5), round(t.get_position()[0] - 0.5)): t.get_text()
                 for t in figure.axes[0].texts}
    finally:
        plt.close(figure)
    assert texts == {(0, 0): "85.0", (0, 1): "60.0", (1, 0): "80.0", (1, 1): "15.0"}


def test_a_cell_replaced_by_an_edited_grid_file_is_not_plotted(tmp_path):
    """A store keeps the cells of an earlier version of its grid file: none/fc seed 0
    first ran at 0.20, then (options changed, same label) at 0.90.  Only the cell
    appended last counts: none/fc is (90 + 80) / 2 = 85, not the mean of three runs."""
    earlier = store_rows({("none", "fc", 0, 2): 0.20})
    for row in earlier:
        row["cell"] = "e" * 16
    write_csv(tmp_path / "results.csv", earlier + store_rows(FINALS))
    (table,) = plotting.heatmap_tables(view_of(tmp_path))
    assert table.mean.loc["none", "fc"] == pytest.approx(85.0)
    assert table.runs.loc["none", "fc"] == 2


def test_final_value_is_each_runs_last_recorded_round(tmp_path):
    """Rows out of round order, and runs of different lengths: each run's final value
    is the one at its own largest round."""
    rows = store_rows({("none", "fc", 0, 0): 0.6, ("none", "fc", 1, 0): 0.4}, rounds=4)
    rows = [r for r in rows if not (r["seed"] == 1 and r["round"] == 4) or r["metric"] == "cell_seconds"]
    # seed 1 stopped at round 2 (0.2); each block's rows reversed, its cell_seconds row kept last
    blocks = [[r for r in rows if r["seed"] == seed] for seed in (0, 1)]
    rows = [r for block in blocks for r in [*reversed(block[:-1]), block[-1]]]
    write_csv(tmp_path / "results.csv", rows, columns=list(rows[0]))
    view = view_of(tmp_path)

    final = plotting.final_values(view).set_index("seed")["value"]

    assert final.to_dict() == pytest.approx({0: 60.0, 1: 20.0})
    (table,) = plotting.heatmap_tables(view)
    assert table.mean.loc["none", "fc"] == pytest.approx(40.0)


def test_missing_combination_is_blank_and_a_diverged_run_reads_inf(tmp_path):
    rows = store_rows({("none", "fc", 0, 0): 0.5, ("none", "global", 0, 0): 0.5,
                       ("large_gradient", "fc", 0, 0): 0.5})
    rows = [r for r in rows if r["metric"] in ("test_loss", "cell_seconds")]  # 1 / (1 + round)
    for row in rows:
        if row["method"] == "global" and row["round"] == 4:
            row["value"] = float("inf")
    write_csv(tmp_path / "results.csv", rows)
    view = view_of(tmp_path, "test_loss")
    (table,) = plotting.heatmap_tables(view)
    assert table.runs.loc["large_gradient", "global"] == 0

    figure = plotting.heatmap_figure(view, [table])
    try:
        texts = sorted(t.get_text() for t in figure.axes[0].texts)
    finally:
        plt.close(figure)
    assert texts == sorted(["0.2", "0.2", "inf"])  # three runs, 1 / (1 + 4) each but the diverged one


def test_shown_fraction_is_the_most_common_and_the_largest_on_a_tie(tmp_path):
    finals = {
        ("large_gradient", "fc", 0, 2): 0.5, ("large_gradient", "fc", 1, 2): 0.5,  # 2 runs at 0.1
        ("large_gradient", "fc", 0, 4): 0.5,                                       # 1 run at 0.2
        ("none", "fc", 0, 0): 0.5, ("none", "fc", 0, 4): 0.5,                      # tie: 0.0 and 0.2
    }
    write_csv(tmp_path / "results.csv", store_rows(finals))
    view = view_of(tmp_path)

    shown = plotting.shown_fractions(view.frame).set_index("attack")["fraction"].to_dict()

    assert shown == pytest.approx({"large_gradient": 0.1, "none": 0.2})


def test_percent_only_for_accuracies_held_as_fractions(tmp_path):
    rows = store_rows({("none", "fc", 0, 0): 0.5}, metric="accuracy")
    write_csv(tmp_path / "a" / "results.csv", rows)
    assert view_of(tmp_path / "a").percent
    already_percent = [{**r, "value": r["value"] * 100} if r["metric"] == "accuracy" else r for r in rows]
    write_csv(tmp_path / "b" / "results.csv", already_percent)
    view = view_of(tmp_path / "b")
    assert not view.percent and view.frame["value"].max() == pytest.approx(50.0)


def test_default_metric_prefers_test_accuracy_then_param_error_then_the_first(tmp_path):
    def metric_of(metrics: list[str]) -> str:
        rows = [{"method": "fc", "seed": 0, "round": 0, "metric": m, "value": 1.0} for m in metrics]
        write_csv(tmp_path / "history.csv", rows)
        return plotting.choose_metric(plotting.load_results(tmp_path))

    assert metric_of(["train_loss", "param_error", "accuracy", "test_accuracy"]) == "test_accuracy"
    assert metric_of(["train_loss", "param_error", "accuracy"]) == "accuracy"
    assert metric_of(["train_loss", "param_error"]) == "param_error"
    assert metric_of(["train_loss", "ari"]) == "train_loss"


def test_column_roles(tmp_path):
    """Method options join the defense label, attack options the attack label; count
    axes and unlabelled byzantine tables become the fraction; a labelled placement and
    task options are settings; error cells and cell_seconds rows are dropped."""
    base = {"cell": "c", "attack": "bit_flip", "attack.source": "client", "method": "fc", "method.lr": "0.1",
            "seed": 0, "byzantine.total": 5, "byzantine": "paper text", "task.kind": "rotation",
            "n_clients": 50, "n_byzantine": 5, "status": "ok", "error": "", "round": 1, "metric": "accuracy",
            "value": 0.5, "final": True}
    failed = {**base, "cell": "d", "status": "error", "error": "ValueError: x", "round": "", "metric": "cell_seconds",
              "value": 0.1}
    write_csv(tmp_path / "results.csv", [base, {**base, "metric": "cell_seconds"}, failed])

    frame = plotting.load_results(tmp_path).frame

    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["defense"] == "fc, method.lr=0.1"
    assert row["attack"] == "bit_flip, attack.source=client"
    assert row["setting"] == "byzantine=paper text, task.kind=rotation"
    assert row["fraction"] == pytest.approx(0.1)
    unlabelled = {**base, "byzantine": '{"total": 5}'}
    write_csv(tmp_path / "results.csv", [unlabelled, {**unlabelled, "metric": "cell_seconds"}])
    assert plotting.load_results(tmp_path).frame.iloc[0]["setting"] == "task.kind=rotation"


def test_grid_without_attack_axis_names_the_attack_from_grid_json(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "attack"} for r in store_rows({("x", "fc", 0, 0): 0.5})]
    write_csv(tmp_path / "results.csv", rows)
    assert set(plotting.load_results(tmp_path).frame["attack"]) == {plotting.NO_ATTACK_RECORDED}
    grid = {"cells": {rows[0]["cell"]: {"axes": {}, "config": {"attack": {"name": "sign_flip"}}}}}
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    assert set(plotting.load_results(tmp_path).frame["attack"]) == {"sign_flip"}


# -- bad input -------------------------------------------------------------------------------
def test_bad_input_exits_2_naming_the_problem(tmp_path, capsys):
    write_csv(tmp_path / "store" / "results.csv", store_rows(FINALS))
    errored = [{**r, "status": "error"} for r in store_rows(FINALS)]
    write_csv(tmp_path / "failed" / "results.csv", errored)
    write_csv(tmp_path / "other.csv", [{"a": 1, "b": 2}])
    (tmp_path / "empty").mkdir()
    cases = {
        (str(tmp_path / "nowhere"),): "no such file or directory",
        (str(tmp_path / "empty"),): "neither results.csv nor history.csv",
        (str(tmp_path / "failed"),): "no rows to plot",
        (str(tmp_path / "other.csv"),): "found a, b",
        (str(tmp_path / "store"), "--metric", "acc"): "--metric 'acc': not in",
    }
    for arguments, message in cases.items():
        assert main(["plot", *arguments]) == 2, arguments
        error = capsys.readouterr().err
        assert message in error, (arguments, error)
    assert "available: test_accuracy, test_loss" in error
    assert not (tmp_path / "store" / "plots").exists()


def test_a_block_cut_by_a_kill_is_not_plotted(tmp_path):
    """A killed grid leaves its running cell's rows without their ``cell_seconds`` row,
    the last line cut mid-value: that cell is no result (its rerun replaces it)."""
    finished = store_rows({("none", "fc", 0, 2): 0.9})
    cut = [{**row, "cell": "f" * 16, "seed": 1} for row in store_rows({("none", "fc", 1, 2): 0.5})[:-1]]
    path = write_csv(tmp_path / "results.csv", finished + cut)
    text = path.read_text()
    path.write_text(text[: text.rindex(",0.5,") + 3])  # the final 0.5 cut to "0."
    frame = plotting.load_results(tmp_path).frame
    assert set(frame["run"]) == {finished[0]["cell"]} and set(frame["seed"]) == {0}


def test_non_numeric_value_names_the_column(tmp_path):
    rows = store_rows({("none", "fc", 0, 0): 0.5})
    rows[0]["value"] = "high"
    write_csv(tmp_path / "results.csv", rows)
    with pytest.raises(ConfigError, match="column 'value' holds 'high', not a number"):
        plotting.load_results(tmp_path)


def test_write_files_stages_everything_before_moving(tmp_path):
    """A file that fails while staged leaves the previous set whole, no temporaries."""
    write_files(tmp_path, {"a.txt": "old a", "b.txt": "old b"})

    def broken(path: Path) -> None:
        raise RuntimeError("cannot draw")

    with pytest.raises(RuntimeError):
        write_files(tmp_path, {"a.txt": "new a", "b.txt": broken})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    assert (tmp_path / "a.txt").read_text() == "old a"


# -- figures a paper can use (issue 44): on a real run and a real grid ---------------------------
PAPER_RUN = """\
seeds = [0]
rounds = 2
eval_every = 1
batch_size = 8
task = { name = "image", dataset = "digits", kind = "private_label", clusters = 2, clients_per_cluster = 3, \
model = { name = "mlp", hidden = [16] } }
byzantine = { total = 1 }
attack = { name = "large_gradient" }
methods = [
    { name = "ground_truth", lr = 0.1 },
    { name = "global", label = "global+median", aggregator = "median", lr = 0.1 },
    { name = "fc", lr = 0.1 },
    { name = "local", lr = 0.1 },
]
"""
#: The config's order (alphabetical would be fc, global+median, ground_truth, local) by
#: the names the figures give them.
SHOWN_METHODS = ["GT (oracle clusters)", "Global + median", "FC", "Local"]


@pytest.fixture(scope="module")
def paper(tmp_path_factory) -> Path:
    """A real run (one attack) in ``run/`` and a real grid of the same config under two
    attacks in ``grid/``: 2 rounds of 4 methods on the embedded digits."""
    root = tmp_path_factory.mktemp("paper")
    (root / "run.toml").write_text(PAPER_RUN)
    (root / "grid.toml").write_text(PAPER_RUN + '\n[grid]\nattack = [{name = "large_gradient"}, {name = "none"}]\n')
    assert main(["run", str(root / "run.toml"), "--out", str(root / "run"), "--quiet"]) == 0
    assert main(["grid", str(root / "grid.toml"), "--out", str(root / "grid"), "--quiet"]) == 0
    return root


def legend_texts(figure) -> list[str]:
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


@pytest.mark.parametrize("store", ["run", "grid"])
def test_legend_lists_methods_in_config_order_by_readable_names(paper, store):
    view = view_of(paper / store)
    figure = plotting.curves_figure(view)
    try:
        assert legend_texts(figure) == SHOWN_METHODS
        titles = [axis.get_title() for axis in figure.axes]
    finally:
        plt.close(figure)
    # the baseline first, whatever the grid's order; attacks by their names
    assert titles == (["attack: Large gradient"] if store == "run" else ["attack: No attack", "attack: Large gradient"])


def test_heatmap_columns_in_config_order_by_readable_names(paper):
    view = view_of(paper / "grid")
    (table,) = plotting.heatmap_tables(view)
    assert list(table.mean.columns) == ["ground_truth", "global+median", "fc", "local"]  # the data keep the labels
    figure = plotting.heatmap_figure(view, [table])
    try:
        axis = figure.axes[0]
        assert [t.get_text() for t in axis.get_xticklabels()] == SHOWN_METHODS
        assert [t.get_text() for t in axis.get_yticklabels()] == ["No attack", "Large gradient"]
        assert (axis.collections[0].norm.vmin, axis.collections[0].norm.vmax) == (0.0, 100.0)  # accuracy's scale
    finally:
        plt.close(figure)


@pytest.mark.parametrize("store", ["run", "grid"])
def test_accuracy_axes_run_from_0_to_100(paper, store):
    """Accuracies in percent on 0-100 axes, however close together the runs ended
    (these all near 15 %); a loss keeps the axis its values give."""
    view = view_of(paper / store)
    assert view.percent
    figure = plotting.curves_figure(view)
    try:
        assert [axis.get_ylim() for axis in figure.axes] == [(0.0, 100.0)] * len(figure.axes)
    finally:
        plt.close(figure)
    loss = plotting.curves_figure(view_of(paper / store, "test_loss"))
    try:
        assert all(axis.get_ylim() != (0.0, 100.0) for axis in loss.axes)
    finally:
        plt.close(loss)


def test_titles_sit_above_the_panels(paper):
    """Each figure's title (its suptitle) starts above the top of every panel, the
    panels' own titles and tick labels included: it covers no data."""
    view = view_of(paper / "grid")
    figures = [plotting.curves_figure(view), plotting.heatmap_figure(view, plotting.heatmap_tables(view))]
    try:
        for figure in figures:
            renderer = figure.canvas.get_renderer()
            title = figure._suptitle.get_window_extent(renderer)
            top = max(axis.get_tightbbox(renderer).y1 for axis in figure.axes)
            assert title.y0 >= top - 0.5, (title, top)
    finally:
        for figure in figures:
            plt.close(figure)


def test_pngs_are_300_dpi_and_one_attack_draws_no_heatmap(paper, capsys):
    """Every PNG says 300 dpi in its metadata, beside its PDF; the grid (two attacks)
    gets a heatmap, the run (one attack) none, with a note saying why."""
    from PIL import Image

    grid = plotting.plot_results(paper / "grid", paper / "grid-plots")
    run = plotting.plot_results(paper / "run", paper / "run-plots")
    assert {p.name for p in grid.files} == {f"{f}-test_accuracy.{k}" for f in ("curves", "heatmap") for k in ("png", "pdf")}
    assert {p.name for p in run.files} == {f"curves-test_accuracy.{k}" for k in ("png", "pdf")}
    assert "heatmap: skipped (one attack in the data: large_gradient; the curves show it)" in run.notes
    assert not any(note.startswith("heatmap") for note in grid.notes)
    for path in [*grid.files, *run.files]:
        if path.suffix == ".png":
            with Image.open(path) as image:
                assert image.info["dpi"] == pytest.approx((300, 300), abs=0.01)
        else:
            assert path.read_bytes().startswith(b"%PDF")


def test_every_registered_name_has_a_readable_name():
    """New algorithms, aggregators and attacks get a name in the figures' table."""
    import attacks
    import defenses
    from robust_pfl import display_names as names

    assert set(defenses.REGISTRY) <= set(names.METHOD_NAMES)
    assert set(defenses.AGGREGATORS) | set(defenses.PRE_AGGREGATORS) <= set(names.AGGREGATOR_NAMES)
    assert set(attacks.REGISTRY) | {"none"} <= set(names.ATTACK_NAMES)


@pytest.mark.parametrize("label, shown", [
    ("ground_truth", "GT (oracle clusters)"), ("global+median", "Global + median"), ("fc", "FC"),
    ("Global+krum+nnm", "Global + Krum + NNM"), ("fc, method.lr=0.1", "FC, method.lr=0.1"),
    ("CGPFL (K = 4)", "CGPFL (K = 4)"), ("median", "median"), ("global+nosuch", "global+nosuch"),
])
def test_method_names(label, shown):
    from robust_pfl.display_names import method_name

    assert method_name(label) == shown


def test_labels_whose_names_coincide_keep_their_labels():
    from robust_pfl.display_names import display_names, method_name

    assert display_names(["global+median", "Global+median", "fc"], method_name) == {
        "global+median": "global+median", "Global+median": "Global+median", "fc": "FC"}
    assert display_names(["fc", "FC"], method_name) == {"fc": "fc", "FC": "FC"}
