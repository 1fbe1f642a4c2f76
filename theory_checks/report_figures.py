"""Scaling figures of the theory report: measured error against one variable at a
time, log-log, with the fitted power law and the paper's claimed slope.

A check that measured a scaling law (e.g. Thm 3.1, eq. (14): the error against
``sigma``, ``Delta``, ``n_i``, ``beta_i``) keeps its measurements in
``result.details["rows"]`` as tidy rows ``{"variable", "x", "repeat", "error"}`` and
its fits in ``result.exponents[variable] = (PowerLaw, claimed exponent)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from robust_pfl.engine.results import save_png
from theory_checks.types import CheckResult, PowerLaw

ROW_KEYS = frozenset({"variable", "x", "repeat", "error"})


def scaling_rows(result: CheckResult) -> list[dict[str, Any]]:
    """The tidy rows of ``result`` (empty when it has none in that form)."""
    rows = result.details.get("rows")
    if not isinstance(rows, (list, tuple)) or not rows:
        return []
    if not all(isinstance(row, dict) and ROW_KEYS <= row.keys() for row in rows):
        return []
    return list(rows)


def anchored_lines(law: PowerLaw, claimed: float, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fitted law ``prefactor * x^exponent`` on ``xs``, and the line of slope
    ``claimed`` through the fitted law's value at the geometric mean of ``xs`` (the
    centre of the fit in log space), so the two differ only in slope."""
    xs = np.asarray(xs, dtype=float)
    fitted = law.prefactor * xs**law.exponent
    anchor_x = float(np.exp(np.log(xs).mean()))
    anchor_y = law.prefactor * anchor_x**law.exponent
    return fitted, anchor_y * (xs / anchor_x) ** claimed


def tick_text(value: float) -> str:
    """A tick label with at most 3 significant digits: ``0.0303`` for 0.030303...,
    ``2.83`` for 2.828..., ``512`` for 512, ``1.2e+04`` for 12000.4."""
    return f"{value:.3g}"


def thin_tick_labels(figure: Any, axis: Any, values: np.ndarray, gap_px: float = 4.0) -> int:
    """Tick marks at every measured ``values`` on ``axis``'s x axis, labelled by
    :func:`tick_text`; where neighbouring labels would overlap (closer than ``gap_px``),
    only every k-th value is labelled, k the smallest that separates them (the first
    value always labelled).  Returns k.

    The labels' extents are computed, not drawn: each is centred on its tick (the
    x axis's transform, scale included) and as wide as the renderer measures its text
    in the labels' font, so trying every k costs no redraw of the figure."""
    values = np.asarray(values, dtype=float)
    texts = [tick_text(float(value)) for value in values]
    axis.set_xticks(values, texts)
    if len(values) < 2:
        return 1
    renderer = figure.canvas.get_renderer()
    font = axis.get_xticklabels()[0].get_fontproperties()
    widths = np.array([renderer.get_text_width_height_descent(text, font, ismath=False)[0] for text in texts])
    height = axis.get_ylim()[0]  # any point of the axes: only the x pixel is read
    centres = axis.transData.transform(np.column_stack([values, np.full(len(values), height)]))[:, 0]
    for step in range(1, len(values) + 1):
        kept = np.arange(0, len(values), step)
        order = kept[np.argsort(centres[kept])]
        left, right = centres[order] - widths[order] / 2, centres[order] + widths[order] / 2
        if np.all(left[1:] - right[:-1] >= gap_px):
            axis.set_xticks(values, [text if index % step == 0 else "" for index, text in enumerate(texts)])
            return step
    return len(values)


def scaling_figure(result: CheckResult) -> Any | None:
    """The figure of :func:`plot_scaling` (``None`` when the result has no usable
    rows): a log-log panel per variable with the repeats, their mean, the fitted
    power law and the claimed slope; x ticks at the measured values, labelled with at
    most 3 significant digits and thinned where they would overlap; a legend below
    each panel naming every line."""
    rows = [row for row in scaling_rows(result) if _positive(row["x"]) and _positive(row["error"])]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    from matplotlib.ticker import NullFormatter

    frame = pd.DataFrame(rows)[["variable", "x", "repeat", "error"]]
    frame["x"] = frame["x"].astype(float)
    frame["error"] = frame["error"].astype(float)
    variables = list(dict.fromkeys(frame["variable"]))
    figure, axes = plt.subplots(1, len(variables), figsize=(4.2 * len(variables), 4.4), squeeze=False)
    for axis, variable in zip(axes[0], variables):
        part = frame[frame["variable"] == variable]
        axis.scatter(part["x"], part["error"], color="0.6", alpha=0.5, s=14, linewidths=0, label="repeats")
        means = part.groupby("x", as_index=False)["error"].mean()
        axis.plot(means["x"], means["error"], marker="o", color="C0", label="mean over repeats")
        if variable in result.exponents:
            law, claimed = result.exponents[variable]
            xs = means["x"].to_numpy()
            fitted, claimed_line = anchored_lines(law, claimed, xs)
            axis.plot(xs, fitted, color="C1", label=f"fit: slope {law.exponent:.3g} [{law.low:.3g}, {law.high:.3g}]")
            axis.plot(xs, claimed_line, color="C3", linestyle="--", label=f"claimed slope {claimed:.3g}")
        axis.set(xscale="log", yscale="log", xlabel=variable, ylabel="error")
        axis.set_title(f"{result.statement}: {variable}", fontsize=10)
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    figure.tight_layout()
    for axis, variable in zip(axes[0], variables):  # after the layout: the labels' final widths
        thin_tick_labels(figure, axis, np.sort(frame.loc[frame["variable"] == variable, "x"].unique()))
    return figure


def plot_scaling(result: CheckResult, target: Path) -> bool:
    """Write ``target`` (PNG, atomically) with :func:`scaling_figure`.  Returns whether
    a figure was written (``False`` when the result has no usable rows)."""
    figure = scaling_figure(result)
    if figure is None:
        return False
    import matplotlib.pyplot as plt

    try:
        save_png(figure, target, bbox_inches="tight")
    finally:
        plt.close(figure)
    return True


def _positive(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number > 0
