"""Distances between rows: Euclidean by the exact difference formula, squared through
a float64 Gram matrix where that is exact enough and far faster, and cosine."""

from __future__ import annotations

import torch
from torch import Tensor

from robust_pfl.engine.rows.admissible import WIDENED_DTYPES
from robust_pfl.engine.rows.statistics import Rows

F64 = torch.float64


def euclidean_distances(a: Tensor, b: Tensor) -> Tensor:
    """``[..., P, Q]`` distances between the rows of ``a[..., P, d]`` and ``b[..., Q, d]``
    by the difference formula: exact to rounding, and every pair is computed alike, so
    identical rows get identical distances.  float16 and bfloat16 rows are compared in
    float32 and their distances rounded back to their dtype."""
    if a.dtype in WIDENED_DTYPES:
        return torch.cdist(a.float(), b.float(), compute_mode="donot_use_mm_for_euclid_dist").to(a.dtype)
    return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")


def squared_distances(values: Tensor) -> Tensor:
    """``[..., N, N]`` squared distances between the rows of ``values[..., N, d]``.

    Rows narrower than float64 go through their Gram matrix in float64
    (``||a||^2 + ||b||^2 - 2 <a, b>``, clamped at 0): one ``N^2 d`` product at matmul
    speed, far faster than differences (benchmarks/README.md, "Kernel choices"), and
    more accurate than differences in the rows' own dtype, since float32 products are
    exact in float64.  float64 rows keep the exact difference formula."""
    if values.dtype == torch.float64:
        return euclidean_distances(values, values).square()
    wide = values.double()
    return gram_squared_distances(wide @ wide.transpose(-1, -2)).to(values.dtype)


def wide_squared_distances(values: Tensor) -> Tensor:
    """Squared distances ``[..., N, N]`` kept in float64 for narrower rows (their
    float64 Gram matrix, not rounded back), so that neighbour ranks are those of the
    exact distances to float64 rounding."""
    if values.dtype == torch.float64:
        return squared_distances(values)
    wide = values.double()
    return gram_squared_distances(wide @ wide.transpose(-1, -2))


def gram_squared_distances(gram: Tensor) -> Tensor:
    """Squared distances ``[..., N, N]`` from the rows' Gram matrix ``[..., N, N]`` (the
    squared norms are its diagonal)."""
    norms = torch.diagonal(gram, dim1=-2, dim2=-1)
    return squared_from_products(norms, norms, gram)


def squared_from_products(left: Tensor, right: Tensor, products: Tensor) -> Tensor:
    """``||a_p||^2 + ||b_q||^2 - 2 <a_p, b_q>``, clamped at 0: squared distances
    ``[..., P, Q]`` from the squared norms ``left[..., P]`` and ``right[..., Q]`` and the
    products ``[..., P, Q]``, in their dtype."""
    return (left.unsqueeze(-1) + right.unsqueeze(-2) - 2 * products).clamp_min(0)


def cosine_distances(rows: Rows) -> Tensor:
    """``[..., N, N]`` cosine distances ``1 - <x_i, x_j> / (||x_i|| ||x_j||)`` in
    float64 (in ``[0, 2]``); a zero row has cosine 0 (distance 1) with every row.
    Entries involving inadmissible rows are meaningless (callers mask them)."""
    wide = rows.values.to(F64)  # admissible rows have finite squared norms: no overflow in float64
    norms = torch.linalg.vector_norm(wide, dim=-1, keepdim=True)
    unit = wide / torch.where(norms > 0, norms, torch.ones_like(norms))
    return 1.0 - (unit @ unit.transpose(-1, -2)).clamp(-1.0, 1.0)
