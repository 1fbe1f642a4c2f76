r"""Every page of the user documentation (README.md and docs/**/*.md) points at files
that exist and shows code that is at least well-formed:

- every relative Markdown link ``[text](path)``, image ``![alt](path)`` and HTML image
  ``<img src="path">`` resolves to an existing file (``#anchors`` stripped; ``http(s)``,
  ``mailto:`` and pure ``#anchor`` links skipped);
- every fenced code block is checked by its language tag (the info string's first
  word): ``python`` blocks compile (without running: README's "From Python" block is
  executed by tests/test_api.py, docs/extending.md's by tests/test_extending_doc.py);
  ``toml`` blocks parse with ``tomllib``; ``bash``, ``sh``, ``shell`` and ``console``
  blocks have each ``robust-pfl ...`` command parsed by the CLI's own argparse parser
  (:func:`robust_pfl.cli.build_parser`; parsing opens no file, so placeholders such as
  ``CONFIG.toml`` or ``DIR`` are fine): a line that starts with ``robust-pfl``, after a
  ``$`` prompt or ``VAR=value`` assignments, or such a part of a ``&&`` / ``;`` chain,
  with ``\``-continued lines joined. Other commands in those blocks are skipped.
  Blocks with no language tag are left alone, but counted, so that what goes unchecked
  is visible.

Each failure names the file and the line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from robust_pfl.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: The languages whose blocks are checked, and how.
CHECKED = {"python": "compiled", "toml": "parsed with tomllib",
           "bash": "robust-pfl lines parsed", "sh": "robust-pfl lines parsed",
           "shell": "robust-pfl lines parsed", "console": "robust-pfl lines parsed"}
SHELL = {"bash", "sh", "shell", "console"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- links --------------------------------------------------------------------------

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']", re.I)
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.I)  # http:, https:, mailto:, ...


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image outside fenced code blocks and inline code."""
    found = []
    fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        for pattern in (INLINE_LINK, HTML_SRC):
            found.extend((number, target) for target in pattern.findall(prose))
    return found


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        local = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (path.parent / local).resolve()
        if not resolved.exists():
            problems.append(f"{rel(path)}:{number}: link to {target!r}: no such file")
        elif ROOT not in resolved.parents:
            problems.append(f"{rel(path)}:{number}: link to {target!r} leaves the repository")
    return problems


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_every_relative_link_and_image_resolves(path):
    assert broken_links(path) == []


def test_the_link_check_sees_links_images_and_html_images(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a) [web](https://example.org/x) [anchor](#top) `[code](gone.md)`\n"
        "![img](missing.png) <img src=\"gone.png\" width=\"50%\">\n"
        "```bash\n[not a link](inside_a_block.md)\n```\n"
        "[up](../outside.md)\n"
    )
    (tmp_path.parent / "outside.md").write_text("x")
    assert broken_links(page) == [
        "page.md:2: link to 'missing.png': no such file",
        "page.md:2: link to 'gone.png': no such file",
        "page.md:6: link to '../outside.md' leaves the repository",
    ]


# --- fenced code blocks -------------------------------------------------------------


@dataclass
class Block:
    path: Path
    line: int  # the line of the opening fence
    language: str  # the info string's first word, "" when untagged
    body: str

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")


def blocks(path: Path) -> list[Block]:
    found, lines = [], path.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, fence, language = match.groups()
        start, body = index, []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            line = lines[index]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            index += 1
        found.append(Block(path, start + 1, language.lower(), "\n".join(body) + "\n"))
        index += 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def _of(language: str | set[str]) -> list[Block]:
    languages = {language} if isinstance(language, str) else language
    return [block for block in ALL_BLOCKS if block.language in languages]


def test_block_kinds_are_counted_and_the_untagged_ones_left_alone(record_property):
    """The documentation shows Python, TOML and shell blocks, each kind checked below;
    a block in any other language fails here until this test learns to check it.
    Untagged blocks (output, mixed text) are left alone: counted and reported."""
    counts = Counter(block.language or "(untagged)" for block in ALL_BLOCKS)
    record_property("fenced_blocks", dict(counts))
    checked = ", ".join(f"{n} {lang} ({CHECKED[lang]})" for lang, n in sorted(counts.items()) if lang in CHECKED)
    print(f"fenced blocks: {checked}; {counts['(untagged)']} untagged, not checked")  # shown with -s or -rP
    unchecked = sorted(f"{block.where} ({block.language})" for block in ALL_BLOCKS
                       if block.language and block.language not in CHECKED)
    assert unchecked == [], f"blocks in a language this test does not check: {unchecked}"
    assert counts["python"] >= 3 and counts["toml"] >= 5 and sum(counts[s] for s in SHELL) >= 2, counts


def compile_problem(block: Block) -> str | None:
    try:
        compile(block.body, block.where, "exec")
    except SyntaxError as error:
        return f"{rel(block.path)}:{block.line + (error.lineno or 0)}: python block does not compile: {error.msg}"
    return None


@pytest.mark.parametrize("block", _of("python"), ids=lambda b: b.where)
def test_python_blocks_compile(block):
    assert compile_problem(block) is None


def toml_problem(block: Block) -> str | None:
    try:
        tomllib.loads(block.body)
    except tomllib.TOMLDecodeError as error:
        return f"{block.where}: toml block does not parse: {error}"
    return None


@pytest.mark.parametrize("block", _of("toml"), ids=lambda b: b.where)
def test_toml_blocks_parse(block):
    assert toml_problem(block) is None


ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")


def commands(block: Block) -> list[tuple[int, list[str]]]:
    """(line, argv after ``robust-pfl``) of every ``robust-pfl`` command in a shell block:
    comments dropped, ``\\``-continued lines joined, a ``$`` prompt and leading
    ``VAR=value`` assignments skipped, and each part of ``&&``, ``||``, ``;`` and ``|``
    chains taken on its own."""
    found, pending, first = [], "", 0
    for offset, raw in enumerate(block.body.splitlines(), 1):
        if not pending:
            first = block.line + offset
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        part: list[str] = []
        for word in [*words, ";"]:
            if word in {"&&", "||", ";", "|"} or word.endswith(";"):
                if word.endswith(";") and word != ";":
                    part.append(word[:-1])
                while part and (part[0] == "$" or ASSIGNMENT.match(part[0])):
                    part = part[1:]
                if part and part[0] == "robust-pfl":
                    found.append((first, part[1:]))
                part = []
            else:
                part.append(word)
    return found


def parse_problem(where: str, argv: list[str]) -> str | None:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            message = stderr.getvalue().strip().splitlines()[-1:] or [""]
            return f"{where}: robust-pfl {shlex.join(argv)}: {message[0]}"
    return None


SHELL_COMMANDS = [(f"{rel(block.path)}:{line}", argv) for block in _of(SHELL) for line, argv in commands(block)]


@pytest.mark.parametrize(("where", "argv"), SHELL_COMMANDS, ids=[where for where, _ in SHELL_COMMANDS])
def test_robust_pfl_commands_in_shell_blocks_parse(where, argv):
    assert parse_problem(where, argv) is None


def test_shell_blocks_show_robust_pfl_commands():
    assert len(SHELL_COMMANDS) >= 3
    assert any(where.startswith("README.md:") for where, _ in SHELL_COMMANDS)


def test_the_block_checks_name_the_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "text\n"
        "```python run=.\nx = (1,\n```\n"
        "```toml\n[a\n```\n"
        "```bash\n# a comment\npip install x && robust-pfl run CONFIG.toml --out DIR\n"
        "ROBUST_PFL_DATA=DIR robust-pfl --threads 1 run \\\n    c.toml --nosuch\nls\n"
        "robust-pfl reproduce fig9\n```\n"
        "```\nrobust-pfl not checked\n```\n"
    )
    found = blocks(page)
    assert [(block.line, block.language) for block in found] == [(2, "python"), (5, "toml"), (8, "bash"), (16, "")]
    assert compile_problem(found[0]).startswith("page.md:3: python block does not compile")
    assert toml_problem(found[1]).startswith("page.md:5: toml block does not parse")
    parsed = commands(found[2])
    assert parsed == [
        (10, ["run", "CONFIG.toml", "--out", "DIR"]),
        (11, ["--threads", "1", "run", "c.toml", "--nosuch"]),
        (14, ["reproduce", "fig9"]),
    ]
    problems = [parse_problem(f"page.md:{line}", argv) for line, argv in parsed]
    assert problems[0] is None
    assert problems[1].startswith("page.md:11: robust-pfl --threads 1 run c.toml --nosuch:")
    assert "unrecognized arguments: --nosuch" in problems[1]
    assert problems[2].startswith("page.md:14: robust-pfl reproduce fig9:") and "invalid choice" in problems[2]


def test_parsing_a_command_opens_no_file(tmp_path, monkeypatch):
    """A placeholder path parses: the parser only records it."""
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["run", "CONFIG.toml", "--out", "DIR"])
    assert isinstance(args, argparse.Namespace) and args.config == "CONFIG.toml"
    assert list(tmp_path.iterdir()) == []
