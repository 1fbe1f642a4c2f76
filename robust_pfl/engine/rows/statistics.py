"""Masked statistics of rows ``[..., N, d]``, batched over leading problem
dimensions: means, coordinate-wise medians and order statistics of the admissible
rows (:mod:`robust_pfl.engine.rows.admissible`), with inadmissible rows masked, never
removed by a Python loop.  The robust aggregators are built from these, and the
attacks that predict an aggregator read the same ones."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from robust_pfl.engine.rows.admissible import admissible_points


class Rows(NamedTuple):
    """Messages prepared for aggregation: ``values[..., N, d]`` with inadmissible rows
    zeroed, ``admissible[..., N]`` and the admissible ``count[...]`` (int64)."""

    values: Tensor
    admissible: Tensor
    count: Tensor

    @classmethod
    def of(cls, messages: Tensor) -> "Rows":
        """``messages`` prepared; when every row is admissible (the usual case, even
        under large-gradient attacks) ``values`` is ``messages`` itself, not a zeroed
        copy: aggregators only read it, and a fresh ``[N, d]`` tensor per call costs
        its page faults."""
        admissible = admissible_points(messages)
        if bool(admissible.all()):
            return cls(messages, admissible, admissible.sum(-1))
        values = torch.where(admissible.unsqueeze(-1), messages, torch.zeros_like(messages))
        return cls(values, admissible, admissible.sum(-1))


def weighted_sum(values: Tensor, weights: Tensor) -> Tensor:
    """``sum_j weights[..., j] * values[..., j, :]`` by one batched product."""
    return (weights.to(values.dtype).unsqueeze(-2) @ values).squeeze(-2)


def per_problem(count: Tensor, like: Tensor) -> Tensor:
    """``count[...]`` as ``like``'s dtype, shaped ``[..., 1]`` to divide ``[..., d]``."""
    return count.clamp_min(1).to(like.dtype).unsqueeze(-1)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of the rows where ``mask[..., N]`` (zeros where no row is selected).
    Selecting one row returns it exactly (the other rows add exact zeros)."""
    return weighted_sum(values, mask) / per_problem(mask.sum(-1), values)


def sorted_columns(rows: Rows) -> Tensor:
    """Every coordinate sorted over the rows, inadmissible rows (as ``+inf``) last."""
    values = rows.values
    if not bool(rows.admissible.all()):
        values = torch.where(rows.admissible.unsqueeze(-1), values, torch.full_like(values, math.inf))
    return sort_columns(values)


def sort_columns(values: Tensor) -> Tensor:
    """``values[..., N, d]`` sorted along the rows, as a new tensor.  On the CPU,
    NumPy's vectorised sort, many times faster than torch's, which sorts each strided
    column on its own (benchmarks/README.md, "Kernel choices").  Both give the same
    values in the same places (equal zeros of either sign may trade places)."""
    if values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64) and not values.requires_grad:
        return torch.from_numpy(np.sort(values.numpy(), axis=-2))
    return values.sort(dim=-2).values


def stable_argsort_rows(values: Tensor) -> Tensor:
    """Stable argsort of ``values[..., N, d]`` along the rows (NumPy's on the CPU:
    torch sorts each strided column on its own, see :func:`sort_columns`)."""
    if values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64) and not values.requires_grad:
        return torch.from_numpy(np.argsort(values.numpy(), axis=-2, kind="stable"))
    return values.argsort(dim=-2, stable=True)


def mean_nearest_median(rows: Rows, keep: Tensor) -> Tensor:
    """Per coordinate, the mean of the ``keep[...]`` admissible values nearest the
    coordinate-wise median (ties in distance: the lower value first, so the result
    does not depend on the rows' order): the last step of Meamed (Xie, Koyejo, Gupta
    2018) and of Bulyan (El Mhamdi et al. 2018, with the Krum-selected rows)."""
    ordered = sorted_columns(rows)  # ascending, inadmissible (+inf) last
    median = coordinate_median(rows)
    position = torch.arange(ordered.shape[-2], device=ordered.device).unsqueeze(-1)  # [N, 1]
    valid = position < rows.count[..., None, None]
    distance = torch.where(valid, (ordered - median.unsqueeze(-2)).abs(), torch.full_like(ordered, math.inf))
    nearest = ordered.gather(-2, stable_argsort_rows(distance))  # stable: the lower value first on ties
    kept = torch.where(position < keep[..., None, None], nearest, torch.zeros_like(nearest))
    return kept.sum(-2) / keep.clamp_min(1).to(kept.dtype).unsqueeze(-1)


def mean_of_order_statistics(
    ordered: Tensor, count: Tensor, low: Tensor, high: Tensor, consume: bool = False
) -> Tensor:
    """Per coordinate, the mean of the order statistics at positions ``[low, high)``
    (of the ``count`` admissible ones) of ``ordered[..., N, d]``; zeros where the
    range is empty.  With ``consume`` the rows outside the range are zeroed in
    ``ordered`` itself (a caller's fresh sort) instead of in a masked copy."""
    position = torch.arange(ordered.shape[-2], device=ordered.device).unsqueeze(-1)  # [N, 1]
    low, high = low.clamp_min(0), torch.minimum(high, count)
    keep = (position >= low[..., None, None]) & (position < high[..., None, None])
    kept = ordered.masked_fill_(~keep, 0.0) if consume else torch.where(keep, ordered, torch.zeros_like(ordered))
    return kept.sum(-2) / per_problem(high - low, ordered)


def coordinate_median(rows: Rows) -> Tensor:
    """Coordinate-wise *statistical* median of the admissible rows: for an even count,
    the average of the two middle values (as ``numpy.median``; not torch's lower
    median).  Zeros for a problem without admissible rows."""
    count = rows.count
    if rows.values.shape[-2] == 0:
        return rows.values.new_zeros(*rows.values.shape[:-2], rows.values.shape[-1])
    ordered = sorted_columns(rows)
    # the two middle order statistics (the same one for odd counts), read as two rows
    # instead of a masked sum over all N; ``+ 0`` gives a zero median the sum's sign
    middle = torch.stack([(count - 1).clamp_min(0) // 2, count // 2], dim=-1)  # [..., 2]
    low, high = torch.gather(ordered, -2, middle.unsqueeze(-1).expand(*middle.shape, ordered.shape[-1])).unbind(-2)
    odd = (count % 2 == 1).unsqueeze(-1)
    total = torch.where(odd, low + 0, low + high + 0)
    return torch.where(count.unsqueeze(-1) > 0, total / torch.where(odd, 1.0, 2.0).to(total.dtype), 0.0)


def masked_median(values: Tensor, mask: Tensor) -> Tensor:
    """Statistical median (mean of the two middle values for even counts) of
    ``values[..., N]`` over ``mask``; 0 where the mask is empty."""
    rows = Rows(values.unsqueeze(-1), mask, mask.sum(-1))
    return coordinate_median(rows).squeeze(-1)


def row_norms(x: Tensor) -> Tensor:
    """Euclidean norms of the rows of ``x[..., N, d]``, overflow-safe: a finite row
    whose plain norm overflows (``|x| ~ 1e19`` in float32) is rescaled by its largest
    coordinate first, so clipping and Weiszfeld weights keep their direction."""
    norms = torch.linalg.vector_norm(x, dim=-1)
    if bool(torch.isinf(norms).any()):
        scale = x.abs().amax(-1, keepdim=True)
        finite = torch.isfinite(scale) & (scale > 0)  # an Inf coordinate keeps norm Inf
        scale = torch.where(finite, scale, torch.ones_like(scale))
        rescaled = scale.squeeze(-1) * torch.linalg.vector_norm(x / scale, dim=-1)
        norms = torch.where(torch.isinf(norms) & finite.squeeze(-1), rescaled, norms)
    return norms


def admissible_previous(previous: Tensor | None) -> Tensor | None:
    """``[...]`` mask of problems whose ``previous`` is usable, or None."""
    return None if previous is None else admissible_points(previous.unsqueeze(-2)).squeeze(-1)
