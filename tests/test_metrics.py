"""Metrics: accuracy/NLL by hand, ARI against scikit-learn (an independent reference)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from robust_pfl.engine.metrics import accuracy, adjusted_rand_index, negative_log_likelihood


def test_accuracy_and_nll_by_hand():
    log_probs = torch.log(torch.tensor([[[0.7, 0.3], [0.4, 0.6]], [[0.5, 0.5], [0.9, 0.1]]]))
    targets = torch.tensor([[0, 0], [1, 0]])
    assert accuracy(log_probs, targets).tolist() == [0.5, 0.5]  # ties go to the first class
    expected = [-(math.log(0.7) + math.log(0.4)) / 2, -(math.log(0.5) + math.log(0.9)) / 2]
    assert torch.allclose(negative_log_likelihood(log_probs, targets), torch.tensor(expected))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5)), min_size=2, max_size=40))
def test_ari_matches_scikit_learn(pairs):
    truth = torch.tensor([p[0] for p in pairs])
    predicted = torch.tensor([p[1] for p in pairs])
    assert math.isclose(adjusted_rand_index(truth, predicted), adjusted_rand_score(truth, predicted), abs_tol=1e-12)


def test_ari_is_one_for_relabelled_partition():
    truth = torch.tensor([0, 0, 1, 1, 2, 2])
    assert adjusted_rand_index(truth, torch.tensor([5, 5, 3, 3, 9, 9])) == 1.0
