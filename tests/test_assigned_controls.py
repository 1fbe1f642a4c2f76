"""The clustering controls (theory_checks.assigned_controls): the assignments that replace
Threshold-Clustering, and Alg. 4's momentum step under a given assignment, checked by
hand on the separated family's ramps."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from theory_checks.assigned_controls import ASSIGNMENTS, AssignedMomentum, schedule
from theory_checks.separated_instance import SeparatedSizes, ramp_directions, separated_problem


@settings(deadline=None, max_examples=50)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4), groups=st.integers(1, 4))
def test_the_wrong_partition_gives_every_group_an_equal_share_of_every_cluster(sizes, groups):
    """Client j of a cluster goes to group j mod K: the group sizes within a cluster
    differ by at most one, so no group is a cluster (where a cluster has K or more
    clients), and the partition is the same at every round."""
    clusters = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    wrong = schedule("wrong", clusters, groups, torch.Generator().manual_seed(0))
    assert torch.equal(wrong(0), wrong(7))
    for label, size in enumerate(sizes):
        counts = torch.bincount(wrong(0)[clusters == label], minlength=groups)
        assert int(counts.max() - counts.min()) <= 1
        assert int(counts.sum()) == size


def test_no_clustering_is_one_group_and_random_is_seeded_and_fresh_each_round():
    clusters = torch.arange(2).repeat_interleave(8)
    assert torch.equal(schedule("none", clusters, 2, torch.Generator())(3), torch.zeros(16, dtype=torch.long))
    first = schedule("random", clusters, 2, torch.Generator().manual_seed(5))
    again = schedule("random", clusters, 2, torch.Generator().manual_seed(5))
    rounds = [first(t) for t in range(4)]
    assert all(torch.equal(a, again(t)) for t, a in enumerate(rounds))
    assert not all(torch.equal(rounds[0], r) for r in rounds[1:])
    assert all(int(r.min()) >= 0 and int(r.max()) < 2 for r in rounds)
    with pytest.raises(ValueError, match="assignment must be one of"):
        schedule("nearest", clusters, 2, torch.Generator())  # type: ignore[arg-type]


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_two_steps_by_hand(assignment):
    """Noise-free ramps, full batches: round 1 (alpha 1) sets m_i = grad f_i(x_0) =
    sigmoid(<u_k, x_0>) u_k; each group steps by eta times its members' mean momentum.
    Round 2 blends m_i = (1 - alpha) m_i + alpha grad f_i(x_1)."""
    problem = separated_problem(SeparatedSizes(noise=0.0, batch_size=40))
    eta, alpha, horizon = 0.3, 0.25, 64
    federation = problem.federation(horizon, 0, eta)
    groups = schedule(assignment, problem.cluster_ids, 2, federation.rng("control"))
    expected_groups = schedule(assignment, problem.cluster_ids, 2, federation.rng("control"))
    control = AssignedMomentum(federation, eta, alpha, groups, 2, first_alpha=1.0)
    directions = ramp_directions(problem.sizes.dim)[problem.cluster_ids]  # [N, d]
    models = problem.start(horizon, eta).expand(problem.cluster_ids.numel(), -1).clone()
    momenta = torch.zeros_like(models)
    for round_index, weight in ((0, 1.0), (1, alpha)):
        slopes = torch.sigmoid((directions * models).sum(-1, keepdim=True))
        momenta = (1 - weight) * momenta + weight * slopes * directions
        chosen = expected_groups(round_index)
        means = torch.stack([momenta[chosen == g].mean(0) if bool((chosen == g).any()) else torch.zeros(5,
                             dtype=torch.float64) for g in range(2)])
        models = models - eta * means[chosen]
        record = control.step(round_index)
        torch.testing.assert_close(record.momenta, momenta)
        torch.testing.assert_close(control.client_models(), models)


def test_a_shared_model_stalls_on_the_opposed_ramps():
    """No clustering on the separated family: the anchored clients' squared gradient
    settles near 1/2 (the slope 1/sqrt 2 where the runner's pull balances theirs), far
    from the 0 a clustered model reaches."""
    problem = separated_problem(SeparatedSizes(noise=0.0, batch_size=40))
    horizon, eta = 400, 0.5
    federation = problem.federation(horizon, 0, eta)
    control = AssignedMomentum(federation, eta, 0.9, schedule("none", problem.cluster_ids, 2, torch.Generator()), 2)
    for round_index in range(horizon):
        control.step(round_index)
    anchored = control.client_models()[problem.anchored]
    slope = torch.sigmoid(anchored[:, 0])
    torch.testing.assert_close(slope, torch.full_like(slope, math.sqrt(0.5)), atol=1e-3, rtol=0)
