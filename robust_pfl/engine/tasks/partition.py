"""Dealing a data set's samples to clients: seeded, disjoint, vectorised.

Every image task deals samples the same way.  The source samples are divided into
*groups* (``groups[M]``: one pool for rotation tasks, one pool per cluster for label
skew, one per label for Dirichlet skew; ``-1`` marks a sample no client may take) and
every client ``c`` takes ``quotas[c, g]`` samples of group ``g``.  :func:`deal` draws
them without replacement from a seeded permutation, so no sample reaches two clients.

Two dealing rules place a client's samples in the permuted pool of each group:

* ``"fixed"``: client ``c`` takes a contiguous run (clients in order), i.e. with one
  group of ``M`` samples and ``n`` per client, client ``c`` holds
  ``perm[c * n : (c + 1) * n]``;
* ``"official"``: the dealing of Werner et al.'s official code: client ``r`` of ``N``
  takes every ``N``-th index from position ``r``, i.e. ``perm[r::N][:n]``.  With
  unequal quotas (Dirichlet skew) it is the round-robin over the clients that still
  need a sample of that group.

Both give uniformly random disjoint shards; they differ only in which shard a given
permutation produces.  All work is tensor operations: no Python loop over clients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from robust_pfl.engine.seeding import stream_seed

Rule = Literal["fixed", "official"]
RULES: tuple[str, ...] = ("fixed", "official")


def deal(groups: Tensor, quotas: Sequence[Tensor], generator: torch.Generator, rule: Rule = "fixed") -> list[Tensor]:
    """Deal source samples to clients in one or more parts (e.g. train and validation).

    Args:
        groups: ``[M]`` int64 group of every source sample, ``-1`` for excluded ones.
        quotas: one ``[N, G]`` int64 matrix per part: client ``c`` takes
            ``quotas[p][c, g]`` samples of group ``g`` for part ``p``.  Every row of a
            part must have the same sum ``n_p`` (equal samples per client).
        generator: the seeded stream of the one random permutation drawn.
        rule: ``"fixed"`` or ``"official"`` (module docstring).  The parts of a client
            are carved from its *share* (the sum of its quotas): within each group
            its first ``quotas[0][c, g]`` samples go to part 0, the next to part 1...

    Returns:
        One ``[N, n_p]`` tensor of source indices per part; all indices are distinct.

    Raises:
        ValueError: a part with unequal row sums, an unknown rule, or more samples of
            a group asked for than it holds.
    """
    if rule not in RULES:
        raise ValueError(f"partition must be one of {list(RULES)}, got {rule!r}")
    stacked = torch.stack([q.long() for q in quotas])  # [P, N, G]
    parts, clients, num_groups = stacked.shape
    per_part = stacked.sum(2)  # [P, N]
    if (per_part != per_part[:, :1]).any():
        raise ValueError("every client must take the same number of samples in each part")
    share = stacked.sum(0)  # [N, G]
    n = int(per_part[:, 0].sum()) if clients else 0
    available = torch.bincount(groups[groups >= 0], minlength=num_groups)[:num_groups]
    demand = share.sum(0)
    short = (demand > available).nonzero().flatten()
    if short.numel():
        g = int(short[0])
        raise ValueError(f"group {g} holds {int(available[g])} samples but {int(demand[g])} are asked for")

    # The pooled source: excluded samples dropped, grouped, random order within a group.
    perm = torch.randperm(groups.numel(), generator=generator)
    perm = perm[groups[perm] >= 0]
    pooled = perm[torch.argsort(groups[perm], stable=True)]
    pool_start = available.cumsum(0) - available

    # Slots: client c's row lists its groups in order, group g repeated share[c, g] times.
    slot_group = torch.arange(num_groups).repeat(clients).repeat_interleave(share.reshape(-1)).reshape(clients, n)
    rows = torch.arange(clients).unsqueeze(1)
    within = torch.arange(n).unsqueeze(0) - (share.cumsum(1) - share)[rows, slot_group]  # j: rank in (c, g)
    owner = rows.expand(clients, n)
    if rule == "fixed":
        key = (slot_group * clients + owner) * n + within
    else:
        key = (slot_group * n + within) * clients + owner
    order = torch.argsort(key.reshape(-1))
    sorted_group = slot_group.reshape(-1)[order]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel()) - (demand.cumsum(0) - demand)[sorted_group]
    index = pooled[pool_start[slot_group] + rank.reshape(clients, n)]

    bounds = stacked.cumsum(0)[:, rows, slot_group]  # [P, N, n]: end of each part in (c, g)
    part_of = (within.unsqueeze(0) >= bounds).sum(0)
    return [index[part_of == p].reshape(clients, int(per_part[p, 0])) for p in range(parts)]


def largest_remainder(total: int, proportions: Tensor) -> Tensor:
    """Integer quotas ``[N, G]`` summing to ``total`` per row, closest to
    ``total * proportions`` (Hamilton's largest-remainder rounding; ties to the lower
    group index).  ``proportions`` rows must sum to 1."""
    weights = proportions.double()
    exact = total * weights / weights.sum(1, keepdim=True)
    quotas = exact.floor().long()
    missing = total - quotas.sum(1, keepdim=True)
    remainder_rank = torch.argsort(torch.argsort(-(exact - quotas), dim=1, stable=True), dim=1)
    return quotas + (remainder_rank < missing).long()


def fits(quotas: Sequence[Tensor], available: Tensor) -> bool:
    """Whether the parts' ``quotas[N, G]`` together ask no group for more than it holds."""
    return bool((sum(q.sum(0) for q in quotas) <= available).all())


def largest_share(available: Tensor, proportions: Tensor, sizes: Callable[[int], Sequence[int]]) -> int:
    """The largest share ``n`` per client whose parts ``sizes(n)`` (e.g. ``(train,
    validation)``), rounded by :func:`largest_remainder` against ``proportions[N, G]``,
    fit in ``available[G]``; 0 if none does.

    Starts from the continuous bound ``min_g available[g] / sum_c proportions[c, g]``
    and steps down until the rounded quotas fit.
    """
    demand = proportions.double().sum(0)
    used = demand > 0
    if not used.any():
        return 0
    bound = int((available[used].double() / demand[used]).min().floor())
    for n in range(bound, 0, -1):
        parts = sizes(n)
        if min(parts) >= 0 and fits([largest_remainder(s, proportions) for s in parts], available):
            return n
    return 0


def group_sizes(groups: Tensor, num_groups: int) -> Tensor:
    """Samples per group ``[G]`` (``-1`` excluded)."""
    return torch.bincount(groups[groups >= 0], minlength=num_groups)[:num_groups]


def label_sets(clusters: int, labels_per_cluster: int, num_classes: int) -> Tensor:
    """Membership ``[K, C]`` (bool) of the label-skew task: cluster ``k`` holds labels
    ``(k * L + j) mod C`` for ``j < L``.  When ``K * L <= C`` these are the disjoint
    ranges ``[k * L, (k + 1) * L)`` (Werner et al. Sec. 4.2: CIFAR-100 with 10 labels
    per cluster); otherwise consecutive sets wrap around and overlap."""
    held = (torch.arange(clusters).unsqueeze(1) * labels_per_cluster + torch.arange(labels_per_cluster)) % num_classes
    membership = torch.zeros(clusters, num_classes, dtype=torch.bool)
    membership[torch.arange(clusters).unsqueeze(1), held] = True
    return membership


def label_skew_groups(labels: Tensor, membership: Tensor, generator: torch.Generator) -> Tensor:
    """The owning cluster of every sample ``[M]`` (``-1``: its label belongs to no
    cluster).  A label held by several clusters (overlapping sets) is split between
    them round-robin over a seeded random order, so the pools stay disjoint."""
    num_classes = membership.shape[1]
    holders = membership.sum(0)  # [C]
    perm = torch.randperm(labels.numel(), generator=generator)
    by_label = perm[torch.argsort(labels[perm], stable=True)]
    counts = torch.bincount(labels, minlength=num_classes)
    rank = torch.empty_like(labels)
    rank[by_label] = torch.arange(labels.numel()) - (counts.cumsum(0) - counts)[labels[by_label]]
    table = torch.argsort((~membership).T.to(torch.int8), dim=1, stable=True)  # [C, K]: holders first
    count = holders[labels]
    owner = table[labels, rank % count.clamp(min=1)]
    return torch.where(count > 0, owner, torch.full_like(owner, -1))


def dirichlet_proportions(clusters: int, num_classes: int, alpha: float, seed: int) -> Tensor:
    """Label proportions ``[K, C]`` (float64): one ``Dirichlet(alpha * 1_C)`` draw per
    cluster (Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for
    Federated Visual Classification", 2019, with a uniform prior), from a numpy
    generator seeded by the ``"images/dirichlet"`` stream of ``seed``."""
    rng = np.random.default_rng(stream_seed(seed, "images/dirichlet"))
    return torch.from_numpy(rng.dirichlet(np.full(num_classes, alpha), size=clusters))
