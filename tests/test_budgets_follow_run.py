"""Byzantine budgets follow the run (issue 41, item 1): an aggregator or pre-aggregator
whose ``f`` and ``fraction`` are unset takes the run's Byzantine count; one set below it
is kept and warned at load, naming the field."""

from __future__ import annotations

import warnings

import pytest
import torch

import robust_pfl
from defenses.aggregators import AGGREGATORS, BudgetedAggregator, make_aggregator
from robust_pfl.config import parse_config
from robust_pfl.experiments import byzantine_count, method_params, validate

BYZANTINE = 3


def config(*methods: dict, byzantine: dict | None = None) -> dict:
    return {
        "seeds": [0], "rounds": 3, "eval_every": 3, "batch_size": 8,
        "task": {"name": "image", "dataset": "digits", "kind": "private_label", "clusters": 2,
                 "clients_per_cluster": 6, "model": {"name": "mlp", "hidden": [16]}},
        "byzantine": byzantine or {"total": BYZANTINE},
        "attack": {"name": "alie"},
        "methods": list(methods),
    }


def params_of(data: dict) -> list:
    checked = validate(parse_config(data, "test"), "test")
    return [method_params(checked, method) for method in checked.methods]


def test_an_unset_budget_takes_the_run_byzantine_count():
    (params,) = params_of(config({"name": "global", "aggregator": "trimmed_mean"}))
    assert params.aggregator.f == BYZANTINE


def test_a_fraction_placement_counts_its_byzantine_clients():
    data = config({"name": "global", "aggregator": "krum"}, byzantine={"fraction": 0.2})
    expected = byzantine_count(parse_config(data, "test"))
    assert expected > 0
    (params,) = params_of(data)
    assert params.aggregator.f == expected


def test_inner_and_pre_aggregator_budgets_follow_the_run_too():
    (params,) = params_of(config(
        {"name": "global", "aggregator": {"name": "krum", "pre": ["nnm", {"name": "clipping", "tau": 1.0}]}},
    ))
    assert params.aggregator.inner.f == BYZANTINE
    assert params.aggregator.pre[0].f == BYZANTINE
    (bucketed,) = params_of(config({"name": "global", "aggregator": {"name": "bucketing", "inner": "trimmed_mean"}}))
    assert bucketed.aggregator.inner.f == BYZANTINE


def test_a_given_budget_is_kept():
    (params,) = params_of(config({"name": "global", "aggregator": {"name": "trimmed_mean", "fraction": 0.4}}))
    assert params.aggregator.f is None and params.aggregator.fraction == 0.4


def test_a_budget_below_the_count_is_warned_naming_its_field():
    data = config({"name": "global", "aggregator": {"name": "krum", "f": 1, "pre": [{"name": "nnm", "f": 2}]}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (params,) = params_of(data)
    messages = [str(w.message) for w in caught]
    assert params.aggregator.inner.f == 1  # kept
    assert any("methods[0].aggregator.f" in m and "below the run's 3 Byzantine" in m for m in messages), messages
    assert any("methods[0].aggregator.pre[0].f" in m for m in messages), messages


def test_a_budget_at_the_count_is_not_warned():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        params_of(config({"name": "global", "aggregator": {"name": "krum", "f": BYZANTINE}}))


def test_a_run_with_the_budget_unset_equals_the_run_with_f_set_to_the_count():
    def values(aggregator) -> list[float]:
        frame = robust_pfl.run(config({"name": "global", "aggregator": aggregator}), progress=False)
        return frame.sort_values(["round", "metric"])["value"].tolist()

    unset = values("trimmed_mean")
    assert unset == values({"name": "trimmed_mean", "f": BYZANTINE})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert unset != values({"name": "trimmed_mean", "f": 1})  # the old silent default would differ


@pytest.mark.parametrize("name", sorted(n for n, cls in AGGREGATORS.items() if issubclass(cls, BudgetedAggregator)))
def test_every_budgeted_aggregator_runs_with_the_budget_of_a_clean_run(name):
    """A run without Byzantine clients sets ``f = 0``; every budgeted rule accepts it
    and gives a finite aggregate."""
    aggregator = make_aggregator(name).with_run_budget(0)
    assert aggregator.f == 0
    messages = torch.randn(2, 9, 5, generator=torch.Generator().manual_seed(0))
    out = aggregator(messages, generator=torch.Generator().manual_seed(1))
    assert out.shape == (2, 5) and bool(torch.isfinite(out).all())
