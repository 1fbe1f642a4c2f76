"""Ball-edge: the adaptive worst case of threshold clustering's threat model.

Werner et al. ("Provably personalized and robust federated learning", TMLR 2023)
analyse threshold clustering against Byzantine points that may lie anywhere inside
the current threshold ball: a point at distance ``<= tau`` from the centre estimate is
kept, and the most it can move the next centre is obtained by sitting on the ball's
edge in a chosen direction.  This attack places every Byzantine row at distance
``(1 - eps) * tau`` from its target centre (the margin ``eps`` keeps it inside under
float rounding).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Mapping, get_args

import torch
from pydantic import Field
from torch import Tensor

from attacks._stats import honest_rows, norm, own_rows, rows_at, unit
from attacks.base import attack_options, register
from robust_pfl.engine.rows import euclidean_distances
from robust_pfl.engine.types import AttackBase, AttackContext

Direction = Literal["away", "other_centre"]
DIRECTIONS = get_args(Direction)


def _negligible(vector: Tensor, *scales: Tensor) -> Tensor:
    """``[..., 1]`` whether ``vector`` is ~0 relative to the norms ``scales`` (below
    ``sqrt(machine eps)`` of the largest; exactly 0 when every scale is 0)."""
    reference = torch.stack(torch.broadcast_tensors(*scales)).amax(dim=0)
    return norm(vector) <= torch.finfo(vector.dtype).eps ** 0.5 * reference


@register
@attack_options
class BallEdge(AttackBase):
    """Ball-edge attack (adaptive and omniscient).

    Reads ``context.defense_state``: ``centres`` ``[..., K, d]`` (the defense's current
    centre estimates; broadcast against the messages' leading axes), ``radius``
    ``[..., K]`` or a number, ``radius_policy`` (``policy(dist[B, K, N], round) ->
    tau[B, K]``).

    * Target: each Byzantine row targets the centre nearest to its own honest row.
      Without ``centres`` (or ``centres = None``) the only centre is the honest mean.
    * Radius ``tau``: ``radius`` if given; else ``radius_policy`` applied to the
      distances of the *honest* rows to the centres (the Byzantine rows' distances
      depend on where they are about to be placed, so they are left out); else the
      ``fallback_quantile`` quantile of those honest distances.
    * Direction ``u`` (a unit vector): ``"away"``: ``unit(centre - honest_mean)``,
      pushing the centre further from the honest mean; if that is ~0,
      ``unit(-honest_mean)``; if that is 0 too, a random unit vector drawn from
      ``context.generator`` (one is drawn every call, so the stream advances the same
      way whatever the data).  ``"other_centre"``: toward the nearest other centre
      (falls back to ``"away"`` when ``K = 1`` or the two coincide).

    Each row is ``centre + (1 - eps) * tau * u``.
    """

    name: ClassVar[str] = "ball_edge"
    summary: ClassVar[str] = "sit inside the defense's threshold ball at (1-eps)*tau from the centre (Werner et al.)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive", "defense_aware"})
    eps: Annotated[float, Field(gt=0, lt=1, description="margin: rows sit at (1 - eps) * tau from the centre")] = 0.05
    direction: Annotated[
        Direction, Field(description="away (from the honest mean) | other_centre (toward the nearest other centre)")
    ] = "away"
    fallback_quantile: Annotated[
        float, Field(ge=0, le=1, description="quantile of the honest distances used as tau when the defense shows none")
    ] = 0.5

    def centres(self, state: Mapping[str, Any], mean: Tensor) -> Tensor:
        """``[..., K, d]`` the defense's centres (the honest mean when none)."""
        centres = state.get("centres")
        if centres is None:
            return mean
        centres = torch.as_tensor(centres).to(device=mean.device, dtype=mean.dtype)
        lead = mean.shape[:-2]
        try:
            return centres.broadcast_to((*lead, *centres.shape[-2:]))
        except RuntimeError:
            raise ValueError(
                f"ball_edge: defense_state['centres'] has shape {tuple(centres.shape)}, "
                f"not broadcastable to the messages' leading shape {tuple(lead)} + (K, d)"
            ) from None

    def radius(self, state: Mapping[str, Any], centres: Tensor, honest: Tensor, round_index: int) -> Tensor:
        """``[..., K]`` the threshold radius of every centre."""
        target = centres.shape[:-1]
        if state.get("radius") is not None:
            tau = torch.as_tensor(state["radius"]).to(device=centres.device, dtype=centres.dtype)
            return tau.broadcast_to(target)
        honest_distances = euclidean_distances(centres, honest)  # [..., K, H]
        policy = state.get("radius_policy")
        if policy is not None:
            flat = honest_distances.reshape(-1, *honest_distances.shape[-2:])
            return policy(flat, round_index).to(centres.dtype).reshape(target)
        return torch.quantile(honest_distances, self.fallback_quantile, dim=-1)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        state = context.defense_state or {}
        honest = honest_rows(messages, context)
        mean = honest.mean(dim=-2, keepdim=True)
        centres = self.centres(state, mean)
        tau = self.radius(state, centres, honest, context.round_index)
        own = own_rows(messages, context)
        target = euclidean_distances(own, centres).argmin(dim=-1)  # [..., B]
        centre = rows_at(centres, target)  # [..., B, d]
        reach = torch.take_along_dim(tau, target, dim=-1).unsqueeze(-1)  # [..., B, 1]

        draw = torch.randn(
            messages.shape[-1], generator=context.generator, device=context.generator.device, dtype=messages.dtype
        )
        direction = unit(draw.to(messages.device))
        direction = torch.where(norm(mean) > 0, unit(-mean), direction)
        away = centre - mean
        direction = torch.where(_negligible(away, norm(centre), norm(mean)), direction, unit(away))
        if self.direction == "other_centre" and centres.shape[-2] > 1:
            between = euclidean_distances(centres, centres)  # [..., K, K]
            eye = torch.eye(between.shape[-1], dtype=torch.bool, device=between.device)
            nearest = between.masked_fill(eye, float("inf")).argmin(dim=-1)  # [..., K]
            other_index = torch.take_along_dim(nearest, target, dim=-1).unsqueeze(-1)
            other = rows_at(centres, other_index.squeeze(-1))  # [..., B, d]
            toward = other - centre
            direction = torch.where(_negligible(toward, norm(other), norm(centre)), direction, unit(toward))
        return centre + (1.0 - self.eps) * reach * direction
