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
``eps (ROUNDING_SLACK sqrt(d) + N) (||z_j|| + s_k)^2``: its rounding slack.  A point
whose interval leaves its membership open under the tie rule is read from
coordinates, after its problem's centres are formed from the weights
(:func:`defenses.ball_membership.read_ties`), as in the ``"gram"`` method.

Far rows: every centre is a convex combination of its start and points in its
balls, so its norm stays within ``S = max(||v0_k||, max ||z_i||)`` over the other
points.  A row with ``||z_j|| >= 2 S / eps`` (a 1e6-sized attack row among gradients
of norm 1) has products with every centre below one rounding of its own squared
norm: its distances are ``||z_j||^2 + ||v_k||^2`` to rounding.  When such rows form a
leading or trailing block (FC orders its senders honest first), only the other rows
enter the ``N^2 d`` product; the far rows get their squared norms, and the bound
``2 ||z_j|| S`` is added to their rounding slack.  Should one of them enter a ball
after all (a radius of its size), the rounds are run again from all products.

Centres stored just ahead of the points: when the centres' rows lie in the same
buffer directly before the points' rows (Momentum-Clustering keeps a free slot for its
warm-started centres there), the products ``P`` come out of the same matmul as
``G``, over ``K + N`` rows, instead of a second pass over the points, which is
cheaper than a product of its own (benchmarks/README.md, "Kernel choices").
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import torch
from torch import Tensor

from defenses.ball_membership import (
    ROUNDING_SLACK,
    inside_ball,
    mask_distances,
    read_ties,
    row_copies,
    tie_tolerance,
)
from defenses.radius import RadiusPolicy
from defenses.row_reads import weighted_rows
from robust_pfl.engine.rows import rowdot
from robust_pfl.engine.devices import engine, same_device


class PairwiseProducts(NamedTuple):
    """The points' products that :func:`run_pairwise` reads: ``gram[B, N, N]``
    (``<z_i, z_j>``), ``starts[B, K, N]`` (``<v0_k, z_j>``; ``None`` when the centres
    start at points, whose products are rows of ``gram``), ``start_norms[B, K]``
    (``||v0_k||^2``), and, when some *far* rows' products were left out (zeros in
    ``gram`` and ``starts``; see :func:`_near_block`), ``far[N]`` marking them and
    ``dropped[B, N]``, a bound on what was left out of each far row's squared
    distances (0 elsewhere)."""

    gram: Tensor
    starts: Tensor | None
    start_norms: Tensor
    far: Tensor | None = None
    dropped: Tensor | None = None


def pairwise_products(z: Tensor, centres: Tensor, index: Tensor | None = None) -> PairwiseProducts:
    """The products of ``z[B, N, d]`` with each other and with ``centres[B, K, d]``
    (``starts`` is ``None`` when the centres start at the points ``index[B, K]``).

    A non-finite row spoils only its own row and column of ``gram`` (and its column
    of ``starts``); its squared norm, ``gram``'s diagonal, is then non-finite too,
    which is how the caller finds it inadmissible.

    Rows far out of every centre's reach (a leading or trailing block, see
    :func:`_near_block`; e.g. 1e6-sized attack rows) get only their squared norms:
    their products with the other rows and the centres are below the rounding of
    their own squared norms, so the ``N^2 d`` product shrinks to the near block's
    (benchmarks/README.md, "Kernel choices")."""
    start_norms = rowdot(centres, centres)  # [B, K]
    if z.numel() == 0 or centres.shape[1] == 0:  # no rows to leave out, no reach to bound
        return PairwiseProducts(*_all_products(z, centres, index), start_norms)
    lo, hi = _near_block(z, start_norms.amax(-1))
    if (lo, hi) == (0, z.shape[1]):
        return PairwiseProducts(*_all_products(z, centres, index), start_norms)
    near = z[:, lo:hi]
    near_gram, near_starts = _all_products(near, centres, index)
    far = torch.ones(z.shape[1], dtype=torch.bool, device=z.device)
    far[lo:hi] = False
    positions = far.nonzero().squeeze(-1)
    far_norms = _squared_lengths(torch.cat([z[:, :lo], z[:, hi:]], dim=1) if lo else z[:, hi:])  # [B, F]
    near_norms = torch.diagonal(near_gram, dim1=-2, dim2=-1)
    reach = torch.maximum(start_norms.amax(-1), _finite_max(near_norms))  # S^2, [B]
    if not bool(_negligible(far_norms, reach.unsqueeze(-1), z.dtype).all()):
        return PairwiseProducts(*_all_products(z, centres, index), start_norms)
    batch, n = z.shape[:2]
    gram = z.new_zeros(batch, n, n)
    gram[:, lo:hi, lo:hi] = near_gram
    gram[:, positions, positions] = far_norms
    starts = None
    if near_starts is not None:
        starts = z.new_zeros(batch, centres.shape[1], n)
        starts[..., lo:hi] = near_starts
    dropped = z.new_zeros(batch, n)
    bound = 2 * (far_norms * reach.unsqueeze(-1)).sqrt()  # 2 ||z_j|| S >= |2 <z_j, v>|
    dropped[:, positions] = torch.where(torch.isfinite(far_norms), bound, 0.0)
    return PairwiseProducts(gram, starts, start_norms, far, dropped)


def _all_products(z: Tensor, centres: Tensor, index: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """``(gram, starts)`` over all rows of ``z`` (``starts`` is ``None`` with
    ``index``).  When the centres lie just ahead of the points (see
    :func:`_stacked_ahead`), their products come out of the Gram product, over the
    ``K + N`` rows; otherwise from a product of their own."""
    joined = None if index is not None else _stacked_ahead(centres, z)
    gram, lead = _gram_and_leading_rows(z if joined is None else joined, z.shape[1])
    if index is not None:
        return gram, None
    if joined is not None:
        return gram, lead
    # [N, d] x [d, K] streams the points; [K, d] x [d, N] is slower
    # (benchmarks/README.md, "Kernel choices")
    return gram, torch.bmm(z, centres.transpose(1, 2)).transpose(1, 2)


def _gram_and_leading_rows(rows: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(gram[B, n, n], lead[B, R - n, n])``: the products of the last ``n`` of
    ``rows[B, R, d]`` with each other, and of the leading ``R - n`` rows with them.

    On the CPU, MKL's float32 product costs about the same for any number of columns
    within a multiple of 16, so the first ``n mod 16`` columns
    (:func:`_unaligned_columns`) are taken apart and the others, a multiple of 16,
    go in one product with all rows; the first columns' products with the rows up to
    them take a small product, and the rest follows by symmetry.  For FC's and MC's
    shapes the split costs less than one product (benchmarks/README.md,
    "Kernel choices" and "The Gram product's cost by column count")."""
    lead = rows.shape[1] - n
    points = rows[:, lead:]
    split = _unaligned_columns(n, rows.device)
    if split == 0:
        both = torch.bmm(rows, points.transpose(1, 2))
        return both[:, lead:], both[:, :lead]
    aligned = torch.bmm(rows, points[:, split:].transpose(1, 2))  # [B, R, n - split]
    both = rows.new_empty(rows.shape[0], rows.shape[1], n)
    both[:, :, split:] = aligned
    both[:, : lead + split, :split] = torch.bmm(rows[:, : lead + split], points[:, :split].transpose(1, 2))
    both[:, lead + split :, :split] = aligned[:, lead : lead + split].transpose(1, 2)  # <z_i, z_j> = <z_j, z_i>
    return both[:, lead:], both[:, :lead]


def _unaligned_columns(n: int, device: torch.device) -> int:
    """How many of ``n`` Gram columns :func:`_gram_and_leading_rows` takes apart
    (``n mod 16``, leaving a multiple of 16), on the blocked (CPU) engine when
    ``n > 16``."""
    if engine(device) == "batched" or n <= 16:
        return 0
    return n % 16


def _stacked_ahead(centres: Tensor, z: Tensor) -> Tensor | None:
    """The ``[B, K + N, d]`` view of ``centres[B, K, d]`` followed by ``z[B, N, d]``
    when, in every problem, the centres' rows lie in the same buffer directly before
    the points' rows (all rows contiguous); else ``None``."""
    k, dim = centres.shape[1], z.shape[-1]
    if k == 0 or centres.shape[-1] != dim or centres.shape[0] != z.shape[0]:
        return None
    if centres.dtype != z.dtype or not same_device(centres.device, z.device):
        return None
    if centres.untyped_storage().data_ptr() != z.untyped_storage().data_ptr():
        return None
    if any(t.is_neg() or t.is_conj() for t in (centres, z)):  # lazy views of the storage
        return None
    if torch.is_grad_enabled() and (centres.requires_grad or z.requires_grad):
        return None  # a view of the storage would cut the centres off the graph
    for rows in (centres, z):
        if rows.stride(-1) != 1 or (rows.shape[-2] > 1 and rows.stride(-2) != dim):
            return None
    if z.shape[0] > 1 and centres.stride(0) != z.stride(0):
        return None
    if centres.storage_offset() + k * dim != z.storage_offset():
        return None
    return z.as_strided((z.shape[0], k + z.shape[1], dim), (z.stride(0), dim, 1), centres.storage_offset())


# Leading columns read to find the far rows: 64 KB of each float32 row.
_PROBE_COLUMNS = 16384
# A near row's squared norm is guessed as this many times the median share of the
# probed columns, scaled to d.  The guess only picks the candidates; the far rows
# are then checked against the near rows' exact norms (see ``_negligible``).
_NEAR_GUESS_MARGIN = 4.0


def _near_block(z: Tensor, start_norms: Tensor) -> tuple[int, int]:
    """``(lo, hi)``: the rows ``[lo, hi)`` whose products are computed; the rows
    outside are the leading and trailing runs of rows far from every centre's reach
    in every problem (non-finite, or with a squared norm, as its first
    ``_PROBE_COLUMNS`` coordinates bound it from below, past :func:`_negligible`'s
    bound for the larger of the centres' largest squared norm ``start_norms[B]`` and
    a guess of the other rows').  Every centre is a convex combination of its start
    and the points in its balls (eq. 24), so its norm stays within
    ``S = max(||v0_k||, max ||z_near||)``."""
    n, dim = z.shape[1], z.shape[-1]
    partial = _squared_lengths(z[..., : min(dim, _PROBE_COLUMNS)])  # [B, N], at most ||z_j||^2
    guess = lower_nanmedian(partial) * (dim / min(dim, _PROBE_COLUMNS)) * _NEAR_GUESS_MARGIN
    reach = torch.maximum(start_norms, guess)
    far = _negligible(partial, reach.unsqueeze(-1), z.dtype).all(0).tolist()
    lo = next((i for i, is_far in enumerate(far) if not is_far), n)
    hi = n - next((i for i, is_far in enumerate(reversed(far)) if not is_far), n)
    return (lo, hi) if lo < hi else (0, n)


def lower_nanmedian(values: Tensor) -> Tensor:
    """The lower median of the non-NaN entries along the last axis (NaN where all are
    NaN): ``torch.nanmedian``'s values, from a sort, which has a deterministic CUDA
    kernel where ``nanmedian`` has none."""
    ordered = values.sort(dim=-1).values  # NaN sorts last
    count = (~values.isnan()).sum(-1, keepdim=True)
    middle = ordered.gather(-1, ((count - 1) // 2).clamp_min(0)).squeeze(-1)
    return torch.where(count.squeeze(-1) > 0, middle, torch.nan)


def _negligible(squared_norms: Tensor, reach: Tensor, dtype: torch.dtype) -> Tensor:
    """Whether rows of these squared norms have products with any vector of squared
    norm at most ``reach`` that are negligible: ``2 ||z|| S <= eps ||z||^2``, below
    about one rounding of ``||z||^2`` itself, so a distance computed without them is
    the computed distance to rounding.  Non-finite rows (inadmissible, never inside
    a ball) count as negligible too."""
    eps = torch.finfo(dtype).eps
    return ~torch.isfinite(squared_norms) | (squared_norms * eps**2 >= 4 * reach)


def _squared_lengths(rows: Tensor) -> Tensor:
    """``||row||^2`` over the last axis.  ``vector_norm`` reads strided rows (a block
    of a larger ``[B, N, d]``) in place, where :func:`robust_pfl.engine.rows.rowdot`'s
    reshape copies such rows first, at many times the cost (benchmarks/README.md,
    "Kernel choices").  Relative error 2e-5 on 1e6-sized rows."""
    return torch.linalg.vector_norm(rows, dim=-1).square()


def _finite_max(values: Tensor) -> Tensor:
    """Largest finite value along the last axis (0 when none is finite)."""
    return torch.where(torch.isfinite(values), values, 0.0).amax(-1)


class _Combination:
    """Centres ``v_k = c_k v0_k + sum_j W_kj z_j`` known through scalars: the
    squared distances of every point to them and the rounding slack of each."""

    def __init__(
        self, z: Tensor, admissible: Tensor, gram: Tensor, starts: Tensor, start_norms: Tensor, dropped: Tensor | None
    ) -> None:
        """``z[B, N, d]`` the points (inadmissible rows zeroed), ``admissible[B, N]``,
        ``gram[B, N, N]``, ``starts[B, K, N] = <v0_k, z_j>``, ``start_norms[B, K] =
        ||v0_k||^2``, ``dropped[B, N]`` the bound on the products left out of each row
        (or ``None``)."""
        self.gram, self.starts, self.start_norms = gram, starts, start_norms
        self.excluded = ~admissible.unsqueeze(1)  # [B, 1, N]
        dim = z.shape[-1]
        self.dropped = None if dropped is None else dropped.unsqueeze(1)
        self.norms = torch.diagonal(gram, dim1=-2, dim2=-1)  # ||z_j||^2, [B, N]
        self.lengths = self.norms.sqrt()
        batch, k, n = starts.shape
        self.scale = starts.new_ones(batch, k)  # c_k
        self.weights = starts.new_zeros(batch, k, n)  # W_kj
        self.n = n
        self._slack_scale = torch.finfo(gram.dtype).eps * (ROUNDING_SLACK * math.sqrt(dim) + n)
        # rows that may be identical, by their starting distances and norms (see RowCopies)
        squared, slack = self._squared()
        keys = torch.cat([squared, self.norms.unsqueeze(1)], dim=1)
        slack = torch.cat([slack, self._slack_scale * self.norms.unsqueeze(1)], dim=1)
        self.copies = row_copies(z, admissible, keys, slack)

    def distances(self) -> tuple[Tensor, Tensor]:
        """``(distances, slack)``, each ``[B, K, N]``: every point's distance to every
        centre (``inf`` for inadmissible points; a copy of an earlier row gets that
        row's) and the rounding slack of its square."""
        squared, slack = self._squared()
        distances = mask_distances(squared.clamp_min(0).sqrt(), self.excluded)
        if self.copies is None:
            return distances, slack
        return self.copies.spread(distances), self.copies.spread(slack)

    def spread(self) -> Tensor:
        """The centres' spread ``c_k ||v0_k|| + sum_j W_kj ||z_j||``, ``[B, K]`` (see
        :func:`defenses.ball_membership.next_spread`)."""
        return self.scale * self.start_norms.clamp_min(0).sqrt() + torch.bmm(
            self.weights, self.lengths.unsqueeze(-1)).squeeze(-1)

    def _squared(self) -> tuple[Tensor, Tensor]:
        """``(squared distances, slack)`` to the current centres, each ``[B, K, N]``."""
        c = self.scale.unsqueeze(-1)
        through_points = torch.bmm(self.weights, self.gram)  # (W G)_kj
        dots = c * self.starts + through_points  # <z_j, v_k>
        centre_norms = (
            self.scale.square() * self.start_norms
            + 2 * self.scale * (self.weights * self.starts).sum(-1)
            + (through_points * self.weights).sum(-1)
        )
        squared = self.norms.unsqueeze(1) - 2 * dots + centre_norms.unsqueeze(-1)
        spread = self.spread()
        slack = self._slack_scale * (self.lengths.unsqueeze(1) + spread.unsqueeze(-1)).square()
        return squared, slack if self.dropped is None else slack + self.dropped

    def step(self, inside: Tensor) -> None:
        """Eq. 24 with the ball ``inside[B, K, N]``: ``c <- a c``, ``W <- a W + 1/N``
        on the ball."""
        keep = 1 - inside.sum(-1).to(self.weights.dtype) / self.n  # a_l, [B, K]
        self.scale = keep * self.scale
        self.weights = keep.unsqueeze(-1) * self.weights + inside.to(self.weights.dtype) / self.n

    def centres(self, z: Tensor, v0: Tensor) -> Tensor:
        """The coordinates, from ``v0`` and the rows with a non-zero weight."""
        return weighted_rows(self.weights, z).addcmul_(self.scale.unsqueeze(-1), v0)

    def centres_of(self, z: Tensor, v0: Tensor, problems: Tensor) -> Tensor:
        """:meth:`centres` of the problems ``problems[P]`` only, ``[P, K, d]``."""
        sums = weighted_rows(self.weights[problems], z, problems)
        return sums.addcmul_(self.scale[problems].unsqueeze(-1), v0[problems])


def run_pairwise(
    z: Tensor,
    v0: Tensor,
    admissible: Tensor,
    products: PairwiseProducts,
    start_index: Tensor | None,
    policy: RadiusPolicy,
    rounds: int,
    final: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``rounds`` rounds of eq. 24 from :func:`pairwise_products` of the points (``z``
    with inadmissible rows zeroed; the products as computed from the raw rows, with
    ``starts`` ``None`` when the centres start at the points ``start_index``).
    Returns ``(centres, inside, tau, distances)``, the last every point's distance to
    the final centres when ``final``, else ``None``.  Should a far row whose products
    were left out ever enter a ball (a radius of its size), the rounds are run again
    from all products."""
    gram, starts = products.gram, products.starts
    if not bool(admissible.all()):
        pair = admissible.unsqueeze(-1) & admissible.unsqueeze(-2)
        gram = gram.masked_fill(~pair, 0.0)
        if starts is not None:
            starts = starts.masked_fill(~admissible.unsqueeze(1), 0.0)
    if starts is None:  # rows of the masked gram: a start at an inadmissible point is 0
        starts = torch.gather(gram, 1, start_index.unsqueeze(-1).expand(-1, -1, gram.shape[-1]))
    combination = _Combination(z, admissible, gram, starts, products.start_norms, products.dropped)
    inside = torch.zeros(starts.shape, dtype=torch.bool, device=z.device)
    tau = z.new_zeros(starts.shape[:-1])
    for round_index in range(rounds):
        while True:
            distances, slack = combination.distances()
            tolerance = tie_tolerance(combination.lengths, combination.spread())
            squared = distances.square()
            lower = mask_distances((squared - slack).clamp_min(0).sqrt(), ~torch.isfinite(distances))
            distances = read_ties(z, partial(combination.centres_of, z, v0), admissible, distances, lower,
                                  (squared + slack).sqrt(), tolerance, policy, round_index)
            tau = policy(distances, round_index)
            inside = inside_ball(distances, tau, policy.strict, tolerance)
            if combination.copies is None or not combination.copies.split(inside):
                break  # else identical rows were split: again with their first copy's distances
        combination.step(inside)
    if products.far is not None and bool(combination.weights[..., products.far].any()):
        every = PairwiseProducts(*_all_products(z, v0, start_index), products.start_norms)
        return run_pairwise(z, v0, admissible, every, start_index, policy, rounds, final)
    distances = combination.distances()[0] if final else None
    return combination.centres(z, v0), inside, tau, distances
