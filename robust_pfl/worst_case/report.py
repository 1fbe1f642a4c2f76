"""A benchmark's tables (Markdown, LaTeX, CSV) and its results page."""

from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd

from robust_pfl.summaries import render_cells
from robust_pfl.worst_case.analysis import INTERVAL

FORMATS = ("md", "latex", "csv")


def percent(value: float) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:.1f}"


def with_interval(mean: float, low: float, high: float) -> str:
    """``74.2 [70.1, 78.3]`` (percent), the interval left out where there is none."""
    if not math.isfinite(mean):
        return "–"
    if not (math.isfinite(low) and math.isfinite(high)):
        return percent(mean)
    return f"{percent(mean)} [{percent(low)}, {percent(high)}]"


def fraction_text(fraction: float) -> str:
    return f"{fraction:g}"


def worst_case_cells(table: pd.DataFrame, level: str, fractions: Sequence[float], defenses: Sequence[str],
                     not_applicable: pd.DataFrame) -> tuple[list[str], list[list[str]], list[str]]:
    """The worst-case table of one heterogeneity level: a row per defense, a column per
    fraction (fraction 0: the clean accuracy), each cell ``mean [interval] (worst
    attack)``; ``n/a`` where no attack could run."""
    header = ["defense", *(f"f = {fraction_text(f)}" for f in fractions), "worst cluster (max f)"]
    rows = []
    rows_of = table[table["heterogeneity"] == level]
    for defense in defenses:
        mine = rows_of[rows_of["method"] == defense]
        cells = [defense]
        for fraction in fractions:
            row = mine[mine["fraction"] == fraction]
            if row.empty:
                skipped = not_applicable[(not_applicable["method"] == defense)
                                         & (not_applicable["heterogeneity"] == level)
                                         & (not_applicable["fraction"] == fraction)] if len(not_applicable) else []
                cells.append("n/a" if len(skipped) else "–")
                continue
            row = row.iloc[0]
            text = with_interval(row["worst"], row["low"], row["high"])
            cells.append(text if fraction == 0 else f"{text} ({row['worst_attack']})")
        last = mine.sort_values("fraction").iloc[-1] if len(mine) else None
        cells.append("–" if last is None else f"{percent(last['worst_cluster'])} (f = {fraction_text(last['fraction'])})")
        rows.append(cells)
    return header, rows, ["l", *("r" * (len(header) - 1))]


def render_worst_case(table: pd.DataFrame, fractions: Sequence[float], levels: Sequence[str],
                      defenses: Sequence[str], not_applicable: pd.DataFrame, fmt: str = "md") -> str:
    """Every level's worst-case table in ``fmt`` (``csv``: the frame itself)."""
    if fmt == "csv":
        return table.to_csv(index=False)
    parts = []
    for level in levels:
        header, rows, align = worst_case_cells(table, level, fractions, defenses, not_applicable)
        notes = [f"heterogeneity: {level}; test accuracy (%) under the worst attack, {INTERVAL}; "
                 "f = 0: clean accuracy; n/a: no attack could run (see the not-applicable list)"]
        if fmt == "md":
            parts.append(f"**{level}**\n\n" + render_cells(header, rows, align, notes, fmt))
        else:
            parts.append(render_cells(header, rows, align, notes, fmt))
    return "\n".join(parts)


def breakdown_cells(breakdown: pd.DataFrame) -> tuple[list[str], list[list[str]], list[str]]:
    header = ["defense", "heterogeneity", "holds up to f", "breaks at f", "why"]
    rows = [[row.method, row.heterogeneity,
             "none" if not math.isfinite(row.holds_up_to) else fraction_text(row.holds_up_to),
             "never (in the fractions run)" if not math.isfinite(row.breaks_at) else fraction_text(row.breaks_at),
             ("no verdict: clean accuracy near chance; " if row.vacuous else "") + (row.why or "–")]
            for row in breakdown.itertuples()]
    return header, rows, ["l", "l", "r", "r", "l"]


def backdoor_cells(backdoors: pd.DataFrame) -> tuple[list[str], list[list[str]], list[str]]:
    header = ["defense", "heterogeneity", "f", "highest success rate", "backdoor", "accuracy"]
    rows = [[row.method, row.heterogeneity, fraction_text(row.fraction),
             with_interval(row.success, row.success_low, row.success_high), row.backdoor, percent(row.accuracy)]
            for row in backdoors.itertuples()]
    return header, rows, ["l", "l", "r", "r", "l", "r"]


def best_cells(best: pd.DataFrame, fractions: Sequence[float], levels: Sequence[str]
               ) -> tuple[list[str], list[list[str]], list[str]]:
    header = ["heterogeneity", *(f"f = {fraction_text(f)}" for f in fractions)]
    rows = []
    for level in levels:
        mine = best[best["heterogeneity"] == level]
        cells = [level]
        for fraction in fractions:
            row = mine[mine["fraction"] == fraction]
            cells.append("–" if row.empty or row.iloc[0]["best"] is None
                         else f"{row.iloc[0]['best']} ({percent(row.iloc[0]['worst'])})")
        rows.append(cells)
    return header, rows, ["l", *("l" * len(fractions))]


def statements(breakdown: pd.DataFrame, table: pd.DataFrame, tolerance: float) -> list[str]:
    """One sentence per defense and level, restating its breakdown from the numbers."""
    out = []
    for row in breakdown.itertuples():
        mine = table[(table["method"] == row.method) & (table["heterogeneity"] == row.heterogeneity)]
        if not math.isfinite(row.holds_up_to):
            first = mine.sort_values("fraction")
            out.append(f"**{row.method}** ({row.heterogeneity}): does not hold at any fraction ({row.why} "
                       f"at f = {fraction_text(row.breaks_at)}"
                       + (f": {percent(first.iloc[-1]['worst'])}%" if len(first) else "") + ").")
            continue
        if row.vacuous:
            out.append(f"**{row.method}** ({row.heterogeneity}): no verdict: its clean accuracy "
                       f"({percent(mine['clean'].iloc[0])}%) is within {tolerance:g} points of chance, so staying "
                       "near it under attack says nothing.")
            continue
        at = mine[mine["fraction"] == row.holds_up_to]
        worst = percent(at.iloc[0]["worst"]) if len(at) else "–"
        if row.holds_up_to == 0 and math.isfinite(row.breaks_at):
            broke = mine[mine["fraction"] == row.breaks_at]
            out.append(f"**{row.method}** ({row.heterogeneity}): holds at no Byzantine fraction run: at "
                       f"f = {fraction_text(row.breaks_at)} its worst case is "
                       + (f"{percent(broke.iloc[0]['worst'])}% ({broke.iloc[0]['worst_attack']})"
                          if len(broke) else f"not run ({row.why})")
                       + f", against {percent(at.iloc[0]['clean']) if len(at) else '–'}% clean.")
            continue
        text = (f"**{row.method}** ({row.heterogeneity}): within {tolerance:g} points of its clean accuracy "
                f"({percent(at.iloc[0]['clean']) if len(at) else '–'}%) under every attack up to "
                f"f = {fraction_text(row.holds_up_to)} (worst case there {worst}%)")
        if math.isfinite(row.breaks_at):
            broke = mine[mine["fraction"] == row.breaks_at]
            text += (f"; breaks at f = {fraction_text(row.breaks_at)}"
                     + (f" ({percent(broke.iloc[0]['worst'])}% under {broke.iloc[0]['worst_attack']})"
                        if len(broke) else f" ({row.why})"))
        out.append(text + ".")
    return out


def page(result: Any, figures: dict[str, str]) -> str:
    """The results page of a finished benchmark (``result``: a
    :class:`~robust_pfl.worst_case.runner.BenchmarkResult`), ``figures`` the relative
    paths of its figures."""
    spec, summary = result.spec, result.summary
    table, levels = result.table, [level["label"] for level in spec.benchmark.heterogeneity]
    fractions, defenses = spec.benchmark.fractions, [d.display for d in spec.defenses]
    prov = summary["provenance"]
    lines = [
        f"# Worst-case benchmark: {summary['name']}",
        "",
        f"*Produced by `{summary['command']}` at commit `{prov.get('git_commit') or 'unknown'}` on "
        f"{prov.get('machine', 'this machine')} ({prov.get('torch', '')}, {summary['device']}); "
        f"{summary['cells']} cells ({summary['ran']} run now, {summary['skipped']} finished before, "
        f"{summary['errors']} errored), {summary['not_applicable']} combinations not applicable; "
        f"wall time of this call {summary['seconds']:.0f} s.*",
        "",
        "## What ran",
        "",
        f"- Profile: {summary['profile']}.",
        f"- Defenses: {', '.join(defenses)}.",
        f"- Attacks ({len(summary['attacks'])}): {', '.join(summary['attacks']) or 'none'}; backdoors "
        f"({len(summary['backdoors'])}): {', '.join(summary['backdoors']) or 'none'}.",
        f"- Byzantine fractions (of all clients): {', '.join(fraction_text(f) for f in fractions)}; "
        f"heterogeneity levels: {', '.join(levels)}; seeds: {spec.seeds}; {spec.base.get('rounds', 100)} rounds.",
        f"- Tuning: {summary['tuning']}.",
        f"- Cells: mean over seeds of the honest clients' final test accuracy; {INTERVAL}.",
        f"- Cost: {summary['per_cell']}",
        "",
        "## What it shows",
        "",
        *(f"- {sentence}" for sentence in statements(result.breakdown, table, spec.benchmark.tolerance)),
        "",
        "## Worst-case test accuracy",
        "",
        render_worst_case(table, fractions, levels, defenses, result.not_applicable, "md"),
    ]
    for name, path in figures.items():
        lines += [f"![{name}]({path})", ""]
    header, rows, align = breakdown_cells(result.breakdown)
    lines += ["## Breakdown", "", render_cells(header, rows, align,
              [f"holds: worst case within {spec.benchmark.tolerance:g} points of clean at every fraction up to "
               "this one; breaks: the first fraction where it is not (or the defense cannot run there)"], "md")]
    header, rows, align = best_cells(result.best, fractions, levels)
    lines += ["## Best defense per cell", "", render_cells(header, rows, align,
              ["the defense of highest worst-case accuracy (its accuracy, %)"], "md")]
    if len(result.backdoors):
        header, rows, align = backdoor_cells(result.backdoors)
        lines += ["## Backdoors", "", render_cells(header, rows, align,
                  ["attack success rate (%): honest clients' triggered non-target test images classified as the "
                   f"target; the highest over the backdoors, {INTERVAL}"], "md")]
    if len(result.not_applicable):
        counts = (result.not_applicable.groupby(["method", "attack"], sort=False)["reason"].first().reset_index())
        lines += ["## Not applicable", "", "Combinations whose config fails validation; never run:", ""]
        lines += [f"- {row.method} × {row.attack}: {row.reason}" for row in counts.itertuples()]
        lines.append("")
    return "\n".join(lines) + "\n"
