"""docs/python.md is true as written: its run block runs, its table lists the frame's
columns (robust_pfl.api.RUN_COLUMNS) and the frame has no attack column, accuracies
are fractions in the frame, and a dict config's relative plug-in path resolves
against the working directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import robust_pfl
from robust_pfl.api import RUN_COLUMNS
from robust_pfl.plugins import with_resolved_paths

pytestmark = pytest.mark.usefixtures("single_thread")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python.md"


def test_the_pages_run_block_runs():
    blocks = re.findall(r"```python run\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 1
    scope: dict = {}
    exec(compile(blocks[0], str(PAGE), "exec"), scope)
    frame = scope["frame"]
    assert "attack" not in frame.columns
    assert set(scope["curves"].columns) == {"global", "fc (default)"}  # the method's label
    assert sorted(set(frame["round"])) == [0, 2, 4]  # 0 (before training), every eval_every


def test_the_pages_column_table_is_the_frames_columns():
    section = PAGE.read_text().split("## The frame", 1)[1].split("##", 1)[0]
    assert tuple(re.findall(r"^\| `(\w+)` \|", section, re.M)) == RUN_COLUMNS


def test_accuracies_are_fractions_in_the_frame():
    config = {"seeds": [0], "rounds": 1, "eval_every": 1, "batch_size": 8,
              "task": {"name": "image", "kind": "private_label", "clusters": 2, "clients_per_cluster": 2,
                       "model": {"name": "mlp", "hidden": [8]}},
              "methods": [{"name": "global", "lr": 0.01}]}
    frame = robust_pfl.run(config, progress=False)
    accuracy = frame[frame.metric == "test_accuracy"]["value"]
    assert len(accuracy) == 2 and accuracy.between(0.0, 1.0).all()


def test_a_dict_configs_relative_plugin_path_resolves_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert with_resolved_paths({"plugins": ["mine.py", "a_module"]})["plugins"] == [str(tmp_path / "mine.py"),
                                                                                  "a_module"]
