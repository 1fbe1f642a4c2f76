"""A benchmark's figures: per defense, a heatmap of the worst-case test accuracy
(Byzantine fraction x heterogeneity); the best defense per cell; the worst case
against the fraction, one line per defense (seaborn and matplotlib)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

FIGURES = {
    "worst-case heatmaps": "worst_case_heatmaps.png",
    "best defense per cell": "best_defense.png",
    "worst case against the fraction": "worst_case_lines.png",
}


def _grid_of(table: pd.DataFrame, levels: Sequence[str], fractions: Sequence[float]) -> pd.DataFrame:
    """``levels x fractions`` of ``table``'s ``worst`` (percent), nan where missing."""
    frame = pd.DataFrame(np.nan, index=list(levels), columns=[f"{f:g}" for f in fractions])
    for row in table.itertuples():
        frame.loc[row.heterogeneity, f"{row.fraction:g}"] = 100 * row.worst
    return frame


def heatmaps_figure(table: pd.DataFrame, defenses: Sequence[str], levels: Sequence[str],
                    fractions: Sequence[float]) -> Any:
    """One annotated heatmap per defense, y: heterogeneity, x: Byzantine fraction,
    cell: worst-case test accuracy (%), one colour scale (0-100) for all."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    columns = min(4, len(defenses))
    rows = math.ceil(len(defenses) / columns)
    width, height = 1.2 + 0.9 * len(fractions), 1.0 + 0.5 * len(levels)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows + 0.6), squeeze=False)
    for ax, defense in zip(axes.ravel(), defenses):
        grid = _grid_of(table[table["method"] == defense], levels, fractions)
        sns.heatmap(grid, ax=ax, vmin=0, vmax=100, cmap="viridis", annot=True, fmt=".0f", cbar=False,
                    linewidths=0.5, linecolor="white", annot_kws={"fontsize": "small"})
        ax.set(title=defense, xlabel="Byzantine fraction", ylabel="")
        ax.tick_params(axis="y", rotation=0)
    for ax in axes.ravel()[len(defenses):]:
        ax.set_visible(False)
    figure.suptitle("Worst-case test accuracy (%) over the attack set; blank: not run", fontsize="medium")
    figure.tight_layout()
    return figure


def best_figure(best: pd.DataFrame, levels: Sequence[str], fractions: Sequence[float]) -> Any:
    """Heatmap of the best defense's worst-case accuracy per cell, annotated with the
    defense's name."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    values = pd.DataFrame(np.nan, index=list(levels), columns=[f"{f:g}" for f in fractions])
    names = pd.DataFrame("", index=list(levels), columns=[f"{f:g}" for f in fractions])
    for row in best.itertuples():
        if row.best is not None:
            values.loc[row.heterogeneity, f"{row.fraction:g}"] = 100 * row.worst
            names.loc[row.heterogeneity, f"{row.fraction:g}"] = f"{row.best}\n{100 * row.worst:.0f}"
    figure, ax = plt.subplots(figsize=(1.6 + 1.5 * len(fractions), 1.2 + 0.7 * len(levels)))
    sns.heatmap(values, ax=ax, vmin=0, vmax=100, cmap="viridis", annot=names, fmt="", linewidths=0.5,
                linecolor="white", cbar_kws={"label": "worst-case test accuracy (%)"}, annot_kws={"fontsize": "small"})
    ax.set(xlabel="Byzantine fraction", ylabel="", title="Best defense per cell (its worst-case accuracy, %)")
    ax.tick_params(axis="y", rotation=0)
    figure.tight_layout()
    return figure


def lines_figure(table: pd.DataFrame, defenses: Sequence[str], levels: Sequence[str]) -> Any:
    """Worst-case test accuracy against the Byzantine fraction, one line per defense,
    one panel per heterogeneity level, with each point's interval as an error bar."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(levels), figsize=(5.2 * len(levels), 4.2), squeeze=False, sharey=True)
    colours = plt.get_cmap("tab20")
    for ax, level in zip(axes[0], levels):
        mine = table[table["heterogeneity"] == level]
        for index, defense in enumerate(defenses):
            rows = mine[mine["method"] == defense].sort_values("fraction")
            if rows.empty:
                continue
            low = (rows["worst"] - rows["low"]).where(rows["low"].notna(), 0.0)
            high = (rows["high"] - rows["worst"]).where(rows["high"].notna(), 0.0)
            ax.errorbar(rows["fraction"], 100 * rows["worst"], yerr=[100 * low, 100 * high], marker="o",
                        markersize=3, linewidth=1.2, capsize=2, label=defense, color=colours(index % 20))
        ax.set(title=level, xlabel="Byzantine fraction", ylim=(0, 100))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("worst-case test accuracy (%)")
    axes[0][-1].legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    figure.tight_layout()
    return figure
