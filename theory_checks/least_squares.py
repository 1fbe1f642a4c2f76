"""Least-squares fits that are bit-reproducible.

``torch.linalg.lstsq``'s default CPU driver (LAPACK ``gelsy``, MKL in torch's CPU
builds) returns last bits that depend on where its input buffers lie in memory, so the
same fit differs between two runs of one command (a run's allocation pattern follows,
among other things, Python's hash seed). The SVD driver ``gelsd`` gives the same bits
at every buffer offset (``tests/test_least_squares.py``) and, like
``gelsy``, the minimum-norm solution when the inputs are rank-deficient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def least_squares(inputs: Tensor, targets: Tensor) -> Tensor:
    """``argmin_x ||inputs x - targets||^2`` (minimum norm): ``inputs[..., P, d]``,
    ``targets[..., P]``, the fit ``[..., d]``; batched over leading dimensions."""
    return torch.linalg.lstsq(inputs, targets.unsqueeze(-1), driver="gelsd").solution.squeeze(-1)
