"""Resumable grids: a grid killed midway resumes without losing or duplicating finished
runs (the project's "nothing is lost" standard)."""

from __future__ import annotations

import json

import pytest

from robust_pfl.grid import Cell, CellStore, run_grid


def make_cells(rounds: int = 10) -> list[Cell]:
    return [Cell((("attack", a), ("seed", s)), {"rounds": rounds, "attack": a}) for a in "xyz" for s in (0, 1)]


class Killed(Exception):
    pass


def runner(calls: list[str], die_at: int | None = None):
    def run(cell: Cell) -> list[dict]:
        if die_at is not None and len(calls) == die_at:
            raise Killed
        calls.append(cell.key_text)
        return [{"metric": "value", "round": 1, "value": float(len(calls))}]

    return run


def test_killed_grid_resumes_without_losing_or_duplicating(tmp_path):
    store = CellStore(tmp_path / "cells.jsonl")
    first: list[str] = []
    with pytest.raises(Killed):
        run_grid(make_cells(), runner(first, die_at=4), store)
    assert len(first) == 4
    second: list[str] = []
    rows = run_grid(make_cells(), runner(second), store)
    assert len(second) == 2 and not set(first) & set(second)  # only the unfinished cells ran
    assert len(rows) == 6 and len({(r["attack"], r["seed"]) for r in rows}) == 6
    assert sorted(r["value"] for r in rows if r["attack"] == "x") == [1.0, 2.0]  # earlier results kept


def test_a_line_cut_by_a_kill_is_ignored_and_its_cell_rerun(tmp_path):
    path = tmp_path / "cells.jsonl"
    store = CellStore(path)
    run_grid(make_cells()[:2], runner([]), store)
    with open(path, "a") as handle:
        handle.write('{"key_text": "trunc')  # a half-written record
    calls: list[str] = []
    rows = run_grid(make_cells(), runner(calls), store)
    assert len(calls) == 4 and len(rows) == 6
    lines = path.read_text().splitlines()
    assert sum(1 for line in lines if line.startswith('{"key_text": "trunc')) == 1
    assert all(json.loads(line) for line in lines if not line.startswith('{"key_text": "trunc'))


def test_changed_settings_do_not_reuse_old_results(tmp_path):
    store = CellStore(tmp_path / "cells.jsonl")
    run_grid(make_cells(rounds=10), runner([]), store)
    calls: list[str] = []
    run_grid(make_cells(rounds=20), runner(calls), store)
    assert len(calls) == 6


def test_duplicate_keys_are_refused(tmp_path):
    cell = make_cells()[0]
    with pytest.raises(ValueError, match="distinct"):
        run_grid([cell, cell], runner([]), CellStore(tmp_path / "c.jsonl"))
