"""FLAME's clustering substitute against scikit-learn's HDBSCAN as FLAME configures
it (min_cluster_size = n // 2 + 1, min_samples = 1, one cluster allowed), on cosine
distances: the rows the substitute admits are always a subset of HDBSCAN's; without
tied distances they are the same rows, and where rows join the majority cluster at
the distance that made it one, HDBSCAN admits them and the substitute does not (the
caveat in defenses.aggregators.filtering.Flame's docstring)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.cluster import HDBSCAN

from defenses.aggregators.filtering import largest_cluster
from robust_pfl.engine.rows import Rows, agglomerate, cosine_distances

pytestmark = pytest.mark.usefixtures("single_thread")


def admitted(rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(substitute's, HDBSCAN's)`` admitted rows, as bool masks."""
    n = rows.shape[0]
    every = torch.ones(n, dtype=torch.bool)
    distances = cosine_distances(Rows(rows, every, every.sum()))
    labels, sizes = agglomerate(distances, every, "single", need=torch.tensor(n // 2 + 1))
    ours = largest_cluster(labels, sizes).numpy()
    matrix = distances.numpy().clip(min=0)
    np.fill_diagonal(matrix, 0)
    found = HDBSCAN(min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed", allow_single_cluster=True,
                    copy=True).fit(matrix).labels_
    theirs = found == np.bincount(found[found >= 0]).argmax() if (found >= 0).any() else np.zeros(n, bool)
    return ours, theirs


def on_circle(angles) -> torch.Tensor:
    return torch.tensor([[math.cos(a), math.sin(a)] for a in angles], dtype=torch.float64)


def test_without_ties_the_substitute_admits_hdbscans_rows():
    for seed in range(40):
        rng = np.random.default_rng(seed)
        n, d = int(rng.integers(5, 14)), int(rng.integers(2, 6))
        rows = torch.tensor(rng.normal(size=(n, d)) + rng.normal(size=d) * rng.uniform(0, 3))
        ours, theirs = admitted(rows)
        assert (ours == theirs).all(), seed


def test_with_ties_the_substitute_admits_a_subset_of_hdbscans_rows():
    """Angles on a coarse lattice tie many cosine distances; some of these cases admit
    strictly fewer rows than HDBSCAN, none admits a row HDBSCAN leaves out."""
    fewer = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(4, 14))
        ours, theirs = admitted(on_circle(rng.integers(0, 12, size=n) * (math.pi / 24)))
        assert not (ours & ~theirs).any(), seed
        fewer += int((theirs & ~ours).any())
    assert fewer > 0


def test_a_row_tied_with_the_majority_forming_merge_is_admitted_by_hdbscan_only():
    """Rows at angles 0, 0, 0.3, -0.3, 0.6 (and two far ones): the fourth row (of 7,
    the majority) joins at distance 1 - cos(0.3), as does the row at 0.6."""
    ours, theirs = admitted(on_circle([0, 0, 0.3, -0.3, 0.6, 2.5, 3.0]))
    assert ours.tolist() == [True, True, True, True, False, False, False]
    assert theirs.tolist() == [True, True, True, True, True, False, False]
