"""Evaluation metrics on stacked per-client predictions (no loop over clients)."""

from __future__ import annotations

import torch
from torch import Tensor


def accuracy(log_probs: Tensor, targets: Tensor) -> Tensor:
    """Per-client accuracy ``[N]`` of ``log_probs[N, b, C]`` against ``targets[N, b]``."""
    return (log_probs.argmax(-1) == targets.long()).to(log_probs.dtype).mean(-1)


def attack_success_rate(log_probs: Tensor, targets: Tensor, target: int) -> Tensor:
    """Per-client backdoor attack success rate ``[N]``: of each client's samples whose
    true label ``targets[N, b]`` is not ``target``, the fraction that ``log_probs[N, b,
    C]`` (predictions on the triggered images) assigns to ``target``; NaN for a client
    without such a sample."""
    eligible = targets.long() != target
    hits = (log_probs.argmax(-1) == target) & eligible
    return hits.sum(-1).to(log_probs.dtype) / eligible.sum(-1).to(log_probs.dtype)


def negative_log_likelihood(log_probs: Tensor, targets: Tensor) -> Tensor:
    """Per-client mean cross-entropy ``[N]`` of predicted log-probabilities."""
    picked = torch.gather(log_probs, -1, targets.long().unsqueeze(-1)).squeeze(-1)
    return -picked.mean(-1)


def adjusted_rand_index(truth: Tensor, predicted: Tensor) -> float:
    """Adjusted Rand index (Hubert & Arabie 1985) of two labelings of the same items.

    1 for identical partitions (up to relabelling), about 0 for independent ones.
    Computed from the contingency table (one ``bincount``).  Two single-cluster (or
    all-singleton) partitions that agree give 1.
    """
    if truth.shape != predicted.shape or truth.dim() != 1:
        raise ValueError(f"labelings must be 1-D of equal length, got {tuple(truth.shape)}, {tuple(predicted.shape)}")
    n = truth.numel()
    if n < 2:
        return 1.0
    _, a = torch.unique(truth, return_inverse=True)
    _, b = torch.unique(predicted, return_inverse=True)
    cols = int(b.max()) + 1
    table = torch.bincount(a * cols + b, minlength=(int(a.max()) + 1) * cols).double()
    table = table.reshape(-1, cols)

    def pairs(x: Tensor) -> Tensor:
        return (x * (x - 1) / 2).sum()

    index = pairs(table)
    rows, columns = pairs(table.sum(1)), pairs(table.sum(0))
    total = n * (n - 1) / 2
    expected = rows * columns / total
    maximum = (rows + columns) / 2
    if float(maximum - expected) == 0.0:
        return 1.0 if float(index - expected) == 0.0 else 0.0
    return float((index - expected) / (maximum - expected))
