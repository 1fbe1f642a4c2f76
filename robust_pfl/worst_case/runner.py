"""``robust-pfl benchmark``: plan a benchmark's combinations, run the runs the
allocation asks for, stage after stage, into the grid store (resumable after a kill,
local pool or Ray, cells shared with other grids), then judge, and write the tables,
figures and page."""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from robust_pfl.backends import Backend, LocalBackend
from robust_pfl.costs import readable_duration
from robust_pfl.engine.results import close_figure, json_safe, write_files
from robust_pfl.grid import grid_results, run_grid
from robust_pfl.grid_file import GridCell, Resources
from robust_pfl.worst_case import analysis, cost, figures, report, theorem
from robust_pfl.worst_case.allocation import Allocation, Rule, Runs, allocate
from robust_pfl.worst_case.analysis import Judge
from robust_pfl.worst_case.plan import BACKDOOR, CLEAN, COLUMNS, DIAGNOSTIC, Plan, attack_set, build_plan
from robust_pfl.config import ConfigError, read_toml_file
from robust_pfl.provenance import git_dirty
from robust_pfl.worst_case.loading import parse_benchmark, profile_of
from robust_pfl.worst_case.spec import BenchmarkSpec

#: The final metrics a benchmark reads from each cell.
METRICS = ("test_accuracy", "validation_accuracy", "validation_loss", "worst_cluster_test_accuracy",
           "attack_success_rate", "nonfinite_models")
RECORD = "benchmark.json"


@dataclass
class BenchmarkResult:
    """A finished benchmark: its spec, plan and allocation, the finished runs'
    finals, the tables of :mod:`robust_pfl.worst_case.analysis`, the summary and the
    files written."""

    spec: BenchmarkSpec
    plan: Plan
    allocation: Allocation
    finals: pd.DataFrame
    chosen: pd.DataFrame
    table: pd.DataFrame
    breakdown: pd.DataFrame
    backdoors: pd.DataFrame
    best: pd.DataFrame
    not_applicable: pd.DataFrame
    rule: Rule
    summary: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    readings: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=theorem.COLUMNS))  # theorem.py


def finals_frame(out: Path, plan: Plan, cells: list[GridCell]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The finished ``cells`` of ``out``'s store: one row per cell (the plan's axes, a
    cell shared with another grid keeping this benchmark's labels; ``section``,
    ``n_byzantine``, ``cell_seconds`` and the final :data:`METRICS`), and the clean
    runs' validation-accuracy curves (axes, ``round``, ``value``)."""
    columns = ["cell", *COLUMNS, "section", "n_byzantine", "cell_seconds", *METRICS]
    curve_columns = [*COLUMNS, "round", "value"]
    if not cells or not (out / "results.csv").exists():
        return pd.DataFrame(columns=columns), pd.DataFrame(columns=curve_columns)
    rows = grid_results(out, plan.grid(cells))
    axes = pd.DataFrame([{"cell": c.cell, **c.axes, "section": plan.section(c.cell), "n_byzantine": c.n_byzantine}
                         for c in cells])
    final = rows[rows["final"].astype(str) == "True"]
    values = final.pivot_table(index="cell", columns="metric", values="value", aggfunc="first")
    frame = axes.merge(values.reset_index(), on="cell", how="inner")
    for metric in [*METRICS, "cell_seconds"]:
        frame[metric] = pd.to_numeric(frame[metric], errors="coerce") if metric in frame else float("nan")
    frame["fraction"] = frame["fraction"].astype(float)
    clean = axes[axes["section"] == CLEAN][["cell", *COLUMNS]]
    curves = rows[rows["metric"] == "validation_accuracy"][["cell", "round", "value"]]
    curves = clean.merge(curves, on="cell", how="inner")[curve_columns]
    curves = curves.assign(value=pd.to_numeric(curves["value"], errors="coerce"),
                           fraction=curves["fraction"].astype(float))
    return frame[columns], curves


def chance_accuracy(spec: BenchmarkSpec) -> float:
    """1 / the number of classes of the benchmark's data set."""
    from robust_pfl.engine.datasets import load_dataset

    task = spec.base.get("task", {})
    return 1.0 / load_dataset(task.get("dataset", "digits"), task.get("data_dir")).num_classes


def rule_of(spec: BenchmarkSpec) -> Rule:
    table = spec.benchmark
    return Rule(tuple(spec.seeds), table.initial_seeds, table.racing, table.confidence, table.candidate_attacks)


def judge_of(spec: BenchmarkSpec) -> Judge:
    table = spec.benchmark
    return Judge(table.tolerance, chance_accuracy(spec), table.plateau / 100, rule_of(spec),
                 frozenset(d.display for d in spec.defenses if d.name == "local"),
                 {d.display: spec.rounds_of(d) for d in spec.defenses})


def judged(spec: BenchmarkSpec, plan: Plan, runs: Runs) -> Allocation:
    """The allocation of ``plan`` given the finished ``runs``."""
    judge = judge_of(spec)
    return allocate(runs, plan, judge.rule, lambda states, done: analysis.wants_seed(done, states, judge))


def analyse(spec: BenchmarkSpec, plan: Plan, finals: pd.DataFrame, curves: pd.DataFrame) -> BenchmarkResult:
    """Allocate (the choices and sets the finished runs give), judge and tabulate."""
    runs = Runs.from_frames(finals, curves)
    allocation = judged(spec, plan, runs)
    judge = judge_of(spec)
    states = allocation.cells
    table = analysis.worst_case_table(runs, plan, states, judge)
    return BenchmarkResult(
        spec, plan, allocation, finals, analysis.tuning_table(plan, states), table,
        analysis.breakdown(runs, states, judge, spec.benchmark.fractions),
        analysis.backdoor_worst_case(runs, plan, states, judge.rule),
        analysis.best_defense(table),
        pd.DataFrame(plan.not_applicable, columns=[*COLUMNS[:-1], "section", "reason"]),
        judge.rule,
    )


def _profile(quick: bool, subset: str | None, tune: bool) -> str:
    name = "quick (a smoke run: few rounds, one seed)" if quick else (f"subset {subset!r}" if subset else "full")
    return name + ("" if tune else "; not tuned (the file's values)")


def write_report(result: BenchmarkResult, out: Path, page_path: Path | None = None) -> list[Path]:
    """Write the tables (``worst_case.csv``/``.md``/``.tex``, ``breakdown.csv``,
    ``backdoors.csv``, ``best_defense.csv``, ``tuning.csv``, ``not_applicable.csv``), the
    figures (PNG at 300 dpi and PDF), ``report.md`` and :data:`RECORD` into ``out``; with
    ``page_path`` also the page there and its figures beside it
    (``<stem>_<figure>.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    # labels are drawn as text: never handed to LaTeX, whatever the user's matplotlibrc
    # says (figures._text escapes mathtext's "$" too)
    with matplotlib.rc_context({"text.usetex": False}):
        return _write_report(result, out, page_path)


def _write_report(result: BenchmarkResult, out: Path, page_path: Path | None) -> list[Path]:
    spec = result.spec
    levels = [level["label"] for level in spec.benchmark.heterogeneity]
    fractions = spec.benchmark.fractions
    defenses = [d.display for d in spec.defenses]
    drawn = {}
    if len(result.table):
        drawn = {
            "worst-case heatmaps": figures.heatmaps_figure(result.table, defenses, levels, fractions),
            "best defense per cell": figures.best_figure(result.best, levels, fractions),
            "worst case against the fraction": figures.lines_figure(result.table, defenses, levels, fractions),
        }
    try:
        files: dict[str, Any] = {
            "worst_case.csv": result.table.to_csv(index=False),
            "worst_case.md": report.render_worst_case(result.table, fractions, levels, defenses,
                                                      result.not_applicable, result.rule, "md"),
            "worst_case.tex": report.render_worst_case(result.table, fractions, levels, defenses,
                                                       result.not_applicable, result.rule, "latex"),
            "breakdown.csv": result.breakdown.to_csv(index=False),
            "backdoors.csv": result.backdoors.to_csv(index=False),
            "best_defense.csv": result.best.to_csv(index=False),
            "tuning.csv": result.chosen.to_csv(index=False),
            "theorem.csv": result.readings.to_csv(index=False),
            "not_applicable.csv": result.not_applicable.to_csv(index=False),
            "report.md": report.page(result, {name: figures.FIGURES[name] for name in drawn}),
            RECORD: json.dumps(json_safe(record(result)), indent=1, allow_nan=False) + "\n",
        }
        for name, figure in drawn.items():
            stem = figures.FIGURES[name]
            files[stem] = figures.png_writer(figure)
            files[stem.replace(".png", ".pdf")] = figures.pdf_writer(figure)
        write_files(out, files)
        written = [out / name for name in files]
        if page_path is not None:
            page_path.parent.mkdir(parents=True, exist_ok=True)
            beside = {name: f"{page_path.stem}_{figures.FIGURES[name]}" for name in drawn}
            page_files: dict[str, Any] = {page_path.name: report.page(result, beside)}
            for name, figure in drawn.items():
                page_files[beside[name]] = figures.png_writer(figure)
                page_files[beside[name].replace(".png", ".pdf")] = figures.pdf_writer(figure)
            write_files(page_path.parent, page_files)
            written += [page_path.parent / path for path in page_files]
    finally:
        for figure in drawn.values():
            close_figure(figure)
    return written


def record(result: BenchmarkResult) -> dict[str, Any]:
    """What ``robust-pfl results`` reads back: the axes in order, the tolerance, the
    interval's rule and the summary."""
    spec = result.spec
    return {
        "fractions": spec.benchmark.fractions,
        "heterogeneity": [level["label"] for level in spec.benchmark.heterogeneity],
        "defenses": [d.display for d in spec.defenses],
        "tolerance": spec.benchmark.tolerance.model_dump(),
        "rule": {"seeds": list(result.rule.seeds), "initial": result.rule.initial, "racing": result.rule.racing,
                 "confidence": result.rule.confidence, "compare": result.rule.compare},
        "summary": result.summary,
    }


def _load(source: str | Path | Mapping[str, Any], quick: bool, subset: str | None, tune: bool | None,
          device: str | None, data_dir: str | None = None) -> tuple[BenchmarkSpec, BenchmarkSpec]:
    """The spec to run and the file's full spec (``device`` and ``data_dir`` set in
    both)."""
    if isinstance(source, Mapping):
        data, where, base_dir = copy.deepcopy(dict(source)), "<benchmark>", None
    else:
        data, where, base_dir = read_toml_file(source, "benchmark"), str(source), Path(source).parent
    if device is not None:
        data["device"] = device
    if data_dir is not None:
        data["task"] = {**(data.get("task") or {}), "data_dir": str(data_dir)}
    full = parse_benchmark(data, where, base_dir)  # checked once, whichever profile runs
    return profile_of(full, quick, subset, tune), full


def check_outputs(out: Path, page: Path | None) -> None:
    """``--out`` must be a directory or a path that can become one, ``--page`` a file
    path whose folder is one: refused before any cell runs, not after the run.

    Raises:
        ConfigError: naming the option and the path in its way.
    """
    problems = []
    if out.exists() and not out.is_dir():
        problems.append(f"--out {out}: a file, not a directory (give a directory for the results)")
    elif (blocked := _file_above(out)) is not None:
        problems.append(f"--out {out}: {blocked} is a file, not a directory")
    if page is not None:
        if page.is_dir():
            problems.append(f"--page {page}: a directory; give the page's file path (e.g. {page / 'benchmark.md'})")
        elif (blocked := _file_above(page)) is not None:
            problems.append(f"--page {page}: {blocked} is a file, not a directory")
    if problems:
        raise ConfigError("\n".join(problems))


def _file_above(path: Path) -> Path | None:
    """The nearest existing folder of ``path`` that is not a directory, if any."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def run_benchmark(
    source: str | Path | Mapping[str, Any], out: str | Path, *, quick: bool = False, subset: str | None = None,
    tune: bool | None = None, backend: Backend | None = None, device: str | None = None,
    progress: bool | None = None, page: str | Path | None = None, say: Callable[[str], None] | None = None,
    command: str | None = None, resources: Resources | None = None, workers: int = 1, data_dir: str | None = None,
    make_backend: Callable[[], Backend] | None = None,
) -> BenchmarkResult:
    """Run the benchmark ``source`` (a file path or its parsed mapping) into ``out``.

    ``quick``/``subset`` select the file's profiles, ``tune = False`` keeps the file's
    values, ``device`` and ``data_dir`` replace every cell's; ``backend`` runs the cells (default one
    after another here; ``workers``: how many cells it runs at once, for the estimate);
    ``make_backend``, where given instead, makes it once the outputs and the file are
    checked and planned, so that a mistake starts nothing (a Ray cluster); the caller
    closes it;
    ``page`` also writes the results page there; ``say`` gets the plan, cost and stage
    lines (default: standard error).
    """
    say = say or (lambda line: print(line, file=sys.stderr))
    start = time.perf_counter()
    out = Path(out)
    check_outputs(out, None if page is None else Path(page))
    spec, full = _load(source, quick, subset, tune, device, data_dir)
    plan = build_plan(spec, weigh=cost.run_seconds, say=say)
    estimate = cost.estimate(plan, rule_of(spec))
    say(f"benchmark {spec.source}: {len(plan.combos)} combinations ({plan.full_factorial()} runs with every seed), "
        f"{len(plan.not_applicable)} not applicable; {estimate.text(workers)}")
    owned = backend is None and make_backend is None
    backend = backend or (make_backend() if make_backend is not None else LocalBackend())
    totals = {"ran": 0, "stages": 0}  # runs made and stages that made some, in this call
    asked = 0
    errored: dict[str, str] = {}
    provenance: dict[str, Any] = {}
    try:
        while True:
            finals, curves = finals_frame(out, plan, plan.cells)
            allocation = judged(spec, plan, Runs.from_frames(finals, curves))
            wanted = [plan.cell(key, seed) for key, seed in allocation.requests]
            todo = [cell for cell in wanted if cell.cell not in errored]
            if not todo:
                break
            asked += 1
            say(f"stage {asked}: {len(todo)} runs (estimated {readable_duration(cost.seconds(todo, plan))} "
                "of compute, less any finished before)")
            summary = run_grid(plan.grid(todo, resources), out, backend, progress)
            totals["ran"] += summary["ran"]
            totals["stages"] += summary["ran"] > 0
            errored.update(summary["errored"])
            provenance = summary["provenance"]
        result = analyse(spec, plan, finals, curves)
        readings, ran = _theorem_readings(result, out, backend, progress, resources, say, errored)
        totals["ran"] += ran
        totals["stages"] += bool(ran)
    finally:
        if owned:
            backend.close()
    entries = attack_set(spec)
    seconds = time.perf_counter() - start
    measured = float(finals["cell_seconds"].sum()) if len(finals) else 0.0
    result.summary = {
        "name": Path(spec.source).stem,
        "command": command or f"robust_pfl.benchmark({str(source)!r}, quick={quick}, subset={subset!r})",
        "device": spec.base.get("device", "cpu"),
        "cells": len(plan.cells), "ran": totals["ran"], "skipped": len(plan.cells) - totals["ran"],
        "stages": totals["stages"],
        "errors": len(errored), "errored": errored,
        "full_factorial": plan.full_factorial(),
        "combinations": len(plan.combos),
        "not_applicable": len(plan.not_applicable),
        "seconds": seconds,
        "compute_seconds": measured,
        "estimated_seconds": estimate.seconds,
        "estimate": estimate.text(workers),
        "workers": workers,
        "profile": _profile(quick, subset, spec.benchmark.tune),
        "attacks": [e.label for e in entries if e.section != BACKDOOR],
        "backdoors": [e.label for e in entries if e.section == BACKDOOR],
        "tuning": ("per defense, heterogeneity level and fraction, raced on validation accuracy "
                   "(robust_pfl.worst_case.allocation); candidates per defense: "
                   + ", ".join(f"{d.display} {len(d.candidates(True))}" for d in spec.defenses))
        if spec.benchmark.tune else "none: the file's values",
        "per_cell": cost.measured_text(finals, plan, full),
        "provenance": provenance or _provenance(spec),
        "dirty": git_dirty(),
        "theorem": theorem.markdown(readings),
    }
    result.readings = readings
    result.files = write_report(result, out, Path(page) if page is not None else None)
    return result


def breaking_cells(result: BenchmarkResult) -> dict[tuple, str]:
    """The combinations that decided a *breaks* verdict (the chosen candidate under the
    deciding attack), each with its method's name."""
    names = {d.display: d.name for d in result.spec.defenses}
    out = {}
    for row in result.breakdown.itertuples():
        if row.status != analysis.DECIDED or not math.isfinite(row.breaks_at) or row.why == "not applicable":
            continue
        cell = result.table[(result.table["method"] == row.method) & (result.table["heterogeneity"] == row.heterogeneity)
                            & (result.table["fraction"] == row.breaks_at)]
        if len(cell):
            cell = cell.iloc[0]
            out[(row.method, cell["candidate"], row.heterogeneity, float(row.breaks_at), cell["decided_by"])] = \
                names[row.method]
    return out


def _theorem_readings(result: BenchmarkResult, out: Path, backend: Backend, progress: bool | None,
                      resources: Resources | None, say: Callable[[str], None],
                      errored: dict[str, str]) -> tuple[pd.DataFrame, int]:
    """Run the diagnostic of every threshold-clustering break
    (:mod:`robust_pfl.worst_case.theorem`) and read it; returns the readings and the
    runs made now."""
    from robust_pfl.experiments import parse_and_validate

    plan = result.plan
    items = theorem.diagnostics(plan, breaking_cells(result))
    cells = []
    for item in items:
        if item.key not in plan.extras:
            plan.add_extra(item.key, parse_and_validate(item.payload, plan.spec.source), DIAGNOSTIC)
        cells.append(plan.cell(item.key, plan.seeds[0]))
    ran = 0
    if cells:
        say(f"theorem diagnostics: {len(cells)} runs")
        summary = run_grid(plan.grid(cells, resources), out, backend, progress)
        ran = summary["ran"]
        errored.update(summary["errored"])
    rows = grid_results(out, plan.grid(cells)) if cells else pd.DataFrame()
    if rows.empty:
        return pd.DataFrame(columns=theorem.COLUMNS), ran
    final = rows[rows["final"].astype(str) == "True"]
    values = final.pivot_table(index="cell", columns="metric", values="value", aggfunc="first").reset_index()
    axes = pd.DataFrame([{"cell": c.cell, **c.axes} for c in cells])
    frame = axes.merge(values, on="cell", how="inner")
    frame["fraction"] = frame["fraction"].astype(float)
    return theorem.readings(frame, items, plan), ran


def _provenance(spec: BenchmarkSpec) -> dict[str, Any]:
    from robust_pfl.provenance import provenance

    return provenance(spec.base.get("device", "cpu"), 1, 0.0)
