"""Which rows are usable at all: a row with a NaN or infinite coordinate, or whose
squared norm overflows, is *inadmissible* and never enters a mean, a distance or a
statistic that a defense or an attack trusts (Werner et al.'s aggregators assume
finite messages; Byzantine ones may be anything)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


# Dtypes computed in float32: torch.cdist lacks them, and float16 squared norms overflow.
WIDENED_DTYPES = (torch.float16, torch.bfloat16)


def squared_norms(points: Tensor) -> Tensor:
    """``||z_j||^2`` for every row, ``[..., N]``, by one batched self-dot (no ``[N, d]``
    temporary).  NaN/Inf coordinates give NaN/Inf; an overflowing sum gives Inf."""
    return rowdot(points, points)


def admissible_points(points: Tensor) -> Tensor:
    """``[..., N]`` mask of points with finite coordinates and finite squared norm
    (taken in float32 for float16 and bfloat16 rows: a float16 row of norm 300 is an
    ordinary row, though its squared norm overflows float16)."""
    wide = points.float() if points.dtype in WIDENED_DTYPES else points
    return torch.isfinite(squared_norms(wide))


def rowdot(a: Tensor, b: Tensor) -> Tensor:
    """``<a_k, b_k>`` over the last dimension, shaped ``a.shape[:-1]`` (with ``a = b``:
    the squared norms of :func:`squared_norms`).  One
    batched ``[1, d] x [d, 1]`` product per row, with ``b``'s rows as transposed
    ``[1, d]`` views.  MKL sums that layout in blocks: relative error 1.2e-5 against
    float64 on ``1e6 + 200 randn`` rows of 159,010, where ``einsum`` (and the same
    product with ``b`` as ``[d, 1]`` columns) summed to 1.7e-3, past the rounding slack
    of the inner-product evaluations; and it is faster too.  ``linalg.vecdot``
    multiplies into a fresh ``[B, K, d]`` tensor first, whose page faults make it
    slower (benchmarks/README.md, "Kernel choices")."""
    count, d = math.prod(a.shape[:-1]), a.shape[-1]  # not -1: ambiguous when d = 0
    rows = torch.bmm(a.reshape(count, 1, d), b.reshape(count, 1, d).transpose(1, 2))
    return rows.reshape(a.shape[:-1])
