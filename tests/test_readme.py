"""The README and the docs stay true to the code (docs that drift are bugs): the config
and grid examples of docs/config.md and docs/grids.md validate, every command the
README lists exists, links resolve, and the user documentation stays a user's document
(length, no development-log wording, nothing outside the repository)."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from robust_pfl.cli import build_parser
from robust_pfl.config import parse_config
from robust_pfl.experiments import validate
from robust_pfl.grid_file import expand_grid

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIG_PAGE = ROOT / "docs" / "config.md"  # the config format, moved out of the README
GRIDS_PAGE = ROOT / "docs" / "grids.md"
USER_DOCS = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def toml_blocks(text: str) -> list[dict]:
    return [tomllib.loads(block) for block in re.findall(r"^```toml\n(.*?)^```", text, re.S | re.M)]


def whole_configs(text: str) -> list[dict]:
    return [block for block in toml_blocks(text) if "methods" in block and "grid" not in block]


def test_grid_page_examples_expand_and_validate():
    """A ```toml block with a [grid] table is a grid file: every cell validates, and
    the cells are the product of its axes (methods x seeds x each [grid] list)."""
    grids = [block for block in toml_blocks(GRIDS_PAGE.read_text()) if "grid" in block]
    assert grids, "docs/grids.md shows no grid file"
    for data in grids:
        grid = expand_grid(data, "docs/grids.md grid example")
        count = len(data["methods"]) * len(data.get("seeds", [0]))
        for values in _lists(data["grid"]):
            count *= len(values)
        assert len(grid.cells) == count


def _lists(table: dict) -> list[list]:
    out = []
    for value in table.values():
        out.extend(_lists(value) if isinstance(value, dict) else [value])
    return out


def test_config_page_whole_config_examples_validate():
    configs = whole_configs(CONFIG_PAGE.read_text())
    assert configs, "docs/config.md shows no whole config (a ```toml block with [[methods]])"
    for data in configs:
        config = validate(parse_config(data, "docs/config.md example"))
        assert config.methods and config.task.name in {"synthetic_linear", "image"}
    first = validate(parse_config(configs[0], "docs/config.md example"))
    assert first.methods[0].name == "fc" and first.attack.name == "large_gradient"
    assert first.byzantine.total == 8


def test_config_page_task_tables_parse_in_the_main_example():
    """A block that is only a ``[task]`` table replaces the main example's task: its
    fields must parse (its data files need not exist here)."""
    blocks = toml_blocks(CONFIG_PAGE.read_text())
    base = whole_configs(CONFIG_PAGE.read_text())[0]
    tasks = [block for block in blocks if set(block) == {"task"}]
    assert tasks, "docs/config.md shows no [task] table for the image task"
    for block in tasks:
        config = parse_config({**base, **block}, "docs/config.md task example")
        assert config.task.name == block["task"]["name"]
        assert config.task.model_dump(include=set(block["task"])) == block["task"]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _positional_choices(parser: argparse.ArgumentParser) -> set[str]:
    return {
        str(choice)
        for action in parser._actions
        if not action.option_strings and action.choices and not isinstance(action, argparse._SubParsersAction)
        for choice in action.choices
    }


def command_table_rows(text: str) -> list[str]:
    """The commands of the README's command table, placeholders and all."""
    section = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    return [row.replace("\\|", "|") for row in re.findall(r"^\| `(robust-pfl [^`]+)` \|", section, re.M)]


def unknown_parts(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """Parts of ``robust-pfl SUB [SUB ...] [CHOICE|CHOICE] [--option VALUE ...]`` that
    the parser does not know: subcommands, choices of a positional or an option,
    options.  Upper-case words and ``*.toml`` are placeholders."""
    words = re.sub(r"[\[\]]", " ", command).split()[1:]
    missing: list[str] = []
    current, option = parser, None
    for word in words:
        if word.startswith("--"):
            option = current._option_string_actions.get(word) or parser._option_string_actions.get(word)
            if option is None:
                missing.append(word)
            elif option.nargs == 0:
                option = None
            continue
        choices = option.choices if option is not None else None
        option = None
        if choices is None and word in _subcommands(current):
            current = _subcommands(current)[word]
        elif word.isupper() or word.endswith(".toml"):
            continue
        else:
            allowed = {str(c) for c in choices} if choices is not None else _positional_choices(current)
            missing.extend(part for part in word.split("|") if part not in allowed)
    return missing


def test_every_command_in_the_readme_table_exists():
    rows = command_table_rows(README.read_text())
    assert len(rows) >= 8
    parser = build_parser()
    assert {row.split()[1] for row in rows} <= set(_subcommands(parser))
    assert {row: unknown_parts(row, parser) for row in rows} == {row: [] for row in rows}


def test_every_subcommand_is_in_the_readme_table():
    listed = {row.split()[1] for row in command_table_rows(README.read_text())}
    assert set(_subcommands(build_parser())) == listed


def test_command_check_rejects_what_the_parser_lacks():
    parser = build_parser()
    assert unknown_parts("robust-pfl reproduce table1 [--partition official|fixed] [--out DIR]", parser) == []
    assert unknown_parts("robust-pfl reproduce fig3|fig9 [--fast] [--out DIR]", parser) == ["fig9", "--fast"]
    assert unknown_parts("robust-pfl reproduce table1 [--partition official|random]", parser) == ["random"]
    assert unknown_parts("robust-pfl evaluate CONFIG.toml", parser) == ["evaluate"]
    assert unknown_parts("robust-pfl theory report [--quick]", parser) == []


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(path):
    text = path.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    missing = [t for t in local if not (path.parent / t).resolve().is_file()]
    outside = [t for t in local if ROOT not in (path.parent / t).resolve().parents]
    assert (missing, outside) == ([], [])


LOG_WORDING = re.compile(
    r"this session|previous session|earlier session|sessions? ago|an earlier engine|the issue's target"
    r"|design card|\.\./shared|/work/",
    re.I,
)
OUTSIDE_FILES = re.compile(r"\bSPEC\b")  # the papers' notes outside the repository


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_have_no_log_wording_or_outside_references(path):
    hits = [
        line.strip()
        for line in path.read_text().splitlines()
        if LOG_WORDING.search(line) or OUTSIDE_FILES.search(line)
    ]
    assert hits == []


README_MAX_LINES = 250


def test_readme_stays_short_and_keeps_its_quick_start():
    """A newcomer reads the README end to end: what it is, the quick start, the Python
    example, the commands and links. Reference material (config format, grids, attacks,
    defenses, design, the official rules) lives in docs/, results (reproductions, the
    theory report) in docs/results/."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "robust-pfl run configs/quickstart.toml" in text
    assert 'python -m pytest -m "not slow" -n 2 -q' in text
    assert (ROOT / "configs" / "quickstart.toml").is_file()
