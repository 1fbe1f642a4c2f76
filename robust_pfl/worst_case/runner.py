"""``robust-pfl benchmark``: plan a benchmark's cells, run them into the grid store
(resumable after a kill, local pool or Ray, cells shared with other grids), then
tune, take the worst case and write the tables, figures and page."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from robust_pfl.backends import Backend
from robust_pfl.costs import readable_duration
from robust_pfl.grid import grid_results, run_grid
from robust_pfl.grid_file import Resources
from robust_pfl.engine.results import close_figure, json_safe, png_writer, write_files
from robust_pfl.worst_case import analysis, figures, report
from robust_pfl.worst_case.plan import BACKDOOR, COLUMNS, Plan, attack_set, build_plan
from robust_pfl.worst_case.spec import BenchmarkSpec, load_benchmark, parse_benchmark

#: The final metrics a benchmark reads from each cell.
METRICS = ("test_accuracy", "validation_accuracy", "worst_cluster_test_accuracy", "attack_success_rate",
           "nonfinite_models")
RECORD = "benchmark.json"


@dataclass
class BenchmarkResult:
    """A finished benchmark: its spec and plan, the per-cell finals, the tuned choices
    and the tables of :mod:`robust_pfl.worst_case.analysis`, the summary and the files
    written."""

    spec: BenchmarkSpec
    plan: Plan
    finals: pd.DataFrame
    chosen: pd.DataFrame
    table: pd.DataFrame
    breakdown: pd.DataFrame
    backdoors: pd.DataFrame
    best: pd.DataFrame
    not_applicable: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)


def finals_frame(out: Path, plan: Plan) -> pd.DataFrame:
    """One row per finished cell of ``plan`` in ``out``'s store: the plan's axes (a
    cell shared with another grid keeps this benchmark's labels), ``section``,
    ``n_byzantine``, ``cell_seconds`` and the final :data:`METRICS`."""
    columns = ["cell", *COLUMNS, "section", "n_byzantine", "cell_seconds", *METRICS]
    if not plan.cells:
        return pd.DataFrame(columns=columns)
    rows = grid_results(out, plan.grid())
    final = rows[rows["final"].astype(str) == "True"]
    values = final.pivot_table(index="cell", columns="metric", values="value", aggfunc="first")
    axes = pd.DataFrame([{"cell": c.cell, **c.axes, "section": plan.sections[c.cell], "n_byzantine": c.n_byzantine}
                         for c in plan.cells])
    frame = axes.merge(values.reset_index(), on="cell", how="inner")
    for metric in [*METRICS, "cell_seconds"]:
        frame[metric] = pd.to_numeric(frame[metric], errors="coerce") if metric in frame else float("nan")
    frame["fraction"] = frame["fraction"].astype(float)
    return frame[columns]


def chance_accuracy(spec: BenchmarkSpec) -> float:
    """1 / the number of classes of the benchmark's data set."""
    from robust_pfl.engine.datasets import load_dataset

    task = spec.base.get("task", {})
    return 1.0 / load_dataset(task.get("dataset", "digits"), task.get("data_dir")).num_classes


def analyse(spec: BenchmarkSpec, plan: Plan, finals: pd.DataFrame) -> BenchmarkResult:
    """Tune, take the worst case, find the breakdowns and the best defenses."""
    chosen = analysis.tune(finals)
    table = analysis.worst_case(finals, chosen)
    return BenchmarkResult(
        spec, plan, finals, chosen, table,
        analysis.breakdown(table, spec.benchmark.fractions, spec.benchmark.tolerance, chance_accuracy(spec)),
        analysis.backdoor_worst_case(finals, chosen),
        analysis.best_defense(table),
        pd.DataFrame(plan.not_applicable, columns=[*COLUMNS[:-1], "section", "reason"]),
    )


def _profile(quick: bool, subset: str | None, tune: bool) -> str:
    name = "quick (a smoke run: few rounds, one seed)" if quick else (f"subset {subset!r}" if subset else "full")
    return name + ("" if tune else "; not tuned (the file's values)")


def _cost_text(finals: pd.DataFrame, spec: BenchmarkSpec, full: BenchmarkSpec) -> str:
    """The measured seconds per cell and the full file's extrapolation."""
    seconds = finals["cell_seconds"].dropna()
    if seconds.empty:
        return "no cell finished."
    per_cell = float(seconds.mean())
    rounds, full_rounds = spec.base.get("rounds", 100), full.base.get("rounds", 100)
    count = full_cell_count(full)
    extrapolated = count * per_cell * full_rounds / rounds
    workers = os.cpu_count() or 1
    return (f"{per_cell:.2f} s per cell on one worker (mean of {len(seconds)} cells, {rounds} rounds; "
            f"{readable_duration(float(seconds.sum()))} of compute in all); the full file has at most {count} "
            f"cells at {full_rounds} rounds, about {readable_duration(extrapolated)} of one worker, "
            f"{readable_duration(extrapolated / workers)} with --jobs {workers} on this machine "
            "(measured per cell x cells x round ratio).")


def full_cell_count(spec: BenchmarkSpec) -> int:
    """An upper bound on the cells of the unnarrowed file (not-applicable combinations
    are only known after validating each)."""
    attacks = len(attack_set(spec))
    fractions = spec.benchmark.fractions
    per_candidate = sum(1 if f == 0 else attacks for f in fractions)
    candidates = sum(len(d.candidates(spec.benchmark.tune)) for d in spec.defenses)
    return len(spec.benchmark.heterogeneity) * candidates * per_candidate * len(spec.seeds)


def write_report(result: BenchmarkResult, out: Path, page_path: Path | None = None) -> list[Path]:
    """Write the tables (``worst_case.csv``/``.md``/``.tex``, ``breakdown.csv``,
    ``backdoors.csv``, ``best_defense.csv``, ``tuning.csv``, ``not_applicable.csv``), the
    figures, ``report.md`` and :data:`RECORD` into ``out``; with ``page_path`` also the
    page there and its figures beside it (``<stem>_<figure>.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    spec = result.spec
    levels = [level["label"] for level in spec.benchmark.heterogeneity]
    fractions = spec.benchmark.fractions
    defenses = [d.display for d in spec.defenses]
    drawn = {}
    if len(result.table):
        drawn = {
            "worst-case heatmaps": figures.heatmaps_figure(result.table, defenses, levels, fractions),
            "best defense per cell": figures.best_figure(result.best, levels, fractions),
            "worst case against the fraction": figures.lines_figure(result.table, defenses, levels),
        }
    try:
        files: dict[str, Any] = {
            "worst_case.csv": result.table.to_csv(index=False),
            "worst_case.md": report.render_worst_case(result.table, fractions, levels, defenses,
                                                      result.not_applicable, "md"),
            "worst_case.tex": report.render_worst_case(result.table, fractions, levels, defenses,
                                                       result.not_applicable, "latex"),
            "breakdown.csv": result.breakdown.to_csv(index=False),
            "backdoors.csv": result.backdoors.to_csv(index=False),
            "best_defense.csv": result.best.to_csv(index=False),
            "tuning.csv": result.chosen.to_csv(index=False),
            "not_applicable.csv": result.not_applicable.to_csv(index=False),
            "report.md": report.page(result, {name: figures.FIGURES[name] for name in drawn}),
            RECORD: json.dumps(json_safe(record(result)), indent=1, allow_nan=False) + "\n",
        }
        files.update({figures.FIGURES[name]: png_writer(figure) for name, figure in drawn.items()})
        write_files(out, files)
        written = [out / name for name in files]
        if page_path is not None:
            page_path.parent.mkdir(parents=True, exist_ok=True)
            beside = {name: f"{page_path.stem}_{figures.FIGURES[name]}" for name in drawn}
            write_files(page_path.parent, {**{beside[n]: png_writer(f) for n, f in drawn.items()},
                                           page_path.name: report.page(result, beside)})
            written += [page_path, *(page_path.parent / path for path in beside.values())]
    finally:
        for figure in drawn.values():
            close_figure(figure)
    return written


def record(result: BenchmarkResult) -> dict[str, Any]:
    """What ``robust-pfl results`` reads back: the axes in order, the tolerance and the
    summary."""
    spec = result.spec
    return {
        "fractions": spec.benchmark.fractions,
        "heterogeneity": [level["label"] for level in spec.benchmark.heterogeneity],
        "defenses": [d.display for d in spec.defenses],
        "tolerance": spec.benchmark.tolerance,
        "summary": result.summary,
    }


def run_benchmark(
    source: str | Path | Mapping[str, Any], out: str | Path, *, quick: bool = False, subset: str | None = None,
    tune: bool | None = None, backend: Backend | None = None, device: str | None = None,
    progress: bool | None = None, page: str | Path | None = None, say: Callable[[str], None] | None = None,
    command: str | None = None, resources: Resources | None = None,
) -> BenchmarkResult:
    """Run the benchmark ``source`` (a file path or its parsed mapping) into ``out``.

    ``quick``/``subset`` select the file's profiles, ``tune = False`` keeps the file's
    values, ``device`` replaces every cell's; ``backend`` runs the cells (default one
    after another here); ``page`` also writes the results page there; ``say`` gets the
    plan and cost lines before any work (default: standard error).
    """
    say = say or (lambda line: print(line, file=sys.stderr))
    start = time.perf_counter()
    if isinstance(source, Mapping):
        data = dict(source)
        if device is not None:
            data["device"] = device
        spec = parse_benchmark(data, "<benchmark>", None, quick, subset, tune)
        full = parse_benchmark(data, "<benchmark>", None)
    else:
        spec = load_benchmark(source, quick, subset, tune)
        full = load_benchmark(source)
        if device is not None:
            spec = spec.model_copy(update={"base": {**spec.base, "device": device}})
    plan = build_plan(spec)
    say(f"benchmark {spec.source}: {len(plan.cells)} cells, {len(plan.not_applicable)} combinations not "
        f"applicable; estimated at least {readable_duration(plan.estimated_seconds)} of compute "
        "(robust_pfl.costs' lower bound)")
    out = Path(out)
    grid_summary = run_grid(plan.grid(resources), out, backend, progress)
    finals = finals_frame(out, plan)
    result = analyse(spec, plan, finals)
    entries = attack_set(spec)
    profile_tune = spec.benchmark.tune
    result.summary = {
        "name": Path(spec.source).stem,
        "command": command or f"robust_pfl.benchmark({str(source)!r}, quick={quick}, subset={subset!r})",
        "device": spec.base.get("device", "cpu"),
        "cells": len(plan.cells), "ran": grid_summary["ran"], "skipped": grid_summary["skipped"],
        "errors": grid_summary["errors"], "errored": grid_summary["errored"],
        "not_applicable": len(plan.not_applicable),
        "seconds": time.perf_counter() - start,
        "profile": _profile(quick, subset, profile_tune),
        "attacks": [e.label for e in entries if e.section != BACKDOOR],
        "backdoors": [e.label for e in entries if e.section == BACKDOOR],
        "tuning": ("per defense, heterogeneity level and fraction, the candidate of highest worst-case validation "
                   "accuracy over the attacks (validation carved from the honest clients' training data; the test "
                   "split is never read); candidates per defense: "
                   + ", ".join(f"{d.display} {len(d.candidates(True))}" for d in spec.defenses))
        if profile_tune else "none: the file's values",
        "per_cell": _cost_text(finals, spec, full),
        "estimated_seconds": plan.estimated_seconds,
        "provenance": grid_summary["provenance"],
    }
    result.files = write_report(result, out, Path(page) if page is not None else None)
    return result
