"""Config checks that need the registries or the client count: they fail at load time,
naming the field, before any training."""

from __future__ import annotations

import pytest

from robust_pfl.config import ConfigError, parse_config
from robust_pfl.experiments import client_count, validate


def config(**overrides):
    data = {"task": {"clusters": 2, "clients_per_cluster": 3}, "methods": [{"name": "global"}], **overrides}
    return parse_config(data)


def test_client_count_includes_byzantine_placement():
    assert client_count(config(byzantine={"total": 1, "per_cluster": 2})) == 2 * 3 + 1 + 2 * 2


def test_krum_impossible_for_client_count_fails_at_load():
    bad = config(byzantine={"total": 1}, methods=[{"name": "global", "aggregator": {"name": "krum", "f": 3}}])
    with pytest.raises(ConfigError, match=r"methods\[0\]\.aggregator: krum.*N = 7"):
        validate(bad)


def test_feasible_krum_passes():
    good = config(byzantine={"total": 1}, methods=[{"name": "global", "aggregator": {"name": "krum", "f": 1}}])
    assert validate(good) is good


def test_data_attack_on_regression_task_fails_at_load():
    with pytest.raises(ConfigError, match="attack.name.*classification"):
        validate(config(byzantine={"total": 1}, attack={"name": "label_flip"}))


def test_bad_aggregator_name_fails_at_load():
    with pytest.raises(ConfigError, match="aggregator"):
        validate(config(methods=[{"name": "global", "aggregator": "krumm"}]))
