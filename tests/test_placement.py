"""Byzantine placement: counts, fractions and chosen clusters (issue: attack library,
"both '50 Byzantine per cluster' (paper text) and '50 in total' (official code) must
be expressible")."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from robust_pfl.config import ConfigError, parse_config
from robust_pfl.engine.placement import ByzantinePlacement


def per_cluster(ids: torch.Tensor, byzantine: torch.Tensor, clusters: int) -> list[int]:
    return torch.bincount(ids[byzantine], minlength=clusters).tolist()


def test_paper_text_and_official_code_placements():
    ids, byz = ByzantinePlacement(per_cluster=50).place(4, 50)
    assert per_cluster(ids, byz, 4) == [50, 50, 50, 50]
    ids, byz = ByzantinePlacement(total=50).place(4, 50)
    assert sorted(per_cluster(ids, byz, 4)) == [12, 12, 13, 13]
    assert int(byz.sum()) == 50 and ids.numel() == 250


def test_total_restricted_to_chosen_clusters():
    ids, byz = ByzantinePlacement(total=5, clusters=(2,)).place(3, 4)
    assert per_cluster(ids, byz, 3) == [0, 0, 5]
    with pytest.raises(ValueError, match="byzantine.clusters"):
        ByzantinePlacement(total=1, clusters=(3,)).place(3, 4)


@settings(max_examples=40, deadline=None)
@given(
    clusters=st.integers(1, 6),
    honest=st.integers(1, 30),
    fraction=st.floats(0.0, 0.6),
)
def test_fraction_is_share_of_all_clients(clusters, honest, fraction):
    ids, byz = ByzantinePlacement(fraction=fraction).place(clusters, honest)
    total = ids.numel()
    # rounding the count to the nearest integer: within half a client of the target
    assert abs(int(byz.sum()) - fraction * total) <= 0.5 / (1 - fraction) + 1e-9
    # honest clients are exactly `honest` per cluster, in cluster order, first
    assert torch.equal(ids[~byz], torch.arange(clusters).repeat_interleave(honest))


def test_fraction_per_cluster():
    ids, byz = ByzantinePlacement(fraction_per_cluster=0.2).place(4, 40)
    assert per_cluster(ids, byz, 4) == [10, 10, 10, 10]  # 10 / (40 + 10) = 0.2


@pytest.mark.parametrize(
    "field,value", [("total", -1), ("per_cluster", -2), ("fraction", 1.0), ("fraction_per_cluster", -0.1)]
)
def test_invalid_placement_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"byzantine.{field}"):
        ByzantinePlacement(**{field: value})


def test_config_rejects_unknown_byzantine_cluster():
    data = {"methods": [{"name": "local"}], "task": {"clusters": 2}, "byzantine": {"total": 1, "clusters": [5]}}
    with pytest.raises(ConfigError, match="byzantine.clusters"):
        parse_config(data)


def test_config_fraction_builds_expected_placement():
    config = parse_config({"methods": [{"name": "local"}], "byzantine": {"fraction": 0.2}})
    assert config.byzantine.placement() == ByzantinePlacement(fraction=0.2)


@settings(max_examples=60, deadline=None)
@given(total=st.integers(0, 30), per=st.integers(0, 5), fraction=st.sampled_from([0.0, 0.1, 0.3]),
       fraction_per=st.sampled_from([0.0, 0.2]), clusters=st.integers(1, 6), honest=st.integers(1, 12),
       chosen=st.sampled_from([None, (0,), (0, 1)]))
def test_total_count_is_the_sum_of_the_counts(total, per, fraction, fraction_per, clusters, honest, chosen):
    """The arithmetic count config validation uses equals the per-cluster counts' sum,
    and both refuse the same out-of-range target clusters."""
    placement = ByzantinePlacement(total=total, per_cluster=per, fraction=fraction,
                                   fraction_per_cluster=fraction_per, clusters=chosen)
    if chosen is not None and max(chosen) >= clusters:
        for count in (placement.counts, placement.total_count):
            with pytest.raises(ValueError, match="byzantine.clusters"):
                count(clusters, honest)
        return
    assert placement.total_count(clusters, honest) == int(placement.counts(clusters, honest).sum())
