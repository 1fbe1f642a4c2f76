"""Federated-Clustering's random-subgroups option (Werner et al. Sec. 4, MNIST: the
clients are split into random subgroups each round and cluster within their group)."""

from __future__ import annotations

import pytest
import torch

from defenses import build
from robust_pfl import Federation
from robust_pfl.engine.tasks import SyntheticLinearRegression


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to rounding (each client starts eq. 24 from its own v0)."""
    return bool(torch.allclose(a, b, rtol=1e-10, atol=1e-10))


def _federation() -> tuple[Federation, SyntheticLinearRegression]:
    task = SyntheticLinearRegression(clusters=2, clients_per_cluster=5, dim=4, samples_per_client=3)
    built = task.build(seed=3, dtype=torch.float64)
    fed = Federation(built.objective, built.train, built.cluster_ids, built.byzantine, seed=3)
    return fed, built


@pytest.mark.parametrize(("split", "sizes"), [("balanced", [3, 3, 4]), ("chunks", [2, 4, 4])])
def test_each_client_averages_exactly_its_subgroup(split, sizes):
    """With one clustering round and a radius containing every point, eq. 24 gives
    v = v0 + (1/n_g) sum_j (z_j - v0) = the mean of the subgroup's gradients.  All
    clients start at the same model, so the gradients g_j(x_i) = g_j(x_0) do not depend
    on i, and clients of one subgroup get the same update (to rounding): the distinct updates must
    partition the 10 clients into 3 groups of sizes 4/3/3 (balanced) or 4/4/2 (chunks
    of ceil(10 / 3) = 4, the official code's), each update the mean of its members'
    gradients."""
    fed, _ = _federation()
    fc = build("fc", fed, {"lr": 1.0, "radius": 1e12, "clustering_rounds": 1, "groups": 3, "subgroup_split": split})
    start = fc.models.clone()
    record = fc.step(0)
    gradients = fed.gradients(start, fed.sample_batch())  # full batch: same data
    updates = record.updates
    groups: list[list[int]] = []
    for i in range(fed.clients):
        for group in groups:
            if _same(updates[group[0]], updates[i]):
                group.append(i)
                break
        else:
            groups.append([i])
    assert sorted(len(g) for g in groups) == sizes
    for group in groups:
        expected = gradients[group].mean(0)
        torch.testing.assert_close(updates[group[0]], expected, rtol=1e-12, atol=1e-9)


def test_subgroups_are_redrawn_each_round():
    """The partition is random per round (seeded): over several rounds at least two
    different partitions occur."""
    fed, _ = _federation()
    fc = build("fc", fed, {"lr": 1e-9, "radius": 1e12, "clustering_rounds": 1, "groups": 2})
    partitions = set()
    for t in range(6):
        updates = fc.step(t).updates
        key = frozenset(
            frozenset(j for j in range(fed.clients) if _same(updates[j], updates[i]))
            for i in range(fed.clients)
        )
        partitions.add(key)
    assert len(partitions) >= 2
