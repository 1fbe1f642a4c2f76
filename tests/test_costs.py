"""A run's cost estimated at load (issue 32): a warning with the estimate for a run past
a day, none for the quick start, and options the client count cannot serve refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import defenses
from robust_pfl import costs
from robust_pfl.cli import _process_settings
from robust_pfl.config import ConfigError, load_config, parse_config
from robust_pfl.experiments import client_count, validate

ROOT = Path(__file__).resolve().parents[1]
TASK = {"name": "synthetic_linear", "clusters": 2, "clients_per_cluster": 4, "dim": 5}


def config_with(rounds: int = 10, seeds: list[int] | None = None, **method) -> dict:
    return {"rounds": rounds, "seeds": seeds or [0], "task": TASK, "methods": [{"name": "fc", **method}]}


def cost_warnings(payload: dict) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate(parse_config(payload))
    return [str(w.message) for w in caught if issubclass(w.category, costs.CostWarning)]


@pytest.mark.parametrize("payload, unit", [
    (config_with(rounds=10**30), "years"),
    (config_with(clustering_rounds=10**9), "days"),
    (config_with(rounds=10**9), "days"),
])
def test_a_run_past_a_day_is_warned_with_its_estimate(payload, unit):
    found = cost_warnings(payload)
    assert len(found) == 1 and unit in found[0] and "FLOPs" in found[0], found


def test_the_quick_start_gets_no_cost_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", costs.CostWarning)
        validate(load_config(ROOT / "configs" / "quickstart.toml"))


@settings(max_examples=30, deadline=None)
@given(rounds=st.integers(1, 10**6), seeds=st.integers(1, 5), factor=st.integers(2, 50))
def test_the_estimate_is_linear_in_rounds_and_seeds(rounds, seeds, factor):
    """Every round of every seed costs the same, so the estimate scales exactly."""
    def estimate(r: int, s: int) -> tuple[float, float]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", costs.CostWarning)  # long ones are drawn too
            config = validate(parse_config(config_with(rounds=r, seeds=list(range(s)))))
        params = [defenses.REGISTRY["fc"].Params(**config.methods[0].options())]
        return costs.estimated_cost(config, params, client_count(config), TASK["dim"], 9)
    flops, seconds = estimate(rounds, seeds)
    more_flops, more_seconds = estimate(rounds * factor, seeds)
    assert more_flops == pytest.approx(factor * flops) and more_seconds == pytest.approx(factor * seconds)
    assert estimate(rounds, seeds + 1)[1] == pytest.approx(seconds * (seeds + 1) / seeds)


def test_more_clustering_rounds_and_groups_cost_more():
    def seconds(**method) -> float:
        config = validate(parse_config(config_with(**method)))
        params = [defenses.REGISTRY["fc"].Params(**config.methods[0].options())]
        return costs.estimated_cost(config, params, client_count(config), TASK["dim"], 9)[1]
    assert seconds(clustering_rounds=100) > seconds(clustering_rounds=10)
    assert seconds(groups=1) > seconds(groups=4)  # fewer, larger groups: more cross gradients


def test_a_global_aggregators_own_work_counts():
    """SMEA at C(40, 5) = 658,008 subsets of 35 rows a round: days for 10^4 rounds,
    warned; the mean over the same rounds is not."""
    task = TASK | {"clients_per_cluster": 20}
    def payload(aggregator):
        return {"rounds": 10_000, "task": task, "methods": [{"name": "global", "aggregator": aggregator}]}
    found = cost_warnings(payload({"name": "smea", "f": 5}))
    assert len(found) == 1 and "days" in found[0], found
    assert cost_warnings(payload("mean")) == []


def test_fc_groups_past_the_client_count_are_refused_at_load():
    with pytest.raises(ConfigError) as error:
        validate(parse_config(config_with(groups=10**6)))
    assert "methods[0].groups: must be at most the number of clients" in str(error.value)
    assert "N = 8" in str(error.value)
    validate(parse_config(config_with(groups=8)))  # one client a group is fine


def test_the_cli_prints_a_cost_warning_as_one_line():
    with _process_settings(1, quiet=True):
        text = warnings.formatwarning("this run would take 3 days", costs.CostWarning, "cli.py", 21, "source")
        other = warnings.formatwarning("x", RuntimeWarning, "grid.py", 3, "the source line")
    assert text == "warning: this run would take 3 days\n"
    assert "RuntimeWarning" in other  # other warnings keep Python's format
    assert warnings.formatwarning("x", costs.CostWarning, "f.py", 1, None).startswith("f.py:1")  # restored
