"""Means within groups of rows, which the clustered defenses share (which rows are
usable, and distances between rows, are the row floor's:
:mod:`robust_pfl.engine.rows`, shared with the attacks).

Every function is batched over leading dimensions where its docstring says so, and
treats a row with a NaN or infinite coordinate (or an overflowing squared norm) as
*inadmissible*: such a row never enters a mean or a distance that a caller trusts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from robust_pfl.engine.rows import admissible_points


def group_mean(messages: Tensor, groups: Tensor, count: int, include: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Mean of ``messages[N, d]`` within each group id in ``[0, count)``.

    Returns ``(means[count, d], sizes[count])``; empty groups get a zero mean.  Rows
    where ``include`` is False are left out.  One matrix product, no loop.
    """
    onehot = torch.nn.functional.one_hot(groups, count).to(messages.dtype).T  # [count, N]
    if include is not None:
        onehot = onehot * include.to(messages.dtype)
    sizes = onehot.sum(-1)
    sums = onehot @ messages
    # A row in no group adds 0 * x: exact zeros unless x is NaN or infinite (0 * inf is
    # NaN), which then shows in the sums; only then are such rows masked and summed again.
    used = onehot.sum(0) > 0
    if not bool(used.all()) and not bool(torch.isfinite(sums).all()):
        sums = onehot @ torch.where(used.unsqueeze(-1), messages, torch.zeros_like(messages))
    return sums / sizes.clamp_min(1).unsqueeze(-1), sizes


def admissible_group_mean(messages: Tensor, groups: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """Mean of the admissible rows of ``messages[..., N, d]`` within each group id in
    ``[0, count)``: ``(means[..., count, d], sizes[..., count])``, ``sizes`` counting
    admissible rows only; groups without one get a zero mean.  Batched over leading
    dimensions (an attack's probe), unlike ``group_mean``'s ``include``."""
    admissible = admissible_points(messages)  # [..., N]
    onehot = torch.nn.functional.one_hot(groups, count).to(messages.dtype).T  # [count, N]
    weights = onehot * admissible.unsqueeze(-2).to(messages.dtype)  # [..., count, N]
    # a zeroed copy only when a row is inadmissible (0 * NaN would leak into the sums)
    clean = messages if bool(admissible.all()) else torch.where(admissible.unsqueeze(-1), messages, 0.0)
    sizes = weights.sum(-1)
    return (weights @ clean) / sizes.clamp_min(1).unsqueeze(-1), sizes
