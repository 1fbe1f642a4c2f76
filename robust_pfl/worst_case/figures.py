"""A benchmark's figures (matplotlib and seaborn), written at :data:`DPI` as PNG and as
PDF: per defense, a heatmap of the worst-case test accuracy (Byzantine fraction x
heterogeneity) with the worst attack and the decision in each cell; the best defense
per cell; and the worst case against the fraction, one small panel per defense with a
line per level.  Cells of a defense that gets no verdict are hatched; an inconclusive
cell is marked ``?``."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from robust_pfl.worst_case.analysis import BREAKS, HOLDS, NOT_CONVERGED, OPEN, REFERENCE, UNDECIDED, VACUOUS

FIGURES = {
    "worst-case heatmaps": "worst_case_heatmaps.png",
    "best defense per cell": "best_defense.png",
    "worst case against the fraction": "worst_case_lines.png",
}
DPI = 300
CMAP = "viridis"
#: The decision's mark in a heatmap cell.
MARKS = {HOLDS: "holds", BREAKS: "breaks", UNDECIDED: "?"}
NO_VERDICT = {REFERENCE: "reference", NOT_CONVERGED: "not converged", VACUOUS: "vacuous"}
SHORT_ATTACKS = {"clipped_clustering_attack": "clipped_cl.", "signguard_attack": "signguard",
                 "fang_trimmed_mean": "fang_tm", "neighbour_poison": "neighbour", "large_gradient": "large_grad",
                 "gaussian_noise": "gauss_noise", "model_replacement": "model_repl"}


def pdf_writer(figure: Any) -> Callable[[Any], None]:
    """A figure saved as PDF (vector; nothing clipped)."""
    return lambda path: figure.savefig(path, format="pdf", bbox_inches="tight")


def png_writer(figure: Any) -> Callable[[Any], None]:
    """A figure saved as PNG at :data:`DPI` (nothing clipped)."""
    return lambda path: figure.savefig(path, format="png", dpi=DPI, bbox_inches="tight")


def _title(figure: Any, text: str, fontsize: float = 8) -> None:
    """A figure title wrapped to the figure's width (never wider than the figure)."""
    import textwrap

    width = max(20, int(figure.get_figwidth() * 110 / fontsize))
    figure.suptitle("\n".join(textwrap.wrap(text, width)), fontsize=fontsize)


def _text(value: str) -> str:
    """A label drawn as text: matplotlib's mathtext ``$`` escaped."""
    return str(value).replace("$", r"\$")


def _columns(fractions: Sequence[float]) -> list[str]:
    return [f"{f:g}" for f in fractions]


def heatmaps_figure(table: pd.DataFrame, defenses: Sequence[str], levels: Sequence[str],
                    fractions: Sequence[float]) -> Any:
    """One heatmap per defense, y: heterogeneity, x: Byzantine fraction; a cell shows
    the worst-case test accuracy (%), the worst attack and the decision (``?``:
    inconclusive); a defense without verdict is hatched and says why in its title; one
    colour scale (0-100) with its colour bar for all."""
    import matplotlib.pyplot as plt

    columns = min(4, len(defenses))
    rows = math.ceil(len(defenses) / columns)
    width, height = 1.0 + 1.05 * len(fractions), 0.9 + 0.62 * len(levels)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns + 1.2, height * rows + 0.9), squeeze=False,
                                sharex=True, sharey=True, layout="constrained")
    image = None
    for ax, defense in zip(axes.ravel(), defenses):
        mine = table[table["method"] == defense]
        values = np.full((len(levels), len(fractions)), np.nan)
        for row in mine.itertuples():
            if row.heterogeneity in levels and row.fraction in fractions:
                values[levels.index(row.heterogeneity), list(fractions).index(row.fraction)] = 100 * row.worst
        image = ax.imshow(values, vmin=0, vmax=100, cmap=CMAP, aspect="auto")
        statuses = {str(s) for s in mine["status"].dropna()}
        without = sorted(NO_VERDICT[s] for s in statuses if s in NO_VERDICT)
        for row in mine.itertuples():
            if row.heterogeneity not in levels or row.fraction not in fractions or not math.isfinite(row.worst):
                continue
            y, x = levels.index(row.heterogeneity), list(fractions).index(row.fraction)
            lines = [f"{100 * row.worst:.0f}"]
            if row.fraction > 0:
                lines.append(_text(SHORT_ATTACKS.get(row.worst_attack, row.worst_attack)))
                if row.status == OPEN and row.decision in MARKS:
                    lines.append(MARKS[row.decision])
            colour = "white" if row.worst < 0.55 else "black"
            if row.status in NO_VERDICT:
                ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, hatch="//",
                                           edgecolor=(1, 1, 1, 0.3), linewidth=0))
            ax.text(x, y, "\n".join(lines), ha="center", va="center", fontsize=6.5, color=colour, linespacing=1.1,
                    fontweight="bold" if row.status == OPEN and row.decision == BREAKS else "normal")
        title = _text(defense) + (f"\n({', '.join(without)}: no verdict)" if without else "")
        ax.set_title(title, fontsize=8)
        ax.set_xticks(range(len(fractions)), _columns(fractions), fontsize=7)
        ax.set_yticks(range(len(levels)), [_text(level) for level in levels], fontsize=7)
    for index, ax in enumerate(axes.ravel()):
        below = index + columns
        if below >= len(defenses):  # the lowest visible panel of its column: its fractions shown
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("Byzantine fraction", fontsize=7)
    for ax in axes.ravel()[len(defenses):]:
        ax.set_visible(False)
    if image is not None:
        bar = figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, pad=0.01)
        bar.set_label("worst-case test accuracy (%)", fontsize=8)
    _title(figure, "Worst-case test accuracy (%) over the attacks; cell: accuracy, worst attack, decision "
                   "(?: inconclusive); hatched: no verdict; blank: not run")
    return figure


def best_figure(best: pd.DataFrame, levels: Sequence[str], fractions: Sequence[float]) -> Any:
    """Heatmap of the best defense's worst-case accuracy per cell, annotated with the
    defense's name (``*``: its interval lies above the runner-up's)."""
    import matplotlib.pyplot as plt

    values = np.full((len(levels), len(fractions)), np.nan)
    figure, ax = plt.subplots(figsize=(1.8 + 1.7 * len(fractions), 1.3 + 0.75 * len(levels)), layout="constrained")
    names = {}
    for row in best.itertuples():
        if row.best is None or row.heterogeneity not in levels or row.fraction not in fractions:
            continue
        y, x = levels.index(row.heterogeneity), list(fractions).index(row.fraction)
        values[y, x] = 100 * row.worst
        names[(y, x)] = (f"{_text(row.best)}{'*' if row.separated else ''}\n{100 * row.worst:.0f}"
                         + (f"\n({NO_VERDICT[row.status]})" if row.status in NO_VERDICT else ""))
    image = ax.imshow(values, vmin=0, vmax=100, cmap=CMAP, aspect="auto")
    for (y, x), text in names.items():
        ax.text(x, y, text, ha="center", va="center", fontsize=7, color="white" if values[y, x] < 55 else "black")
    ax.set_xticks(range(len(fractions)), _columns(fractions))
    ax.set_yticks(range(len(levels)), [_text(level) for level in levels])
    ax.set(xlabel="Byzantine fraction")
    _title(figure, "Best defense per cell (worst-case accuracy, %; *: its interval above the runner-up's)", 9)
    bar = figure.colorbar(image, ax=ax)
    bar.set_label("worst-case test accuracy (%)")
    return figure


def lines_figure(table: pd.DataFrame, defenses: Sequence[str], levels: Sequence[str],
                 fractions: Sequence[float] | None = None) -> Any:
    """Worst-case test accuracy against the Byzantine fraction: one small panel per
    defense (shared axes), a line per level with its interval as a band; open markers
    where the cell is inconclusive, a dashed line for a level without verdict."""
    import matplotlib.pyplot as plt

    columns = min(4, len(defenses))
    rows = math.ceil(len(defenses) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(2.6 * columns, 2.1 * rows + 0.6), squeeze=False,
                                sharex=True, sharey=True, layout="constrained")
    colours = plt.get_cmap("tab10")
    for ax, defense in zip(axes.ravel(), defenses):
        for index, level in enumerate(levels):
            mine = table[(table["method"] == defense) & (table["heterogeneity"] == level)].sort_values("fraction")
            if mine.empty:
                continue
            colour = colours(index % 10)
            style = "--" if str(mine["status"].iloc[0]) in NO_VERDICT else "-"
            ax.plot(mine["fraction"], 100 * mine["worst"], style, color=colour, linewidth=1.2,
                    label=_text(level))
            low = mine["low"].where(mine["low"].notna(), mine["worst"])
            high = mine["high"].where(mine["high"].notna(), mine["worst"])
            ax.fill_between(mine["fraction"], 100 * low, 100 * high, color=colour, alpha=0.15, linewidth=0)
            open_ = mine["decision"] == UNDECIDED
            ax.plot(mine["fraction"][~open_], 100 * mine["worst"][~open_], "o", color=colour, markersize=3)
            ax.plot(mine["fraction"][open_], 100 * mine["worst"][open_], "o", markerfacecolor="white",
                    color=colour, markersize=3.5)
        ax.set_title(_text(defense), fontsize=8)
        ax.set(ylim=(0, 100))
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(defenses):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("worst-case accuracy (%)", fontsize=7)
    for index, ax in enumerate(axes.ravel()):
        if index + columns >= len(defenses):
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("Byzantine fraction", fontsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=max(1, len(levels)), fontsize=7)
    _title(figure, "Worst case against the fraction (band: interval; open marker: inconclusive; dashed: no "
                   "verdict)")
    return figure
