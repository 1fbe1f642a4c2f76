"""Centered clipping: the update starts at last round's aggregate and moves by the
clipped differences."""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field
from torch import Tensor

from defenses.aggregators.base import Aggregator, aggregator_options, register
from robust_pfl.engine.rows import Rows, coordinate_median, admissible_previous, per_problem, row_norms, weighted_sum


@register
@aggregator_options
class CenteredClipping(Aggregator):
    """Centered clipping (Karimireddy, He, Jaggi 2021, "Learning from history for
    Byzantine robust optimization", the CC rule)::

        v <- v + (1/n) sum_j clip(x_j - v, tau),   clip(y, tau) = y min(1, tau / ||y||)

    for ``iterations`` steps ``L``.  The start ``v`` is ``previous`` (last round's
    aggregate, as in the paper) where given and admissible, else the coordinate-wise
    median.  Each step moves ``v`` by at most ``tau``.
    """

    name = "centered_clipping"
    summary = "iterative clipping of the rows around the previous aggregate (radius tau)"
    reference = "Karimireddy, He, Jaggi 2021 (ICML), Learning from history, centered clipping (CC)"

    tau: Annotated[float, Field(gt=0, description="clipping radius")] = 10.0
    iterations: Annotated[int, Field(ge=1, description="clipping steps L")] = 1

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        usable = admissible_previous(previous)
        shape = (*rows.values.shape[:-2], rows.values.shape[-1])
        if usable is not None and bool(usable.all()) and previous.shape == shape:
            v = previous  # the median start is not needed
        else:
            v = coordinate_median(rows)
            if usable is not None:
                v = torch.where(usable.unsqueeze(-1), previous, v)
        scratch = torch.empty_like(rows.values)  # one [N, d] for every step
        for _ in range(self.iterations):
            difference = torch.sub(rows.values, v.unsqueeze(-2), out=scratch)
            scale = (self.tau / row_norms(difference)).clamp_max(1.0)  # ||y|| = 0 gives 1
            scale = torch.where(rows.admissible, scale, torch.zeros_like(scale))
            v = v + weighted_sum(difference, scale) / per_problem(rows.count, v)
        return v
