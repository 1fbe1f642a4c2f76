"""Figures a reader can read (issue 31, item 6): one file per metric, readable axis
names, a marker at every evaluation and lines that stay apart where they coincide, a
legend entry for every line, tick labels of at most 3 significant digits that do not
overlap, and Fig. 6's reference evaluated at every step FC is evaluated at.

Figures are drawn from tiny synthetic tables (no training) and read back as matplotlib
objects: lines, legends, tick labels after a draw."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from robust_pfl import plotting  # noqa: E402
from robust_pfl.recipes import fig2, fig6, fig7  # noqa: E402
from theory_checks import report_figures  # noqa: E402
from theory_checks.types import CheckResult, PowerLaw  # noqa: E402

from test_plotting import FINALS, store_rows, write_csv  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


# -- helpers: what a reader sees ---------------------------------------------------------------
def data_lines(figure) -> list:
    """Every drawn line with data, in every axes of ``figure``."""
    return [line for axis in figure.axes for line in axis.get_lines() if len(line.get_xdata()) > 0]


def style(artist) -> tuple:
    """What tells two lines apart: colour, line style, marker."""
    marker = artist.get_marker()
    return to_hex(artist.get_color()), artist.get_linestyle(), None if marker in (None, "", "None", " ") else marker


def legends(figure) -> list:
    return [*figure.legends, *(axis.get_legend() for axis in figure.axes if axis.get_legend() is not None)]


def legend_entries(figure) -> tuple[set[str], set[tuple]]:
    """The texts and the styles of every legend entry (figure and axes legends)."""
    texts, styles = set(), set()
    for legend in legends(figure):
        texts |= {text.get_text() for text in legend.get_texts()}
        styles |= {style(handle) for handle in legend.legend_handles if isinstance(handle, Line2D)}
    return texts, styles


def assert_every_line_in_a_legend(figure) -> None:
    """Each drawn line's look (colour, line style, marker) has a legend entry, and a
    labelled line's label is among the legend's texts."""
    texts, styles = legend_entries(figure)
    assert texts, "no legend"
    for line in data_lines(figure):
        assert style(line) in styles, f"line {line.get_label()!r} {style(line)} has no legend entry"
        if not line.get_label().startswith("_"):
            assert line.get_label() in texts


def significant_digits(text: str) -> int:
    """Significant digits of a number as a tick label writes it (``0.0303`` -> 3,
    ``2.83`` -> 3, ``512`` -> 3, ``1e+04`` -> 1)."""
    mantissa = re.sub(r"e[+-]?\d+$", "", text.replace("\u2212", "-").strip("$").lstrip("-"))
    return len(mantissa.replace(".", "").lstrip("0")) or 1


def grid_store(tmp_path, metric_finals=FINALS):
    """A grid store whose ``ground_truth`` repeats ``fc`` exactly (coinciding lines),
    with ``test_accuracy`` and ``test_loss`` recorded every 2 of 6 rounds."""
    finals = dict(metric_finals)
    finals.update({(a, "ground_truth", s, b): v for (a, m, s, b), v in metric_finals.items() if m == "fc"})
    return write_csv(tmp_path / "results.csv", store_rows(finals, rounds=6))


# -- file names per metric ---------------------------------------------------------------------
def test_each_metric_gets_its_own_files(tmp_path):
    """Two metrics plotted into one directory: two sets of files, each named after its
    metric; the second leaves the first's files as they were."""
    store = grid_store(tmp_path)
    out = tmp_path / "plots"
    first = plotting.plot_results(store, out, "test_accuracy")
    before = {path.name: path.read_bytes() for path in first.files}
    second = plotting.plot_results(store, out, "test_loss")

    first_names = {path.name for path in first.files}
    second_names = {path.name for path in second.files}
    assert first_names == {f"{figure}-test_accuracy.{kind}" for figure in ("curves", "heatmap") for kind in ("png", "pdf")}
    assert second_names == {f"{figure}-test_loss.{kind}" for figure in ("curves", "heatmap") for kind in ("png", "pdf")}
    assert {path.name for path in out.iterdir()} == first_names | second_names
    assert {name: (out / name).read_bytes() for name in first_names} == before


# -- readable axis names -----------------------------------------------------------------------
@pytest.mark.parametrize("metric, percent, label", [
    ("test_accuracy", True, "Test accuracy (%)"),
    ("test_accuracy", False, "Test accuracy"),
    ("train_loss", False, "Train loss"),
    ("param_error", False, "Parameter error ||x_i - x*||²"),
    ("my_new_metric", False, "My new metric"),
])
def test_metric_labels_are_readable(metric, percent, label):
    assert plotting.metric_label(metric, percent) == label


def test_axes_carry_the_readable_names(tmp_path):
    view = plotting.metric_view(plotting.load_results(grid_store(tmp_path)), "test_accuracy")
    figure = plotting.curves_figure(view)
    labels = {axis.get_ylabel() for axis in figure.axes if axis.get_ylabel()}
    assert labels == {"Test accuracy (%)"}
    assert {axis.get_xlabel() for axis in figure.axes if axis.get_xlabel()} == {"Round"}
    assert all("test_accuracy" not in text.get_text() for text in figure.texts)  # the title too


# -- markers at evaluations, lines apart, a legend for every line -----------------------------
def test_curves_mark_every_evaluation_and_keep_coinciding_lines_apart(tmp_path):
    """fc and ground_truth hold the same numbers: their lines differ in dashes and
    markers, and every line has a marker at each recorded round (0, 2, 4, 6)."""
    view = plotting.metric_view(plotting.load_results(grid_store(tmp_path)), "test_accuracy")
    figure = plotting.curves_figure(view)
    for axis in figure.axes:
        lines = [line for line in axis.get_lines() if len(line.get_xdata())]
        assert len(lines) == 3  # fc, global, ground_truth
        assert len({style(line) for line in lines}) == 3
        assert len({(line.get_linestyle(), line.get_marker()) for line in lines}) == 3  # apart without colour too
        for line in lines:
            assert style(line)[2] is not None
            assert list(line.get_xdata()) == [0, 2, 4, 6]
    texts, _ = legend_entries(figure)
    assert {"FC", "Global", "GT (oracle clusters)"} <= texts  # the ids by their readable names


def test_every_line_of_the_plot_figures_has_a_legend_entry(tmp_path):
    finals = {**FINALS, **{(a, m, s, 4): v / 2 for (a, m, s, _), v in FINALS.items()}}
    view = plotting.metric_view(plotting.load_results(grid_store(tmp_path, finals)), "test_accuracy")
    for figure in (plotting.curves_figure(view), plotting.fraction_figure(view)):
        assert_every_line_in_a_legend(figure)


def fig2_rows() -> list[dict]:
    rows = []
    for client in range(8):
        for round_index in range(0, 50, 10):
            for metric, value in (("ratio", 0.1 * (1 + client) * (1 + round_index)), ("gap", 1e4 / (1 + client))):
                rows.append({"seed": 0, "round": round_index, "client": client, "cluster": client // 2,
                             "method": "GT", "metric": metric, "value": value})
    return rows


def test_fig2_legend_explains_the_grey_and_black_lines():
    summary = {"A2": 40.0, "Delta2": 1250.0, "A2_supremum": 100.0}
    figure = fig2.plot(fig2_rows(), summary)
    assert_every_line_in_a_legend(figure)
    for axis in figure.axes:
        texts = [text.get_text() for text in axis.get_legend().get_texts()]
        assert any("client" in text and "cluster" not in text for text in texts)  # the grey lines
        assert any("cluster mean" in text for text in texts)  # the black lines


def test_fig7_legend_names_every_line():
    rows = [{"cluster_std": std, "method": "threshold_clustering", "seed": seed, "round": step,
             "metric": fig7.METRIC, "value": std * (1 + seed / 10) / (1 + step)}
            for std in (0.5, 1.0) for seed in (0, 1) for step in range(6)]
    per_std = {f"{std:g}": {"elbow": 2, "curve": [std / (1 + step) for step in range(6)]} for std in (0.5, 1.0)}
    figure = fig7.plot(rows, per_std)
    assert_every_line_in_a_legend(figure)


# -- tick labels -------------------------------------------------------------------------------
def scaling_result() -> CheckResult:
    """Thm 3.1's measured variables as the report gives them: beta = 1 / (2^k + 1),
    separations 2 * sqrt(2)^k, n = 16 ... 512."""
    values = {
        "n": [16.0 * 2**k for k in range(6)],
        "beta": [1.0 / (2 ** (7 - k) + 1) for k in range(5)],
        "separation_gaussian": [2.0 * 2 ** (k / 2) for k in range(9)],
    }
    rows = [{"variable": variable, "x": x, "repeat": repeat, "error": x ** -1 * (1 + repeat / 10)}
            for variable, xs in values.items() for x in xs for repeat in range(3)]
    law = PowerLaw(exponent=-1.0, low=-1.06, high=-0.979, prefactor=1.0)
    return CheckResult("thm3.1", "holds_with_constant", details={"rows": rows},
                       exponents={variable: (law, -1.0) for variable in values})


def scaling_figure(monkeypatch):
    """The figure that :func:`plot_scaling` writes, caught where it is saved."""
    caught = []
    monkeypatch.setattr(report_figures, "save_png", lambda figure, target, **options: caught.append(figure))
    assert report_figures.plot_scaling(scaling_result(), None)
    [figure] = caught
    FigureCanvasAgg(figure)  # plot_scaling closed it: a canvas of its own to draw on
    figure.canvas.draw()
    return figure


def test_theory_tick_labels_have_at_most_three_significant_digits(monkeypatch):
    figure = scaling_figure(monkeypatch)
    for axis in figure.axes:
        texts = [label.get_text() for label in axis.get_xticklabels() if label.get_visible() and label.get_text()]
        assert len(texts) >= 2, axis.get_title()
        for text in texts:
            assert significant_digits(text) <= 3, f"{axis.get_title()}: tick label {text!r}"
    beta = next(axis for axis in figure.axes if axis.get_xlabel() == "beta")
    assert "0.0303" in [label.get_text() for label in beta.get_xticklabels()]


def test_theory_tick_labels_do_not_overlap(monkeypatch):
    figure = scaling_figure(monkeypatch)
    renderer = figure.canvas.get_renderer()
    for axis in figure.axes:
        boxes = sorted((label.get_window_extent(renderer) for label in axis.get_xticklabels()
                        if label.get_visible() and label.get_text()), key=lambda box: box.x0)
        for left, right in zip(boxes, boxes[1:]):
            assert left.x1 < right.x0, f"{axis.get_title()}: tick labels overlap"
    assert_every_line_in_a_legend(figure)


def test_tick_text_rounds_to_three_significant_digits():
    assert [report_figures.tick_text(x) for x in (1 / 33, 1 / 17, 2 * 2**0.5, 512.0, 0.5)] == [
        "0.0303", "0.0588", "2.83", "512", "0.5"]


# -- Fig. 6 ------------------------------------------------------------------------------------
def evaluation_steps(config: dict) -> set[int]:
    """The steps a run evaluates at (robust_pfl.experiments.run_method): 0, every
    eval_every, the last."""
    rounds, every = config["rounds"], config["eval_every"]
    return {0, rounds, *range(every, rounds + 1, every)}


def raw_configs(monkeypatch, scale, quick, panels) -> dict[str, dict]:
    """The configs fig6 hands to expand_grid, by attack label (no data files needed)."""
    monkeypatch.setattr(fig6, "expand_grid", lambda config, source: config)
    return {config["grid"]["attack"][0]["label"]: config
            for config in fig6.grids(scale, "mnist-dir", quick, panels)}


@pytest.mark.parametrize("scale", [fig6.MNIST, fig6.DIGITS], ids=["mnist", "digits"])
@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
@pytest.mark.parametrize("panels", [fig6.PANELS, ("large_gradient",), ("bit_flip",)], ids=["both", "lg", "bf"])
def test_fig6_reference_is_evaluated_at_every_step_fc_is(monkeypatch, scale, quick, panels):
    """For each panel, a run without Byzantine clients (FC and Global) is evaluated at
    every step at which that panel's FC is: MNIST's 30-step large-gradient panel is
    evaluated every 3 steps, so a reference must be too, not at 0 and 30 only (the
    official epoch of the 3,000-step bit-flip panel)."""
    configs = raw_configs(monkeypatch, scale, quick, panels)
    references = {label: config for label, config in configs.items() if config["grid"]["attack"][0]["name"] == "none"}
    assert references
    for config in references.values():
        assert {method["label"] for method in config["methods"]} == {"FC", "Global"}
    for panel in panels:
        fc = evaluation_steps(configs[panel])
        covering = [label for label, config in references.items() if fc <= evaluation_steps(config)]
        assert covering, f"{panel}: FC at {sorted(fc)}, references at " + "; ".join(
            f"{label}: {sorted(evaluation_steps(config))}" for label, config in references.items())
        # and the figure and the claim read a covering one
        assert fig6.panel_reference(pd.DataFrame({"attack": list(configs)}), panel) in covering


def test_fig6_keeps_the_shared_reference_where_it_serves(monkeypatch):
    """The digits' panels are evaluated every 30 steps: one reference serves both (no
    new cells for an existing store); MNIST's large-gradient panel gets its own."""
    assert [label for label in raw_configs(monkeypatch, fig6.DIGITS, True, fig6.PANELS) if fig6.is_reference(label)] \
        == ["reference"]
    assert sorted(label for label in raw_configs(monkeypatch, fig6.MNIST, True, fig6.PANELS)
                  if fig6.is_reference(label)) == ["reference", "reference (large_gradient)"]


def fig6_frame() -> pd.DataFrame:
    """MNIST-like: large gradient every 3 of 30 steps, bit flip every 30 of 90; the
    shared reference every 30 of 90, the large-gradient one every 3 of 30."""
    rows = []

    def add(attack, placement, method, rounds, every, level, n_byzantine):
        for step in sorted({0, rounds, *range(every, rounds + 1, every)}):
            rows.append({"attack": attack, "byzantine": placement, "method": method, "metric": "test_accuracy",
                         "round": step, "value": level * step / rounds, "n_byzantine": n_byzantine,
                         "final": step == rounds, "status": "ok"})

    for method, level in (("FC", 0.9), ("Global", 0.2), ("Global+median", 0.15), ("Global+krum", 0.1)):
        for placement, count in (("official", 50), ("paper_text", 200)):
            add("large_gradient", placement, method, 30, 3, level, count)
            add("bit_flip", placement, method, 90, 30, level, count)
    for method, level in (("FC", 0.95), ("Global", 0.25)):
        add("reference", np.nan, method, 90, 30, level, 0)
        add("reference (large_gradient)", np.nan, method, 30, 3, level, 0)
    return pd.DataFrame(rows)


def test_fig6_is_small_multiples_with_fc_and_its_reference_emphasised():
    frame = fig6_frame()
    figure = fig6.plot(frame, "test data")
    axes = [axis for axis in figure.axes if axis.get_lines()]
    assert len(axes) == 4  # two placements x two attacks
    titles = [axis.get_title() for axis in axes]
    for attack in ("large gradient", "bit flip"):
        for placement in ("official", "paper text"):
            assert sum(attack in title and placement in title for title in titles) == 1
    assert_every_line_in_a_legend(figure)
    [legend] = figure.legends
    texts = [text.get_text() for text in legend.get_texts()]
    assert texts == ["FC", "FC, no Byzantine clients", "Global", "Global, no Byzantine clients",
                     "Global+median", "Global+krum"]  # one entry per line kind, not per (line, placement)
    for axis in axes:
        lines = {line.get_label(): line for line in axis.get_lines()}
        assert set(lines) == set(texts)
        widest = max(line.get_linewidth() for label, line in lines.items() if label.startswith("Global+"))
        assert lines["FC"].get_linewidth() > widest and lines["FC, no Byzantine clients"].get_linewidth() > widest
        assert all(style(line)[2] is not None for line in lines.values())  # a marker at each evaluation
        # the reference is drawn at FC's evaluation steps
        assert list(lines["FC, no Byzantine clients"].get_xdata()) == list(lines["FC"].get_xdata())


def test_fig6_claim_reads_the_panels_reference():
    """At step 30 the large-gradient reference reads 95% (its last step) where the
    shared one reads 31.7% (a third of its 90 steps): the claim compares FC with its
    panel's reference."""
    frame = fig6_frame()
    assert fig6.panel_reference(frame, "large_gradient") == "reference (large_gradient)"
    assert fig6.panel_reference(frame, "bit_flip") == "reference"
    claims = {claim["attack"]: claim for claim in fig6.checks(frame, fig6.finals(frame))}
    assert set(claims) == {"large_gradient", "bit_flip"}  # the references are no panel of their own
    assert claims["large_gradient"]["fc_without_attack"] == pytest.approx(95.0)
    assert claims["bit_flip"]["fc_without_attack"] == pytest.approx(95.0)
