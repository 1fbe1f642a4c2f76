"""An unknown method named after FedAvg, a robust aggregator or a pre-aggregator is
told which ``global`` it is; ``robust-pfl defenses`` lists the pre-aggregators; the
commands the aggregator's docstring names exist."""

from __future__ import annotations

import re

import pytest

import defenses
import robust_pfl
from defenses.base import unknown_method
from robust_pfl.cli import build_parser, main
from robust_pfl.config import ConfigError


@pytest.mark.parametrize(("name", "hint"), [
    ("fedavg", "'fedavg' is 'global': one shared model, its default aggregator 'mean' is FedAvg's"),
    ("FedAvg", "'FedAvg' is 'global'"),
    ("krum", "'krum' is a robust aggregator: name = 'global' with aggregator = 'krum'"),
    ("nnm", "'nnm' is a pre-aggregator: name = 'global' with aggregator = {name = 'mean', pre = ['nnm']}"),
    ("fcc", "(did you mean 'fc'?)"),
])
def test_an_unknown_method_gets_a_hint(name, hint):
    message = unknown_method(name)
    assert message.startswith(f"unknown method {name!r} (") and hint in message
    assert str(sorted(defenses.REGISTRY)) in message


def test_a_config_naming_fedavg_is_refused_with_the_hint():
    config = {"seeds": [0], "rounds": 1, "task": {"clusters": 2, "clients_per_cluster": 2},
              "methods": [{"name": "fedavg", "lr": 0.01}]}
    with pytest.raises(ConfigError, match=r"methods\[0\]\.name.*'fedavg' is 'global'"):
        robust_pfl.run(config, progress=False)


def test_the_defenses_listing_has_a_pre_aggregator_section(capsys):
    assert main(["defenses"]) == 0
    out = capsys.readouterr().out
    section = out.split("\nPre-aggregators (", 1)[1]
    listed = re.findall(r"^  (\w+):", section, re.M)
    assert listed == sorted(defenses.PRE_AGGREGATORS) and {"nnm", "bucketing", "clipping"} <= set(listed)
    assert "      tau: default 2.0  clipping radius" in section


def test_the_commands_the_aggregator_docstring_names_exist():
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001
    named = re.findall(r"robust-pfl (\w+)", defenses.Aggregator.__doc__ or "")
    assert named and set(named) <= commands, (named, sorted(commands))
