"""The one place a config's aggregator spec becomes an aggregator: a registered name,
a table with ``name`` and options, and a ``pre`` list of pre-aggregators in front
(:mod:`defenses.aggregators.preaggregation`)."""

from __future__ import annotations

from defenses.aggregators.base import AGGREGATORS, Aggregator, AggregatorSpec
from defenses.aggregators.preaggregation import pre_aggregated
from robust_pfl.engine.registry import check_options, init_parameters, named_spec


def make_aggregator(spec: AggregatorSpec) -> Aggregator:
    """An aggregator from a name (``"median"``), a mapping with ``name`` and options
    (``{"name": "trimmed_mean", "f": 2}``) or an instance (returned as is).  Unknown
    names or options raise ``ValueError`` naming them.  A mapping's ``pre`` key (a
    list of pre-aggregators, :mod:`defenses.aggregators.preaggregation`) puts them in front:
    ``{"name": "krum", "pre": ["nnm"]}`` is Krum applied after NNM."""
    if isinstance(spec, Aggregator):
        return spec
    name, options = named_spec(spec, AGGREGATORS, "aggregator")
    if "pre" in options:
        pre = options.pop("pre")
        return pre_aggregated(make_aggregator({**options, "name": name}), pre, where=f"{name}.pre")
    check_options(name, f"aggregator {name!r}", options, init_parameters(AGGREGATORS[name]))
    return AGGREGATORS[name](**options)
