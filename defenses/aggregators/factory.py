"""The one place a config's aggregator spec becomes an aggregator: a registered name,
a table with ``name`` and options, and a ``pre`` list of pre-aggregators in front
(:mod:`defenses.aggregators.preaggregation`)."""

from __future__ import annotations

from typing import Mapping

from defenses.aggregators.base import AGGREGATORS, Aggregator, AggregatorSpec
from defenses.aggregators.preaggregation import pre_aggregated
from robust_pfl.engine.registry import check_options, did_you_mean, init_parameters


def make_aggregator(spec: AggregatorSpec) -> Aggregator:
    """An aggregator from a name (``"median"``), a mapping with ``name`` and options
    (``{"name": "trimmed_mean", "f": 2}``) or an instance (returned as is).  Unknown
    names or options raise ``ValueError`` naming them.  A mapping's ``pre`` key (a
    list of pre-aggregators, :mod:`defenses.aggregators.preaggregation`) puts them in front:
    ``{"name": "krum", "pre": ["nnm"]}`` is Krum applied after NNM."""
    if isinstance(spec, Aggregator):
        return spec
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("name", None)
        if "pre" in options:
            pre = options.pop("pre")
            inner = make_aggregator({**options, "name": name})
            return pre_aggregated(inner, pre, where=f"{name}.pre")
    else:
        raise ValueError(
            f"aggregator must be a name or a mapping with 'name', got {spec!r}; "
            f"names: {sorted(AGGREGATORS)}"
        )
    if not isinstance(name, str) or name not in AGGREGATORS:
        hint = did_you_mean(name, AGGREGATORS) if isinstance(name, str) else ""
        raise ValueError(f"aggregator.name must be one of {sorted(AGGREGATORS)}, got {name!r}{hint}")
    check_options(name, f"aggregator {name!r}", options, init_parameters(AGGREGATORS[name]))
    return AGGREGATORS[name](**options)
