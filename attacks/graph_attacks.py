"""Attacks on decentralised systems: neighbour poisoning.

On a communication graph a Byzantine node talks to each neighbour separately, so it
can craft one message per receiver, and where it sits on the graph decides how many
receivers it reaches.  :class:`NeighbourPoison` takes the highest-degree positions
(``graph_placement = "high_degree"``, read by :func:`robust_pfl.engine.graphs.federation_graph`)
and sends every receiver a point built from that receiver's own message.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Mapping, get_args

import torch
from pydantic import Field
from torch import Tensor

from attacks._stats import byzantine_shape, norm, reference_mask, unit
from attacks.base import attack_options, register
from robust_pfl.engine.types import AttackBase, AttackContext

Mode = Literal["ball_edge", "flip"]
Direction = Literal["reverse", "away"]
MODES = get_args(Mode)
DIRECTIONS = get_args(Direction)


@register
@attack_options
class NeighbourPoison(AttackBase):
    """Neighbour poisoning (omniscient, adaptive): each receiver gets its own crafted
    message from every Byzantine neighbour, and the Byzantine nodes sit at the
    highest-degree positions of the graph (``graph_placement = "high_degree"``).

    For the leading block of receiver ``r`` (``context.receivers[r]``), let ``c_r`` be
    the receiver's own message (its row of the block; where there is no receiver, or
    it is not an honest sender of the block, the mean of the admissible honest rows),
    ``H_r`` the reference rows (the admissible honest rows among the receiver's
    ``defense_state["neighbours"]`` when the defense exposes them, else all admissible
    honest rows), ``h_r = |H_r|``, ``b_r`` the number of Byzantine rows it receives
    (its Byzantine neighbours) and ``tau_r`` the receiver's radius:
    ``defense_state["radius"]`` when given, else the order statistic of rank
    ``min(floor(q (h_r + b_r - 1)), h_r - 1)`` (0-based, ``q = quantile``) of the
    distances ``||h - c_r||, h in H_r`` (the receiver's own row, at 0, included).  At
    most that many points then lie closer to ``c_r`` than the ``b_r`` crafted points at
    ``(1 - eps) tau_r``, so a quantile radius ``q`` over all ``h_r + b_r`` points (the
    defense's first clustering round) keeps them inside.  Every Byzantine row for
    ``r`` is

    * ``mode = "ball_edge"`` (default): ``c_r + (1 - eps) tau_r u_r``, a point just
      inside the receiver's threshold ball around its own message (the worst case of
      the threat model), with ``u_r = -unit(c_r)`` (``direction = "reverse"``: it
      pulls the receiver's update toward zero and past it) or
      ``u_r = unit(c_r - mean H_r)`` (``"away"``: away from its collaborators;
      ``-unit(c_r)`` when that is ~0);
    * ``mode = "flip"``: ``-scale * c_r``, a scaled flip of the receiver's own message.

    ``quantile`` is the ``q`` of the receiver's quantile radius (default 0.2, the
    threshold algorithms' default).
    Without receivers (a server algorithm) ``c`` is the honest mean of each block.
    """

    name: ClassVar[str] = "neighbour_poison"
    summary: ClassVar[str] = (
        "Byzantine nodes at the highest-degree positions send each neighbour its own point just "
        "inside its threshold ball (or -scale x its own message)"
    )
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive"})
    graph_placement: ClassVar[str] = "high_degree"
    mode: Annotated[
        Mode, Field(description="ball_edge: just inside the receiver's ball | flip: -scale x its own message")
    ] = "ball_edge"
    direction: Annotated[
        Direction, Field(description="ball_edge's direction: reverse (-unit(c_r)) | away (from the honest mean)")
    ] = "reverse"
    eps: Annotated[
        float, Field(gt=0, lt=1, description="margin: rows sit at (1 - eps) * tau from the receiver's point")
    ] = 0.05
    quantile: Annotated[float, Field(ge=0, le=1, description="q of the receiver's quantile radius")] = 0.2
    scale: Annotated[float, Field(gt=0, description="mode flip sends -scale * the receiver's message")] = 1.0

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        state = context.defense_state or {}
        # [..., S] admissible reference rows (honest, and the receiver's neighbours)
        finite = torch.isfinite(torch.einsum("...d,...d->...", messages, messages))
        reference = reference_mask(context).to(messages.device) & finite
        neighbours = _neighbours(state, messages)
        byzantine = context.byzantine.to(messages.device)
        crafted = byzantine.expand(messages.shape[:-1])  # [..., S] the rows this attack writes
        if neighbours is not None:
            reference = reference & neighbours
            crafted = crafted & neighbours
        crafted = crafted.sum(-1, keepdim=True)  # [..., 1]: b, the crafted points each receiver gets
        own, has_own = self._own_rows(messages, context, finite)
        clean = torch.where(reference.unsqueeze(-1), messages, 0.0)
        count = reference.sum(-1, keepdim=True)  # [..., 1]
        mean = clean.sum(-2) / count.clamp_min(1).to(messages.dtype)  # [..., d]
        centre = torch.where(has_own.unsqueeze(-1), own, mean)
        if self.mode == "flip":
            row = -self.scale * centre
        else:
            tau = self._radius(state, messages, clean, reference, centre, crafted)
            reverse = -unit(centre)
            if self.direction == "away":
                away = centre - mean
                tiny = norm(away) <= torch.finfo(messages.dtype).eps ** 0.5 * torch.maximum(norm(centre), norm(mean))
                direction = torch.where(tiny, reverse, unit(away))
            else:
                direction = reverse
            row = centre + (1.0 - self.eps) * tau.unsqueeze(-1) * direction
        return row.unsqueeze(-2).expand(byzantine_shape(messages, context)).clone()

    @staticmethod
    def _own_rows(messages: Tensor, context: AttackContext, finite: Tensor) -> tuple[Tensor, Tensor]:
        """``(rows[..., d], has[...])``: every block's receiver's own row, where the
        receiver is an admissible honest sender of the block."""
        lead = messages.shape[:-2]
        receivers = context.receivers
        if receivers is None or len(lead) != 1 or receivers.numel() != lead[0]:
            none = torch.zeros(lead, dtype=torch.bool, device=messages.device)
            return messages.new_zeros(*lead, messages.shape[-1]), none
        senders = context.senders
        if senders is None:
            senders = torch.arange(messages.shape[-2], device=messages.device)
        senders = senders.to(messages.device).long()
        honest = (~context.byzantine).to(messages.device)
        match = (senders.unsqueeze(0) == receivers.to(messages.device).long().reshape(-1, 1)) & honest & finite
        position = match.int().argmax(-1)  # [R]
        rows = messages[torch.arange(lead[0], device=messages.device), position]
        return rows, match.any(-1)

    def _radius(
        self,
        state: Mapping[str, Any],
        messages: Tensor,
        clean: Tensor,
        reference: Tensor,
        centre: Tensor,
        crafted: Tensor,
    ) -> Tensor:
        """``tau[...]`` of every block: the defense's ``radius``, or the order statistic
        of the reference rows' distances to ``centre`` that keeps ``crafted`` points at
        ``(1 - eps) tau`` inside the receiver's ``quantile`` ball (see the class)."""
        lead = messages.shape[:-2]
        if state.get("radius") is not None:
            tau = torch.as_tensor(state["radius"]).to(device=messages.device, dtype=messages.dtype)
            if tau.dim() == len(lead) + 1:  # [..., K] of one centre per block
                tau = tau[..., 0]
            return tau.broadcast_to(lead)
        distances = torch.cdist(centre.unsqueeze(-2), clean, compute_mode="donot_use_mm_for_euclid_dist").squeeze(-2)
        usable = reference & torch.isfinite(distances)
        ordered = torch.where(usable, distances, torch.inf).sort(dim=-1).values
        honest = usable.sum(-1, keepdim=True)  # [..., 1]
        # rank floor(q (h + b - 1)) of the h honest distances, at most h - 1: with the b
        # crafted points at (1 - eps) times it, at most that many points lie below them,
        # so the q-quantile of all h + b points is at least their distance
        rank = (self.quantile * (honest + crafted - 1).clamp_min(0).double()).floor().long()
        rank = torch.minimum(rank, honest - 1).clamp_min(0)
        tau = ordered.gather(-1, rank)
        return torch.where(honest > 0, tau, 0.0).squeeze(-1)


def _neighbours(state: Mapping[str, Any], messages: Tensor) -> Tensor | None:
    """The defense's ``neighbours`` mask ``[..., S]`` when it fits the messages."""
    mask = state.get("neighbours")
    if mask is None:
        return None
    mask = torch.as_tensor(mask).to(device=messages.device, dtype=torch.bool)
    try:
        return mask.broadcast_to(messages.shape[:-1])
    except RuntimeError:
        return None
