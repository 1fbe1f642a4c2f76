"""docs/attacks.md lists every built-in attack, ``none`` included, and nothing else:
an attack registered without a row on the page, or a row naming no attack, fails
here (compared both ways, so the page and the registry cannot drift apart)."""

from __future__ import annotations

import re
from pathlib import Path

import attacks

PAGE = Path(__file__).resolve().parents[1] / "docs" / "attacks.md"
#: A row of the attack table: its first cell holds one or more backticked names.
ROW = re.compile(r"^\| ((?:`\w+`(?:, )?)+) \|", re.M)


def documented_names(text: str) -> list[str]:
    """Every attack name in the first column of the page's table, in order."""
    return [name for cell in ROW.findall(text) for name in re.findall(r"`(\w+)`", cell)]


def built_in_names() -> set[str]:
    """The registered attacks shipped in ``attacks/`` (a plug-in registered by another
    test is not the page's business), and :data:`attacks.NO_ATTACK`."""
    shipped = {name for name, cls in attacks.REGISTRY.items() if cls.__module__.startswith("attacks.")}
    return shipped | {attacks.NO_ATTACK}


def test_the_attacks_page_lists_every_registered_attack_and_only_those():
    names = documented_names(PAGE.read_text())
    twice = sorted({name for name in names if names.count(name) > 1})
    assert not twice, f"named twice on docs/attacks.md: {twice}"
    registered = built_in_names()
    assert not registered - set(names), f"registered but not on docs/attacks.md: {sorted(registered - set(names))}"
    assert not set(names) - registered, f"on docs/attacks.md but not registered: {sorted(set(names) - registered)}"


def test_the_row_parser_sees_a_missing_and_an_unknown_entry():
    """The comparison can fail: dropping a row or adding an unregistered name shows."""
    text = PAGE.read_text()
    without = "\n".join(line for line in text.splitlines() if not line.startswith("| `none` |"))
    assert attacks.NO_ATTACK in documented_names(text)
    assert attacks.NO_ATTACK not in documented_names(without)
    extra = text.replace("| `constant` |", "| `constant`, `bitflip` |")
    assert "bitflip" in set(documented_names(extra)) - built_in_names()
