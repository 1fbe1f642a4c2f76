"""What a threshold-clustering round's balls hold, for reading a run against Werner et
al.'s Thm 3.1 (``record_balls = true`` on FC, MC, Myopic and PFL-TC): around each
centre the defense returned, the ball its radius policy draws (the policy applied to
every received message's distance to that centre, restricted to the centre's cell
where the method uses cells), and how many honest messages of the centre's own cluster,
honest messages of other clusters and Byzantine messages it holds.

Thm 3.1 allows a Byzantine share ``beta_i`` up to about ``delta_i`` (constant
unspecified), and an attacker at the ball's edge moves the centre by ``(beta / delta)
tau`` (SPEC, "Exact facts"): inside a ball, the Byzantine messages against the honest
messages of the centre's cluster are what that ratio becomes.  Rows of
:func:`ball_rows` are ``(radius, own cluster inside, other honest inside, Byzantine
inside, own cluster in all)``; :func:`ball_metrics` turns a round's rows into the
metrics a run records.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from defenses.radius import RadiusPolicy

#: The columns of :func:`ball_rows`.
COLUMNS = ("radius", "own_inside", "other_inside", "byzantine_inside", "own_total")


def ball_rows(points: Tensor, centres: Tensor, policy: RadiusPolicy, round_index: int, byzantine: Tensor,
              own: Tensor, cells: Tensor | None = None) -> Tensor:
    """``[B * K, 5]`` rows of :data:`COLUMNS` for the balls around ``centres[B, K, d]``
    over ``points[B, S, d]``: ``byzantine[B, S]`` marks the Byzantine messages,
    ``own[B, K, S]`` the honest messages of each centre's own cluster, ``cells[B, K,
    S]`` (optional) the messages each centre may hold.  Non-finite messages are never
    inside."""
    difference = points.unsqueeze(-3).double() - centres.unsqueeze(-2).double()  # [B, K, S, d]
    distances = torch.linalg.vector_norm(difference, dim=-1)
    distances = torch.where(torch.isfinite(distances), distances, math.inf)
    radius = policy(distances, round_index).double()  # [B, K]
    inside = distances <= radius.unsqueeze(-1)
    if cells is not None:
        inside &= cells
    byzantine = byzantine.unsqueeze(-2).expand_as(inside)
    honest_inside = inside & ~byzantine
    own_inside = (honest_inside & own).sum(-1)
    other_inside = (honest_inside & ~own).sum(-1)
    columns = [radius, own_inside, other_inside, (inside & byzantine).sum(-1), own.sum(-1)]
    return torch.stack([c.double() for c in columns], dim=-1).reshape(-1, len(COLUMNS))


def ball_metrics(rows: Tensor) -> dict[str, float]:
    """A round's balls summed up: ``ball_byzantine_ratio``, the largest Byzantine count
    inside a ball over the honest messages of its own cluster inside it (``inf`` when
    Byzantine messages face none); ``ball_byzantine_share``, the mean share of
    Byzantine messages among a ball's messages; ``ball_radius``, the median radius;
    ``ball_own_inside``, the mean share of a centre's cluster inside its ball."""
    radius, own, other, byzantine, total = rows.double().unbind(-1)
    ratio = torch.where(own > 0, byzantine / own.clamp(min=1), torch.where(byzantine > 0, math.inf, 0.0))
    members = own + other + byzantine
    share = torch.where(members > 0, byzantine / members.clamp(min=1), 0.0)
    return {"ball_byzantine_ratio": float(ratio.max()), "ball_byzantine_share": float(share.mean()),
            "ball_radius": float(radius.median()), "ball_own_inside": float((own / total.clamp(min=1)).mean())}
