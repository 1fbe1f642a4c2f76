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

from robust_pfl.results import save_png
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


def plot_scaling(result: CheckResult, target: Path) -> bool:
    """Write ``target`` (PNG, atomically) with a log-log panel per variable: the
    repeats, their mean, the fitted power law and the claimed slope.  Returns whether
    a figure was written (``False`` when the result has no usable rows)."""
    rows = [row for row in scaling_rows(result) if _positive(row["x"]) and _positive(row["error"])]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns
    from matplotlib.ticker import NullFormatter

    frame = pd.DataFrame(rows)[["variable", "x", "repeat", "error"]]
    frame["x"] = frame["x"].astype(float)
    frame["error"] = frame["error"].astype(float)
    variables = list(dict.fromkeys(frame["variable"]))
    figure, axes = plt.subplots(1, len(variables), figsize=(4.2 * len(variables), 3.6), squeeze=False)
    for axis, variable in zip(axes[0], variables):
        part = frame[frame["variable"] == variable]
        sns.scatterplot(data=part, x="x", y="error", color="0.6", alpha=0.5, s=14, ax=axis, label="repeats")
        means = part.groupby("x", as_index=False)["error"].mean()
        sns.lineplot(data=means, x="x", y="error", marker="o", color="C0", ax=axis, label="mean")
        if variable in result.exponents:
            law, claimed = result.exponents[variable]
            xs = means["x"].to_numpy()
            fitted, claimed_line = anchored_lines(law, claimed, xs)
            axis.plot(xs, fitted, color="C1", label=f"fit: slope {law.exponent:.3g} [{law.low:.3g}, {law.high:.3g}]")
            axis.plot(xs, claimed_line, color="C3", linestyle="--", label=f"claimed slope {claimed:g}")
        axis.set(xscale="log", yscale="log", xlabel=variable, ylabel="error", title=f"{result.statement}: {variable}")
        measured = means["x"].to_numpy()
        axis.set_xticks(measured, [f"{x:g}" for x in measured])  # the measured values, unclipped labels
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.legend(fontsize="small")
    figure.tight_layout()
    save_png(figure, target)
    plt.close(figure)
    return True


def _positive(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number > 0
