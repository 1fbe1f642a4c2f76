"""A benchmark's tables (Markdown, LaTeX, CSV) and its results page."""

from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd

from robust_pfl.summaries import render_cells
from robust_pfl.worst_case.allocation import Rule
from robust_pfl.worst_case.analysis import (
    BREAKS, HOLDS, NOT_CONVERGED, OPEN, REFERENCE, UNDECIDED, VACUOUS, interval_text)

FORMATS = ("md", "latex", "csv")
#: How a cell's decision and a defense's status are marked in the tables.
DECISION_MARK = {HOLDS: "holds", BREAKS: "breaks", UNDECIDED: "inconclusive"}
STATUS_MARK = {REFERENCE: "reference: no verdict", NOT_CONVERGED: "not converged: no verdict",
               VACUOUS: "vacuous: no verdict"}


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


def _status_of(table: pd.DataFrame, defense: str, level: str) -> str:
    mine = table[(table["method"] == defense) & (table["heterogeneity"] == level)]
    return str(mine["status"].iloc[0]) if len(mine) else ""


def worst_case_cells(table: pd.DataFrame, level: str, fractions: Sequence[float], defenses: Sequence[str],
                     not_applicable: pd.DataFrame) -> tuple[list[str], list[list[str]], list[str]]:
    """The worst-case table of one heterogeneity level: a row per defense (marked when
    it gets no verdict), a column per fraction (fraction 0: the clean accuracy), each
    cell ``mean [interval] worst attack, decision``; ``n/a`` where no attack could
    run."""
    header = ["defense", *(f"f = {fraction_text(f)}" for f in fractions), "worst cluster (max f)"]
    rows = []
    rows_of = table[table["heterogeneity"] == level]
    for defense in defenses:
        mine = rows_of[rows_of["method"] == defense]
        status = _status_of(table, defense, level)
        cells = [defense + (f" ({STATUS_MARK[status]})" if status in STATUS_MARK else "")]
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
            if fraction > 0:
                mark = DECISION_MARK.get(row["decision"], "") if status == OPEN else ""
                text += f" {row['worst_attack']}" + (f", {mark}" if mark else "")
            cells.append(text)
        last = mine.sort_values("fraction").iloc[-1] if len(mine) else None
        cells.append("–" if last is None else f"{percent(last['worst_cluster'])} (f = {fraction_text(last['fraction'])})")
        rows.append(cells)
    return header, rows, ["l", *("r" * (len(header) - 1))]


def render_worst_case(table: pd.DataFrame, fractions: Sequence[float], levels: Sequence[str],
                      defenses: Sequence[str], not_applicable: pd.DataFrame, rule: Rule | None = None,
                      fmt: str = "md") -> str:
    """Every level's worst-case table in ``fmt`` (``csv``: the frame itself)."""
    if fmt == "csv":
        return table.to_csv(index=False)
    parts = []
    interval = interval_text(rule) if rule is not None else "interval over seeds"
    for level in levels:
        header, rows, align = worst_case_cells(table, level, fractions, defenses, not_applicable)
        notes = [f"heterogeneity: {level}; test accuracy (%) under the worst attack, {interval}; f = 0: clean "
                 "accuracy; holds / breaks / inconclusive: the cell's decision (the drop from clean, paired by seed, "
                 "against the tolerance); n/a: no attack could run (see the not-applicable list)"]
        if fmt == "md":
            parts.append(f"**{level}**\n\n" + render_cells(header, rows, align, notes, fmt))
        else:
            parts.append(render_cells(header, rows, align, notes, fmt))
    return "\n".join(parts)


def breakdown_cells(breakdown: pd.DataFrame) -> tuple[list[str], list[list[str]], list[str]]:
    header = ["defense", "heterogeneity", "verdict", "clean (%)", "tolerance (points)", "climb, last quarter",
              "why"]
    rows = [[row.method, row.heterogeneity, row.verdict, percent(row.clean), percent(row.tolerance),
             percent(row.climb), row.why or "–"] for row in breakdown.itertuples()]
    return header, rows, ["l", "l", "l", "r", "r", "r", "l"]


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
            if row.empty or row.iloc[0]["best"] is None:
                cells.append("–")
                continue
            row = row.iloc[0]
            notes = ["separated" if row["separated"] else f"not separated from {row['runner_up']}"]
            if row["status"] in STATUS_MARK:
                notes.append(row["status"])
            cells.append(f"{row['best']} ({percent(row['worst'])}; {'; '.join(notes)})")
        rows.append(cells)
    return header, rows, ["l", *("l" * len(fractions))]


def statements(breakdown: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """One sentence per defense and level, restating its verdict from the numbers."""
    out = []
    for row in breakdown.itertuples():
        mine = table[(table["method"] == row.method) & (table["heterogeneity"] == row.heterogeneity)]
        where = f"**{row.method}** ({row.heterogeneity})"
        if row.status in STATUS_MARK:
            out.append(f"{where}: {row.verdict} (clean {percent(row.clean)}%).")
            continue
        text = f"{where}: {row.verdict}"
        if math.isfinite(row.breaks_at):
            broke = mine[mine["fraction"] == row.breaks_at]
            text += (f": worst case {percent(broke.iloc[0]['worst'])}% under {broke.iloc[0]['worst_attack']} "
                     f"against {percent(row.clean)}% clean" if len(broke) else f" ({row.why})")
        elif math.isfinite(row.inconclusive_at):
            text += f" ({row.why}; {percent(row.clean)}% clean)"
        else:
            at = mine[mine["fraction"] == row.holds_up_to]
            text += (f": worst case there {percent(at.iloc[0]['worst'])}% against {percent(row.clean)}% clean"
                     if len(at) else "")
        out.append(text + f"; tolerance {percent(row.tolerance)} points.")
    return out


def share_decided(breakdown: pd.DataFrame) -> tuple[int, int, int]:
    """``(decided, inconclusive, without verdict)`` counts of (defense, level) rows."""
    decided = int(breakdown["decided"].sum())
    undecided = int((breakdown["status"] == "inconclusive").sum())
    return decided, undecided, len(breakdown) - decided - undecided


def page(result: Any, figures: dict[str, str]) -> str:
    """The results page of a finished benchmark (``result``: a
    :class:`~robust_pfl.worst_case.runner.BenchmarkResult`), ``figures`` the relative
    paths of its figures."""
    spec, summary, rule = result.spec, result.summary, result.rule
    table, levels = result.table, [level["label"] for level in spec.benchmark.heterogeneity]
    fractions, defenses = spec.benchmark.fractions, [d.display for d in spec.defenses]
    prov = summary["provenance"]
    decided, undecided, none = share_decided(result.breakdown)
    rounds = sorted({spec.rounds_of(d) for d in spec.defenses})
    lines = [
        f"# Worst-case benchmark: {summary['name']}",
        "",
        f"*Produced by `{summary['command']}` at commit `{(prov.get('git_commit') or 'unknown')[:7]}`"
        f"{' with uncommitted changes' if summary.get('dirty') else ''} on "
        f"{prov.get('machine', 'this machine')} ({prov.get('torch', '')}, {summary['device']}); "
        f"{summary['cells']} runs ({summary['ran']} run now in {summary['stages']} stages, {summary['skipped']} "
        f"finished before, {summary['errors']} errored) of the {summary['full_factorial']} of the full factorial; "
        f"{summary['not_applicable']} combinations not applicable; wall time of this call {summary['seconds']:.0f} s.*",
        "",
        "## What ran",
        "",
        f"- Profile: {summary['profile']}.",
        f"- Defenses (rounds): {', '.join(f'{d.display} ({spec.rounds_of(d)})' for d in spec.defenses)}.",
        f"- Attacks ({len(summary['attacks'])}): {', '.join(summary['attacks']) or 'none'}; backdoors "
        f"({len(summary['backdoors'])}): {', '.join(summary['backdoors']) or 'none'}.",
        f"- Byzantine fractions (of all clients): {', '.join(fraction_text(f) for f in fractions)}; "
        f"heterogeneity levels: {', '.join(levels)}; seed pool {spec.seeds} ({rule.first} to start); rounds "
        f"{', '.join(map(str, rounds))}.",
        f"- Tuning: {summary['tuning']}.",
        f"- Allocation: attacks {'and candidates raced' if rule.racing else 'not raced (full factorial)'}; seeds "
        "added to open verdicts (docs/benchmark.md, \"How runs are allocated\").",
        f"- Verdicts: tolerance {spec.benchmark.tolerance.text()}; {interval_text(rule)}; a clean run still "
        f"climbing more than {spec.benchmark.plateau:g} points over its last quarter gets no verdict.",
        f"- Cost: {summary['per_cell']} Estimated before the run: {summary['estimate']}.",
        "",
        "## What it shows",
        "",
        f"Of the {len(result.breakdown)} (defense, level) pairs, {decided} have a decided verdict, {undecided} are "
        f"inconclusive and {none} get no verdict (reference, not converged or vacuous).",
        "",
        *(f"- {sentence}" for sentence in statements(result.breakdown, table)),
        "",
        "## Worst-case test accuracy",
        "",
        render_worst_case(table, fractions, levels, defenses, result.not_applicable, rule, "md"),
    ]
    for name, path in figures.items():
        lines += [f"![{name}]({path})", ""]
    header, rows, align = breakdown_cells(result.breakdown)
    lines += ["## Verdicts", "", render_cells(header, rows, align,
              [f"holds up to f: the drop's interval at or below the tolerance at every fraction up to f; breaks at "
               "f: its interval above the tolerance at f (or the defense cannot run there), every fraction below "
               "holding; inconclusive at f: the first fraction whose interval crosses the tolerance"], "md")]
    header, rows, align = best_cells(result.best, fractions, levels)
    lines += ["## Best defense per cell", "", render_cells(header, rows, align,
              ["the defense of highest worst-case mean (its accuracy, %); separated: its interval lies above the "
               "runner-up's"], "md")]
    if len(result.backdoors):
        header, rows, align = backdoor_cells(result.backdoors)
        lines += ["## Backdoors", "", render_cells(header, rows, align,
                  ["attack success rate (%): honest clients' triggered non-target test images classified as the "
                   f"target; the highest over the backdoors at the chosen setting, {interval_text(rule)}"], "md")]
    extra = summary.get("theorem")
    if extra:
        lines += ["## Breaks read against the threshold-clustering theorem", "", extra, ""]
    if len(result.not_applicable):
        counts = (result.not_applicable.groupby(["method", "attack"], sort=False)["reason"].first().reset_index())
        lines += ["## Not applicable", "", "Combinations whose config fails validation; never run:", ""]
        lines += [f"- {row.method} × {row.attack}: {row.reason}" for row in counts.itertuples()]
        lines.append("")
    return "\n".join(lines) + "\n"
