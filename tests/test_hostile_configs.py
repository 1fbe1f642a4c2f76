"""Hostile run configs, generated: random types and values (huge, non-finite, nested,
misspelled) in the options of every registered method, attack and aggregator.  Each
either fails at load with a config error naming its field, is warned at load as a run
past a day (and not run), or runs to the end; never a traceback of another kind
(issue 32's property)."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import attacks
import defenses
import robust_pfl
from robust_pfl.config import ConfigError, parse_config
from robust_pfl.costs import CostWarning
from robust_pfl.experiments import validate

pytestmark = pytest.mark.usefixtures("single_thread")

NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, -1, 10**9, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e38, 1e39, 1e308, -1e308, 5e-324, 0.5]),
)
SCALARS = st.one_of(NUMBERS, st.booleans(), st.text(max_size=8), st.sampled_from(["none", "median", "quantile"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)


def options_of(fields: list[str]) -> st.SearchStrategy[dict]:
    """Some of ``fields`` (and sometimes a misspelled one) with hostile values."""
    keys = st.sampled_from(fields) if fields else st.nothing()
    return st.dictionaries(st.one_of(keys, st.text(min_size=1, max_size=6)) if fields else st.text(min_size=1, max_size=6),
                           VALUES, max_size=3)


@st.composite
def hostile_configs(draw) -> dict:
    method = draw(st.sampled_from(sorted(defenses.REGISTRY)))
    params = [name for name, info in defenses.REGISTRY[method].Params.model_fields.items()
              for name in [info.alias or name]]
    options = draw(options_of(params))
    if method == "global" and draw(st.booleans()):
        aggregator = draw(st.sampled_from(sorted(defenses.AGGREGATORS)))
        fields = list(defenses.aggregators.describe(defenses.AGGREGATORS[aggregator])["parameters"])
        options["aggregator"] = {"name": aggregator, **draw(options_of(fields))}
    attack = draw(st.sampled_from(["none", *sorted(attacks.REGISTRY)]))
    attack_fields = [] if attack == "none" else list(attacks.describe(attacks.REGISTRY[attack])["parameters"])
    return {
        "seeds": [0], "rounds": 2, "eval_every": 1,
        "task": {"clusters": 2, "clients_per_cluster": 2, "dim": 3, "samples_per_client": 4,
                 "validation_samples": 2, "test_samples": 2},
        "byzantine": {"total": draw(st.sampled_from([0, 1, 2]))},
        "attack": {"name": attack, **draw(options_of(attack_fields))},
        "methods": [{"name": method, **options}],
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_configs())
def test_a_hostile_config_is_refused_naming_its_field_or_runs_to_the_end(config):
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CostWarning)
            checked = validate(parse_config(config))
    except ConfigError as error:
        lines = str(error).splitlines()
        assert lines[0].startswith("invalid config") and len(lines) >= 2, str(error)
        assert all(line.startswith("  ") and ":" in line for line in lines[1:]), str(error)
        event("refused at load")
        return
    if any(issubclass(w.category, CostWarning) for w in caught):
        event("warned as longer than a day")  # valid, and not run here: it would take that long
        return
    event("ran")
    frame = robust_pfl.run(checked, progress=False)
    assert set(frame["round"]) >= {0, 2}
