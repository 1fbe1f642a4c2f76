"""docs/extending.md is executed as written: its files are written into a fresh folder
(``file=NAME`` blocks), its test function passes, and its Python block runs the run
file there (``run=.``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import attacks
import defenses

pytestmark = pytest.mark.usefixtures("single_thread")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCK = re.compile(r"```(\w+) (file|run)=(\S+)\n(.*?)```", re.S)


def test_every_block_of_the_extending_page_runs(tmp_path, monkeypatch):
    blocks = BLOCK.findall(PAGE.read_text())
    files = {target: body for _, kind, target, body in blocks if kind == "file"}
    runs = [body for _, kind, _, body in blocks if kind == "run"]
    assert {"my_attack.py", "test_my_attack.py", "run.toml", "my_aggregator.py", "test_my_aggregator.py",
            "my_algorithm.py", "test_my_algorithm.py"} <= set(files)
    assert len(runs) == 3
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("my_attack", "my_aggregator", "my_algorithm"):  # another test's file of the same name
        sys.modules.pop(module, None)
    try:
        namespace: dict = {}
        exec(compile(files["test_my_attack.py"], "test_my_attack.py", "exec"), namespace)
        namespace["test_against_the_mean_meets_the_attack_contract"]()
        exec(compile(files["test_my_aggregator.py"], "test_my_aggregator.py", "exec"), namespace)
        namespace["test_median_norm_clip_meets_the_aggregator_contract"]()
        exec(compile(files["test_my_algorithm.py"], "test_my_algorithm.py", "exec"), namespace)
        namespace["test_median_blend_meets_the_algorithm_contract"]()
        finals = []
        for body in runs:
            scope: dict = {}
            exec(compile(body, str(PAGE), "exec"), scope)
            finals.append(set(scope["final"]["method"]))
        assert finals[0] == {"fc", "global"} and len(finals[1]) == 1 and finals[2] == {"median_blend", "local"}
    finally:
        attacks.REGISTRY.pop("against_the_mean", None)
        defenses.AGGREGATORS.pop("median_norm_clip", None)
        defenses.REGISTRY.pop("median_blend", None)
        for module in ("my_attack", "my_aggregator", "my_algorithm"):
            sys.modules.pop(module, None)
