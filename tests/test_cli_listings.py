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


def test_defenses_listing_shows_config_names_of_aliased_parameters(capsys):
    main(["defenses"])
    assert "      lambda: default 1.0" in capsys.readouterr().out  # Ditto's `lam` field
