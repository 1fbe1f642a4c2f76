"""The listing commands show everything registered, with parameters."""

from __future__ import annotations

import attacks
import defenses
from robust_pfl.cli import main


def test_attacks_listing_names_every_attack_with_tags(capsys):
    assert main(["attacks"]) == 0
    out = capsys.readouterr().out
    for name in attacks.REGISTRY:
        assert f"  {name}" in out
    assert "[data]" in out and "omniscient" in out and "eps: default 0.05" in out


def test_defenses_listing_names_algorithms_and_aggregators(capsys):
    assert main(["defenses", "--brief"]) == 0
    out = capsys.readouterr().out
    for name in [*defenses.REGISTRY, *defenses.AGGREGATORS]:
        assert f"  {name}" in out
    assert not any(line.startswith("      ") for line in out.splitlines())  # --brief: no parameters


def test_listings_describe_attack_and_aggregator_options(capsys, monkeypatch):
    """Every option of a built-in attack or aggregator is listed with its default and
    its one-line description (its pydantic Field's)."""
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option
    main(["attacks"])
    listed = capsys.readouterr().out
    assert "      scale: default 1.0  the rows sent are -scale * g" in listed  # bit_flip
    described = [attacks.describe(cls)["descriptions"] for cls in attacks.REGISTRY.values()]
    main(["defenses"])
    listed += capsys.readouterr().out
    assert "      s: default 2  rows per bucket" in listed  # bucketing
    described += [defenses.aggregators.describe(cls)["descriptions"] for cls in defenses.AGGREGATORS.values()]
    for options in described:
        for option, text in options.items():
            assert f"      {option}: default " in listed and f"  {text}" in listed, (option, text)


def test_defenses_listing_shows_config_names_of_aliased_parameters(capsys):
    main(["defenses"])
    assert "      lambda: default 1.0" in capsys.readouterr().out  # Ditto's `lam` field


def test_listings_fit_the_terminal_and_show_defaults_as_a_config_writes_them(capsys, monkeypatch):
    """Wrapped to the terminal's width; the ``none`` attack listed; defaults in TOML
    (strings quoted, None as unset, a graph as an inline table, never a Python repr)."""
    monkeypatch.setenv("COLUMNS", "80")
    main(["attacks"])
    main(["defenses"])
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80
    assert "\n  none: no attack" in out
    assert 'direction: default "away"' in out and "z: default unset" in out
    assert 'graph: default {kind = "complete", p = 0.06' in out
    assert "GraphSpec(" not in out and "default None" not in out
