"""Documented result pages: a recipe's Markdown output published where the docs show
it, with the line that says which command, commit and machine produced it.

A number in ``docs/results/`` is only evidence when a reader can rerun what produced
it on the CPU it names: ``robust-pfl reproduce FIG --page PATH`` (and ``attack-table
--page PATH``) write the recipe's page there, headed by :func:`provenance_line`, and
its figures beside it.  Another CPU model or another torch thread count can change the
last bits of a float sum, and after many rounds a reported accuracy by a few tenths
of a point, so the line names both.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from robust_pfl.provenance import git_commit, git_dirty, machine_text

#: What a page's first line starts with (tests/test_documented_numbers.py reads it).
PROVENANCE_PREFIX = "*Produced by `"
#: A page with text written by hand around its generated part marks that part; ``--page``
#: then replaces only what lies between the markers.
BEGIN, END = "<!-- generated: begin -->", "<!-- generated: end -->"


def generated_part(text: str) -> str:
    """What ``--page`` wrote into a page: the marked block, or the whole page."""
    if BEGIN in text and END in text:
        return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n") + "\n"
    return text


def provenance_line(command: str, seconds: float, threads: int | None, cells: Mapping[str, int] | None = None) -> str:
    """The page's first line: ``command``, the checkout's commit (flagged when the tree
    had uncommitted changes), this machine's CPU, torch's version and ``threads``, the
    wall time and, for a recipe that runs grids, how many of its ``cells`` were
    finished by an earlier call into the same store (their code may be older)."""
    import torch

    commit = git_commit()
    where = f"commit `{commit[:7]}`" if commit else "an unknown commit (not a git checkout)"
    if commit and git_dirty():
        where += " with uncommitted changes"
    thread_text = f"{threads} torch thread{'s' if threads != 1 else ''}" if threads else "torch's thread policy"
    text = (f"{PROVENANCE_PREFIX}{command}` at {where} on {machine_text()}, torch {torch.__version__}, "
            f"{thread_text}; {seconds:.0f} s")
    if cells:
        before = cells.get("skipped", 0)
        text += (f"; all {cells['cells']} cells ran in this call" if not before else
                 f"; {before} of {cells['cells']} cells were finished by an earlier call into the same store")
    return text + ".*"


def grid_cells(summaries: list[Mapping[str, Any]]) -> dict[str, int]:
    """The cell counts of a recipe's grid calls (each :func:`robust_pfl.grid.run_grid`'s
    summary), summed."""
    return {key: sum(int(summary[key]) for summary in summaries) for key in ("cells", "ran", "skipped")}


def publish(out: Path, markdown: str, page: Path, command: str, threads: int | None,
            figures: Mapping[str, str] | None = None) -> Path:
    """Write ``out/markdown`` (a recipe's page) to ``page`` under its provenance line,
    read from ``out/summary.json`` (``seconds``, and ``cells`` where the recipe ran
    grids): the whole page, or only its block between :data:`BEGIN` and :data:`END`
    where ``page`` has one (text written by hand around it is kept); copy each ``figures`` entry (name in ``out`` -> suffix) beside it as
    ``<page stem><suffix>``.  Return ``page``."""
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    body = (out / markdown).read_text(encoding="utf-8")
    text = provenance_line(command, float(summary["seconds"]), threads, summary.get("cells")) + "\n\n" + body
    page.parent.mkdir(parents=True, exist_ok=True)
    held = page.read_text(encoding="utf-8") if page.exists() else ""
    if BEGIN in held and END in held:
        text = held[:held.index(BEGIN) + len(BEGIN)] + "\n" + text.rstrip("\n") + "\n" + held[held.index(END):]
    page.write_text(text, encoding="utf-8")
    for name, suffix in (figures or {}).items():
        if (out / name).exists():
            shutil.copyfile(out / name, page.with_name(page.stem + suffix))
    return page
