"""Threshold-Clustering (Werner et al., Alg. 3, eq. 24) evaluated from the points'
pairwise inner products: the ``"pairwise"`` method of
:func:`defenses.threshold_clustering.threshold_clustering`.

Every centre stays an explicit combination of its start and the points,
``v_k = c_k v0_k + sum_j W_kj z_j``: eq. 24 is ``v_l = a_l v_{l-1} + (1/N) sum_{j in
ball} z_j`` with ``a_l = 1 - |ball_l| / N``, so ``c <- a c`` and ``W <- a W + 1[ball] / N``.
With the Gram matrix ``G = Z Z^T`` and the products ``P_kj = <v0_k, z_j>``,

    ``<z_j, v_k> = c_k P_kj + (W G)_kj``,
    ``||v_k||^2 = c_k^2 ||v0_k||^2 + 2 c_k (W P^T)_kk + (W G W^T)_kk``,

so after one product with the points (``N^2 d`` multiply-adds, at matmul speed) every
round is ``O(K N^2)`` arithmetic on scalars, and every distance is exact to rounding
whatever the memberships do.  The coordinates are formed once, at the end, from the
rows with a non-zero weight.  This beats the lazily kept products of the ``"gram"``
method when ``N`` is small (a few dozen points per problem: FC's subgroups, FC at
N = 64, Momentum-Clustering at N = 64 in rounds whose memberships move); for hundreds
of points its ``N^2 d`` product costs more than ``"gram"``'s few passes over the points.

Rounding: ``(W G)_kj`` sums ``N`` products of length ``d``, each off by about
``eps sqrt(d) ||z_i|| ||z_j||``.  With the *spread* ``s_k = c_k ||v0_k|| + sum_i W_ki
||z_i||`` (at least ``||v_k||``), every squared distance is off by at most about
``eps (ROUNDING_SLACK sqrt(d) + N) (||z_j|| + s_k)^2``: its rounding slack, used, as in
the ``"gram"`` method, to say when a membership was decided by rounding.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from defenses.ball_membership import (
    ROUNDING_SLACK,
    decided_by_rounding,
    inside_ball,
    mask_distances,
    warn_decided_by_rounding,
)
from defenses.radius import RadiusPolicy
from defenses.row_reads import _rowdot, _weighted_rows


def pairwise_products(z: Tensor, centres: Tensor, index: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """``(gram[B, N, N], starts[B, K, N])``: ``<z_i, z_j>`` and ``<v0_k, z_j>``, one
    batched product each; ``starts`` is ``None`` when the centres start at points
    (``index[B, K]``): their products are rows of ``gram``, read by :func:`run_pairwise`.
    A non-finite row spoils only its own row and column of ``gram`` (and its column
    of ``starts``); its squared norm, ``gram``'s diagonal, is then non-finite too,
    which is how the caller finds it inadmissible."""
    gram = torch.bmm(z, z.transpose(1, 2))
    if index is not None:
        return gram, None
    # [N, d] x [d, K] streams the points; [K, d] x [d, N] was measured 1.9x slower
    return gram, torch.bmm(z, centres.transpose(1, 2)).transpose(1, 2)


class _Combination:
    """Centres ``v_k = c_k v0_k + sum_j W_kj z_j`` known through scalars: the
    squared distances of every point to them and the rounding slack of each."""

    def __init__(self, gram: Tensor, starts: Tensor, start_norms: Tensor, excluded: Tensor, dim: int) -> None:
        """``gram[B, N, N]``, ``starts[B, K, N] = <v0_k, z_j>``, ``start_norms[B, K] =
        ||v0_k||^2``, ``excluded[B, 1, N]`` the inadmissible points, ``dim = d``."""
        self.gram, self.starts, self.start_norms, self.excluded = gram, starts, start_norms, excluded
        self.norms = torch.diagonal(gram, dim1=-2, dim2=-1)  # ||z_j||^2, [B, N]
        self.lengths = self.norms.sqrt()
        batch, k, n = starts.shape
        self.scale = starts.new_ones(batch, k)  # c_k
        self.weights = starts.new_zeros(batch, k, n)  # W_kj
        self.n = n
        self._slack_scale = torch.finfo(gram.dtype).eps * (ROUNDING_SLACK * math.sqrt(dim) + n)

    def distances(self) -> tuple[Tensor, Tensor]:
        """``(distances, slack)``, each ``[B, K, N]``: every point's distance to every
        centre (``inf`` for inadmissible points) and the rounding slack of its square."""
        c = self.scale.unsqueeze(-1)
        through_points = torch.bmm(self.weights, self.gram)  # (W G)_kj
        dots = c * self.starts + through_points  # <z_j, v_k>
        centre_norms = (
            self.scale.square() * self.start_norms
            + 2 * self.scale * (self.weights * self.starts).sum(-1)
            + (through_points * self.weights).sum(-1)
        )
        squared = self.norms.unsqueeze(1) - 2 * dots + centre_norms.unsqueeze(-1)
        distances = mask_distances(squared.clamp_min(0).sqrt(), self.excluded)
        spread = self.scale * self.start_norms.sqrt() + torch.bmm(self.weights, self.lengths.unsqueeze(-1)).squeeze(-1)
        slack = self._slack_scale * (self.lengths.unsqueeze(1) + spread.unsqueeze(-1)).square()
        return distances, slack

    def step(self, inside: Tensor) -> None:
        """Eq. 24 with the ball ``inside[B, K, N]``: ``c <- a c``, ``W <- a W + 1/N``
        on the ball."""
        keep = 1 - inside.sum(-1).to(self.weights.dtype) / self.n  # a_l, [B, K]
        self.scale = keep * self.scale
        self.weights = keep.unsqueeze(-1) * self.weights + inside.to(self.weights.dtype) / self.n

    def centres(self, z: Tensor, v0: Tensor) -> Tensor:
        """The coordinates, from ``v0`` and the rows with a non-zero weight."""
        return _weighted_rows(self.weights, z).addcmul_(self.scale.unsqueeze(-1), v0)


def run_pairwise(
    z: Tensor,
    v0: Tensor,
    admissible: Tensor,
    gram: Tensor,
    starts: Tensor | None,
    start_index: Tensor | None,
    policy: RadiusPolicy,
    rounds: int,
    final: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``rounds`` rounds of eq. 24 from :func:`pairwise_products` of the points (``z``
    with inadmissible rows zeroed; ``gram`` and ``starts`` as computed from the raw
    rows; ``starts`` is ``None`` when the centres start at the points ``start_index``).
    Returns ``(centres, inside, tau, distances)``, the last every point's distance to
    the final centres when ``final``, else ``None``."""
    if not bool(admissible.all()):
        pair = admissible.unsqueeze(-1) & admissible.unsqueeze(-2)
        gram = gram.masked_fill(~pair, 0.0)
        if starts is not None:
            starts = starts.masked_fill(~admissible.unsqueeze(1), 0.0)
    if starts is None:  # rows of the masked gram: a start at an inadmissible point is 0
        starts = torch.gather(gram, 1, start_index.unsqueeze(-1).expand(-1, -1, gram.shape[-1]))
    combination = _Combination(gram, starts, _rowdot(v0, v0), ~admissible.unsqueeze(1), z.shape[-1])
    inside = torch.zeros(starts.shape, dtype=torch.bool, device=z.device)
    tau = z.new_zeros(starts.shape[:-1])
    seen: list[tuple[Tensor, Tensor, Tensor]] = []  # every round's distances, radii, slack
    for round_index in range(rounds):
        distances, slack = combination.distances()
        tau = policy(distances, round_index)
        inside = inside_ball(distances, tau, policy.strict)
        seen.append((distances, tau, slack))
        combination.step(inside)
    if seen and decided_by_rounding(*(torch.stack(values) for values in zip(*seen))):
        warn_decided_by_rounding("pairwise")
    distances = combination.distances()[0] if final else None
    return combination.centres(z, v0), inside, tau, distances
