"""Seeded k-means++ seeding (Arthur & Vassilvitskii 2007), used to initialise the
centres of Momentum-/Myopic-Clustering (the workshop version's PFL-TC initialises with
k-means++).  Inadmissible points (non-finite) are never chosen."""

from __future__ import annotations

import torch
from torch import Tensor

from defenses.threshold_clustering import admissible_points


def kmeans_plus_plus(points: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """``k`` initial centres ``[k, d]`` chosen among the admissible rows of ``points``.

    D^2 sampling; distances are computed in float64 and capped so that huge (but
    finite) rows cannot produce infinite weights.  Loops over ``k`` centres only.
    """
    admissible = admissible_points(points)
    if not bool(admissible.any()):
        return torch.zeros(k, points.shape[-1], dtype=points.dtype, device=points.device)
    candidates = points[admissible].double()
    first = torch.randint(candidates.shape[0], (1,), generator=generator, device=generator.device)
    chosen = [candidates[first.item()]]
    closest = (candidates - chosen[0]).pow(2).sum(-1)
    for _ in range(1, k):
        weights = torch.nan_to_num(closest, posinf=1e300).clamp(0, 1e300)
        if float(weights.sum()) <= 0:
            index = torch.randint(candidates.shape[0], (1,), generator=generator, device=generator.device).item()
        else:
            index = torch.multinomial(weights / weights.sum(), 1, generator=generator).item()
        chosen.append(candidates[index])
        closest = torch.minimum(closest, (candidates - chosen[-1]).pow(2).sum(-1))
    return torch.stack(chosen).to(points.dtype)
