"""Threshold-Clustering (Werner et al., Alg. 3, eq. 24) as a pure batched function.

For rounds l = 1..M and each centre k, with radius tau_{k,l} from a policy::

    v_{k,l} = (1/N) sum_j [ z_j        if ||z_j - v_{k,l-1}|| <= tau_{k,l}
                            v_{k,l-1}  otherwise ]

i.e. ``v_l = a_l v_{l-1} + (1/N) sum_{j inside} z_j`` with ``a_l = 1 - |inside| / N``:
note ``1/N``, not ``1/|inside|``.  Every method computes it in this form, so a ball
that holds every point gives their mean exactly, however far ``v_{l-1}`` was.
Centres are updated independently (balls may overlap).

Robustness rule: a point with a non-finite coordinate or a non-finite squared norm is
*inadmissible*: it is infinitely far from every centre and never inside a ball, so no
NaN, Inf or overflowing Byzantine row can reach a centre.

Edge cases, alike for every method and radius policy: with no points (``N = 0``) no
round runs (eq. 24 divides by ``N``, and nothing can enter a ball), so the centres come
back unchanged with empty memberships and radius 0, as with ``rounds = 0``; no centres
(``K = 0``), no problems (``B = 0``) or ``d = 0`` give results of those shapes; a fixed
radius beyond the dtype's range is ``inf``.  float16 and bfloat16 work too (the direct
distances are taken in float32 and rounded back).  Identical points always share their
memberships (see :class:`defenses.ball_membership.RowCopies`).

Three numerically different but mathematically equal evaluations:

* ``method="direct"``: distances from the point coordinates, ``O(M K N d)`` memory
  passes; exact to rounding.
* ``method="gram"``: distances from inner products ``<z_j, v_k>``, carried from round
  to round: one product with the points per round whose memberships changed, plus
  a read of the changed rows; the coordinates are updated explicitly.  Much faster
  for large ``d`` (FC on an MLP).
* ``method="pairwise"``: distances from the points' Gram matrix, one ``N^2 d``
  product at matmul speed, then only scalars (:mod:`defenses.pairwise_clustering`).
  Faster than ``"gram"`` for a few dozen points per problem, slower for hundreds.

The tie rule, which all three follow (:func:`defenses.ball_membership.tie_tolerance`):
a distance within ``TIE_ULPS eps (||z_j|| + s_k)`` of the radius is inside the ball
(outside with ``strict``).  Inner products lose precision when distances are tiny
relative to the points' norms, so ``"gram"`` and ``"pairwise"`` read from coordinates
every point whose rounding interval leaves its membership open
(:func:`defenses.ball_membership.read_ties`): the three give the same memberships on
ties made in exact arithmetic (docs/design.md, "The tie rule").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable, Literal

import torch
from torch import Tensor

from defenses.ball_membership import (
    ROUNDING_SLACK,
    inside_ball,
    mask_distances,
    next_spread,
    read_ties,
    row_copies,
    tie_tolerance,
)
from defenses.pairwise_clustering import pairwise_products, run_pairwise
from robust_pfl.engine.rows import WIDENED_DTYPES, admissible_points, euclidean_distances, squared_norms
from defenses.radius import RadiusPolicy, RadiusSpec, make_radius
from defenses.row_reads import row_products, scratch, weighted_rows
from robust_pfl.engine.rows import rowdot
from robust_pfl.engine.devices import engine

Method = Literal["direct", "gram", "pairwise"]
METHODS: tuple[str, ...] = ("direct", "gram", "pairwise")


@dataclass(frozen=True)
class ClusteringResult:
    """Output of :func:`threshold_clustering`.

    ``centres[..., K, d]`` after the last round; ``inside[..., K, N]`` the membership of
    the last round's balls; ``radius[..., K]`` the last round's radii;
    ``distances[..., K, N]`` from every point to the returned centres (``inf`` for
    inadmissible points or centres), only when asked for, else ``None``;
    ``nearest[..., N]`` the index of every point's nearest returned centre (0 for an
    inadmissible point), only when asked for, else ``None``.
    """

    centres: Tensor
    inside: Tensor
    radius: Tensor
    distances: Tensor | None = None
    nearest: Tensor | None = None


def _narrowed(result: ClusteringResult, dtype: torch.dtype) -> ClusteringResult:
    """``result`` (computed in float32) with its values rounded back to ``dtype``."""
    return ClusteringResult(
        result.centres.to(dtype),
        result.inside,
        result.radius.to(dtype),
        None if result.distances is None else result.distances.to(dtype),
        result.nearest,
    )


def threshold_clustering(
    points: Tensor,
    centres: Tensor,
    radius: RadiusSpec,
    rounds: int = 10,
    *,
    method: Method = "direct",
    final_distances: bool = False,
    nearest: bool = False,
    cells: Tensor | Literal["nearest"] | None = None,
) -> ClusteringResult:
    """Run ``rounds`` rounds of Threshold-Clustering.

    Args:
        points: ``[N, d]`` or ``[B, N, d]`` (B independent problems, e.g. one per FC
            client).
        centres: initial centres ``[K, d]`` or ``[B, K, d]``, or the indices of the
            points they start at (an integer ``[K]`` or ``[B, K]``; FC starts at the
            receiver's own gradient, and ``"pairwise"`` then takes its products from
            the Gram matrix).  An inadmissible (non-finite) initial centre is
            returned unchanged and captures no point, so a diverged client never
            crashes the round.
        radius: a radius policy, a number (fixed radius) or a mapping
            ``{"policy": "quantile", "q": 0.2}`` (see :mod:`defenses.radius`).
        rounds: number of rounds ``M`` (the paper uses 10); 0, or no points, returns
            the starting centres.
        method: ``"direct"``, ``"gram"`` or ``"pairwise"`` (see module docstring).
        final_distances: also return every point's distance to the final centres,
            from coordinates whatever the method (one more pass over the points for
            ``"gram"`` and ``"pairwise"``).
        nearest: also return every point's nearest final centre (Alg. 4's
            assignment), from those distances.
        cells: restrict each centre's ball to its cell (not in Alg. 3, whose balls
            may overlap): ``"nearest"``, the points nearest to the centre in each
            round (a trimmed Lloyd step with eq. 24's ``1/N`` weight), or ``[N]``
            (``[B, N]``) indices of the centre each point may join (a fixed
            assignment).  Two centres then never share a point, so correct centres
            closer than their clusters' spread keep their own points instead of
            drifting to one place.  ``method="direct"`` or ``"gram"`` (whose cells
            come from its distances, exact for the points near a radius and
            within rounding for the others).
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {method!r}")
    if points.dim() not in (2, 3):
        raise ValueError(f"points must be [N, d] or [B, N, d]; got {tuple(points.shape)}")
    if cells is not None and method == "pairwise":
        raise ValueError(f"cells: needs method='direct' or 'gram', got method={method!r}")
    policy = make_radius(radius)  # a policy (what the algorithms pass) is used as it is
    if points.dtype in WIDENED_DTYPES:
        # float16's squared norms overflow from ||z|| = 256: run in float32, round back
        wide = centres.float() if centres.is_floating_point() else centres
        result = threshold_clustering(points.float(), wide, policy, rounds, method=method,
                                      final_distances=final_distances, nearest=nearest, cells=cells)
        return _narrowed(result, points.dtype)
    batched = points.dim() == 3
    z = points if batched else points.unsqueeze(0)
    if z.shape[1] == 0:
        rounds = 0  # eq. 24 divides by N: with no points nothing enters a ball
    v0, start_index = _starting_centres(z, centres if batched else centres.unsqueeze(0))
    if nearest and v0.shape[1] == 0:
        raise ValueError(_NO_NEAREST)
    live = admissible_points(v0)  # [B, K]
    all_live = bool(live.all())
    start = v0 if all_live else torch.where(live.unsqueeze(-1), v0, torch.zeros_like(v0))
    # The inner-product evaluations read the points once for their norms and their
    # products with the initial centres (and, "pairwise", with each other); products
    # of inadmissible rows are never used.
    products = pairwise = None
    if method == "gram":
        norms, products = _norms_and_products(z, start)
    elif method == "pairwise":
        pairwise = pairwise_products(z, start, start_index)
        norms = torch.diagonal(pairwise.gram, dim1=-2, dim2=-1)
    else:
        norms = squared_norms(z)
    admissible = torch.isfinite(norms)
    clean = z
    if not bool(admissible.all()):
        clean = torch.where(admissible.unsqueeze(-1), z, 0.0)
        norms = torch.where(admissible, norms, 0.0)
    final = "exact" if final_distances else "nearest" if nearest else None
    fixed = cells if cells is None or isinstance(cells, str) else (cells if batched else cells.unsqueeze(0))
    if pairwise is not None:
        result = ClusteringResult(*run_pairwise(clean, start, admissible, pairwise, start_index, policy, rounds, False))
    elif products is None:
        result = _run_direct(clean, start, admissible, norms.sqrt(), policy, rounds, final, fixed)
    else:
        result = _run_gram(clean, start, admissible, norms, products, policy, rounds, fixed)
    distances = result.distances
    if final is not None and distances is None:
        # from coordinates, as direct computes them: inner products would leave near
        # ties of the nearest centre to rounding (docs/design.md, "The tie rule")
        distances = _direct_distances(result.centres, clean, admissible)
    if distances is not None and not all_live:
        distances = torch.where(live.unsqueeze(-1), distances, math.inf)
    result = ClusteringResult(
        result.centres if all_live else torch.where(live.unsqueeze(-1), result.centres, v0),
        result.inside & live.unsqueeze(-1),
        result.radius,
        distances if final_distances else None,
        distances.argmin(dim=-2) if nearest else None,
    )
    if batched:
        return result
    unbatched = {field.name: getattr(result, field.name) for field in fields(result)}
    return ClusteringResult(**{name: None if value is None else value[0] for name, value in unbatched.items()})


_NO_NEAREST = "nearest centre: needs at least one centre (K >= 1), got K = 0"


def _starting_centres(z: Tensor, centres: Tensor) -> tuple[Tensor, Tensor | None]:
    """``(v0[B, K, d], index)`` from ``centres``: coordinates ``[B, K, d]`` (``index``
    is ``None``), or the indices ``[B, K]`` of the points the centres start at (their
    rows are gathered; ``index`` is returned so that an evaluation that already has
    the points' products can reuse them)."""
    if not centres.is_floating_point():
        if centres.dim() != 2 or centres.shape[0] != z.shape[0]:
            raise ValueError(
                f"centres given as point indices must be [K] for points [N, d] or [B, K] for "
                f"points [B, N, d]; got {tuple(centres.shape)} for points {tuple(z.shape)}"
            )
        index = centres.to(device=z.device, dtype=torch.long)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= z.shape[1]):
            raise ValueError(f"centre indices must lie in [0, {z.shape[1]}); got {index.min()}..{index.max()}")
        return torch.gather(z, 1, index.unsqueeze(-1).expand(-1, -1, z.shape[-1])), index
    if centres.dim() != 3:
        raise ValueError(
            f"points must be [N, d] or [B, N, d] and centres [K, d] or [B, K, d] "
            f"with the same rank; got {tuple(z.shape)} and {tuple(centres.shape)}"
        )
    if z.shape[-1] != centres.shape[-1]:
        raise ValueError(f"points and centres differ in dimension: {z.shape[-1]} vs {centres.shape[-1]}")
    if z.shape[0] != centres.shape[0]:
        raise ValueError(f"points and centres differ in batch size: {z.shape[0]} vs {centres.shape[0]}")
    return centres.to(z.dtype), None


# Row blocks of :func:`_norms_and_products`, per centre: about one core's L2 cache
# (2.5 MiB), so each block, read once, serves both results while cached: faster than
# two products over all rows, and than larger blocks.  With K centres a block of K
# times as many rows keeps the small ``[rows, d] x [d, K]`` products efficient (for
# K = 1 the 2.5 MiB blocks stay best; benchmarks/README.md, "Kernel choices").
_FUSED_BLOCK_BYTES = 5 << 19


def _norms_and_products(z: Tensor, centres: Tensor) -> tuple[Tensor, Tensor]:
    """``||z_j||^2`` (``[B, N]``) and ``<z_j, centres_k>`` (``[B, K, N]``) in one read of
    the points: each cache-sized block of rows is used for both while it is cached.
    The loop is over blocks of rows (and problems), not clients."""
    batch, n, dim = z.shape
    rows = max(1, _FUSED_BLOCK_BYTES * centres.shape[1] // (max(dim, 1) * z.element_size()))
    if rows >= n or engine(z.device) == "batched":  # an accelerator: two products, not a loop of small ones
        return squared_norms(z), torch.bmm(centres, z.transpose(1, 2))
    norms = z.new_empty(batch, n)
    products = z.new_empty(batch, n, centres.shape[1])
    for b in range(batch):
        transposed = centres[b].transpose(0, 1)
        # views made once per problem: the per-block work is one self-dot and one product
        for block, norm, product in zip(z[b].split(rows), norms[b].split(rows), products[b].split(rows)):
            row = block.unsqueeze(1)  # as in squared_norms (same layout, same rounding)
            torch.bmm(row, row.transpose(1, 2), out=norm.view(-1, 1, 1))
            torch.mm(block, transposed, out=product)
    return norms, products.transpose(1, 2)


def _run_direct(
    z: Tensor,
    v: Tensor,
    admissible: Tensor,
    lengths: Tensor,
    policy: RadiusPolicy,
    rounds: int,
    final: str | None,
    cells: Tensor | Literal["nearest"] | None = None,
) -> ClusteringResult:
    """Eq. 24 from coordinates (``lengths[B, N]``: the points' norms, 0 for
    inadmissible ones); ``final`` (any value) adds the final distances; ``cells``
    restricts every ball to its centre's cell (see :func:`threshold_clustering`)."""
    v = v.clone()  # the returned centres never alias the caller's (rounds = 0)
    n = z.shape[-2]
    inside = torch.zeros(*v.shape[:-1], n, dtype=torch.bool, device=z.device)
    tau = v.new_zeros(v.shape[:-1])
    spread = torch.linalg.vector_norm(v, dim=-1)
    for round_index in range(rounds):
        distances = _direct_distances(v, z, admissible)
        tau = policy(distances, round_index)
        inside = inside_ball(distances, tau, policy.strict, tie_tolerance(lengths, spread))
        if cells is not None and v.shape[-2] > 1:
            inside &= _cell_members(distances, cells)
        spread = next_spread(spread, inside, lengths, n)
        weights = inside.to(z.dtype)
        keep = 1 - weights.sum(-1, keepdim=True) / n  # a_l; exactly 0 when every point is inside
        v = keep * v + torch.bmm(weights, z) / n
    return ClusteringResult(v, inside, tau, _direct_distances(v, z, admissible) if final else None)


def _cell_members(distances: Tensor, cells: Tensor | Literal["nearest"]) -> Tensor:
    """``[B, K, N]``: whether point ``j`` lies in centre ``k``'s cell, the centre
    nearest to it (lowest index on ties) or the one ``cells[B, N]`` names."""
    owner = distances.argmin(dim=-2) if isinstance(cells, str) else cells.to(device=distances.device, dtype=torch.long)
    centres = torch.arange(distances.shape[-2], device=distances.device)
    return owner.unsqueeze(-2) == centres.view(1, -1, 1)


def _direct_distances(v: Tensor, z: Tensor, admissible: Tensor) -> Tensor:
    return mask_distances(euclidean_distances(v, z), ~admissible.unsqueeze(-2))


def _run_gram(
    z: Tensor,
    v0: Tensor,
    admissible: Tensor,
    norms: Tensor,
    products: Tensor,
    policy: RadiusPolicy,
    rounds: int,
    cells: Tensor | Literal["nearest"] | None = None,
) -> ClusteringResult:
    """Eq. 24 evaluated through inner products, reading only the points a round needs
    (``cells``: see :func:`threshold_clustering`).

    The centres are updated explicitly, ``v_l = a_l v_{l-1} + w_l / N`` with
    ``a_l = 1 - |inside_l| / N`` and the ball sum ``w_l``; distances come from
    ``||z_j||^2 - 2 <z_j, v> + ||v||^2``.  :class:`_CentreDots` keeps ``<z_j, v>`` for
    every point up to one residual vector and bounds the residual's contribution, which
    gives every distance an interval.  The radius policy's ``undecided`` names the
    points whose exact distance the round needs (those near its order statistics or
    its radius); only they are read.  When they are many, one product with all points
    makes every distance exact again.  See :class:`_CentreDots`.
    """
    k = v0.shape[1]
    dots = _CentreDots(z, norms, admissible, v0, products)
    inside = torch.zeros(z.shape[0], k, z.shape[1], dtype=torch.bool, device=z.device)
    tau = z.new_zeros(z.shape[0], k)
    for round_index in range(rounds):
        while True:
            distances = dots.distances(policy.undecided)
            tolerance = tie_tolerance(dots.lengths, dots.spread)
            lower, upper = dots.intervals()
            distances = read_ties(z, dots.centres.__getitem__, admissible, distances, lower, upper, tolerance,
                                  policy, round_index)
            tau = policy(distances, round_index)
            entered = inside_ball(distances, tau, policy.strict, tolerance)
            if cells is not None and k > 1:
                entered &= _cell_members(distances, cells)
            if dots.copies is None or not dots.copies.split(entered):
                break  # else identical rows were split: again with their first copy's distances
        change = None
        if bool((entered ^ inside).any()):
            change = entered.to(z.dtype) - inside.to(z.dtype)  # [B, K, N], entries 0 / +-1
        inside = entered
        dots.step(change, inside)
    return ClusteringResult(dots.centres, inside, tau)


# A round reads the rows whose distance it needs; when that is more than this share
# of the rows, one product with every row is taken instead, which also makes every
# distance exact again.  A row read by itself costs more than its share of a full
# product, so past some share the full product is cheaper; 0.3 is the share that did
# best when FC's clustering was replayed on Fig. 6 gradients (benchmarks/README.md,
# "Kernel choices").
_FULL_PRODUCT_SHARE = 0.3

class _CentreDots:
    """Inner products ``<z_j, v_k>`` of every point with moving centres, kept lazily.

    Each centre is ``v = sigma x + t b + rho``: ``x`` and ``b`` are vectors whose
    products with every point are known (``x_dots``, ``b_dots``), ``sigma, t`` scalars,
    and ``rho`` a residual whose products are not all kept.  Write ``<z_j, rho> =
    c_j + <z_j, delta_j>`` where ``c_j`` is known and ``delta_j`` is ``rho`` itself
    (``c_j = 0``) or, for the points read at the latest read, ``rho - alpha rho_s``
    (``c_j = alpha <z_j, rho_s>``).  With ``E_j = ||z_j||^2 - 2 sigma <z_j, x> -
    2 t <z_j, b> + ||v||^2 - 2 c_j - 2 <v, delta_j>`` and ``R_j = ||delta_j||``,

        ``d_j^2 = E_j - 2 <z_j - v, delta_j>``, and ``|<z_j - v, delta_j>| <= d_j R_j``,

    so ``sqrt(E_j + R_j^2) - R_j <= d_j <= sqrt(E_j + R_j^2) + R_j``: an interval from
    scalars alone.  ``rho`` grows only from the points that enter or leave a ball
    (divided by N), so ``R_j`` is small and few intervals reach the boundary; the
    points near it, read last round, are bounded by last round's change alone.  A
    point whose exact distance is needed costs one inner product ``<z_j, rho>``;
    ``full_product`` computes them for every point and moves ``rho`` into the basis
    (``x := v``, ``b :=`` the ball sum), after which ``rho = 0``.
    """

    def __init__(self, z: Tensor, norms: Tensor, admissible: Tensor, v0: Tensor, products: Tensor) -> None:
        """``products[B, K, N] = <z_j, v0_k>``, ``norms[B, N] = ||z_j||^2``."""
        batch, n, _ = z.shape
        k = v0.shape[1]
        self.z, self.norms, self.admissible, self.n = z, norms, admissible, n
        self.excluded = ~admissible.unsqueeze(1)  # [B, 1, N]: inadmissible points
        self.lengths = norms.sqrt()  # ||z_j||
        self.spread = torch.linalg.vector_norm(v0, dim=-1)  # see ball_membership.next_spread
        self.centres = v0.clone()
        self.x_dots = products
        self.b_dots = torch.zeros_like(self.x_dots)
        # [B, K, d] working vectors that never leave the call: reused scratch
        self.ball = scratch("ball", v0.shape, v0).zero_()  # b + pending: the ball sum
        self.pending = scratch("pending", v0.shape, v0).zero_()  # changes of the ball sum since b
        self.rho = scratch("rho", v0.shape, v0).zero_()
        self.sigma, self.t = z.new_ones(batch, k), z.new_zeros(batch, k)
        self.exact = True  # rho == 0
        # rho = gamma * pending while at most one ball change happened since the last
        # full product; a full product then needs the products with pending alone
        self.gamma: Tensor | None = z.new_zeros(batch, k)
        # the latest read: rho_s (a buffer), its scale alpha in today's rho, the rows
        # read and their products <z_j, rho_s>
        self.read: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        self._earlier: Tensor | None = None
        self._delta: Tensor | None = None
        self._centre_norms: Tensor | None = None
        self._known_now: Tensor | None = None
        self._slack_scale = ROUNDING_SLACK * torch.finfo(z.dtype).eps * math.sqrt(z.shape[-1])
        # rows that may be identical, by their starting distances and norms (see RowCopies)
        keys = torch.cat([self._known(), norms.unsqueeze(1)], dim=1)
        slack = torch.cat([self.slack(), self._slack_scale * norms.unsqueeze(1)], dim=1)
        self.copies = row_copies(z, admissible, keys, slack)

    def _known(self) -> Tensor:
        """``||z_j||^2 - 2 sigma <z_j, x> - 2 t <z_j, b> + ||v||^2``, ``[B, K, N]``;
        computed once per round (``step`` and ``full_product`` change it)."""
        if self._known_now is None:
            known = self.x_dots * self.sigma.unsqueeze(-1) + self.b_dots * self.t.unsqueeze(-1)
            self._known_now = self.norms.unsqueeze(1) - 2 * known + self.centre_norms().unsqueeze(-1)
        return self._known_now

    def _finish(self, squared: Tensor) -> Tensor:
        return mask_distances(squared.clamp_min(0).sqrt(), self.excluded)

    def centre_norms(self) -> Tensor:
        """``||v_k||^2`` of the current centres, ``[B, K]``; computed once per round."""
        if self._centre_norms is None:
            self._centre_norms = rowdot(self.centres, self.centres)
        return self._centre_norms

    def slack(self, centre_norms: Tensor | None = None) -> Tensor:
        """Rounding slack of every squared distance to the current centres, ``[B, K, N]``
        (to centres with the given ``||v||^2 [..., B, K]`` instead, ``[..., B, K, N]``)."""
        norms = self.centre_norms() if centre_norms is None else centre_norms
        return self._slack_scale * (self.norms.unsqueeze(1) + norms.unsqueeze(-1))

    def _bounds(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(lower, upper, estimate, settled)``, each ``[B, K, N]``: ``lower <=
        ||z_j - v_k|| <= upper`` for every point from scalars alone (``inf`` for
        inadmissible points), widened for rounding.

        Two bounds on the unknown ``<z_j, delta_j>`` are intersected: around the centre,
        ``|<z_j - v, delta_j>| <= d_j R_j`` (tight for points near it), and around the
        origin, ``|<z_j, delta_j>| <= ||z_j|| R_j`` (tight for points far from a centre
        that moved by large rows, e.g. honest rows seen from a centre among 1e6-sized
        attack rows).  ``settled`` marks the distances whose remaining uncertainty is
        within their rounding slack: an inner product would not resolve them further,
        so ``estimate`` (the squared distance without the unknown term, clamped into
        the interval) serves as their computed value and they are never read."""
        known = self._known()
        radius = torch.linalg.vector_norm(self.rho, dim=-1).unsqueeze(-1)  # [B, K, 1]
        free = known  # the squared distance without -2 <z_j, delta_j>
        centre_dot = rowdot(self.centres, self.rho).unsqueeze(-1)  # <v, delta_j>
        if self.read is not None:
            earlier, alpha, rows, products = self.read
            if self._delta is None:
                self._delta = scratch("delta", self.rho.shape, self.rho)
            delta = torch.addcmul(self.rho, earlier, -alpha.unsqueeze(-1), out=self._delta)
            picked = rows.unsqueeze(1)
            free = torch.where(picked, known - 2 * alpha.unsqueeze(-1) * products, known)
            centre_dot = torch.where(picked, rowdot(self.centres, delta).unsqueeze(-1), centre_dot)
            radius = torch.where(picked, torch.linalg.vector_norm(delta, dim=-1).unsqueeze(-1), radius)
        middle = (free - 2 * centre_dot + radius * radius).clamp_min(0).sqrt()
        reach = 2 * radius * self.lengths.unsqueeze(1)
        low = torch.maximum((middle - radius).clamp_min(0).square(), free - reach)
        high = torch.minimum((middle + radius).square(), free + reach)
        slack = self.slack()
        settled = (high - low) <= slack
        estimate = self._finish(torch.minimum(free.clamp_min(low), high))
        lower = ((low - slack).clamp_min(0)).sqrt()
        upper = (high + slack).clamp_min(0).sqrt()
        return mask_distances(lower, self.excluded), mask_distances(upper, self.excluded), estimate, settled

    def intervals(self) -> tuple[Tensor, Tensor]:
        """``(lower, upper)``, each ``[B, K, N]``: bounds on every point's distance to
        the current centres, rounding included (``inf`` for inadmissible points;
        identical rows take their first copy's)."""
        if self.exact:
            known, slack = self._known(), self.slack()
            lower, upper = self._finish(known - slack), self._finish(known + slack)
        else:
            lower, upper, _, _ = self._bounds()
        return self._spread(lower), self._spread(upper)

    def distances(self, undecided: Callable[[Tensor, Tensor], Tensor] | None) -> Tensor:
        """Distances to the current centres, ``[B, K, N]``: exact (or settled: exact to
        rounding, see :meth:`_bounds`) for every point the policy's ``undecided`` asks
        for (all points when it is ``None``); for the others the lower end of an
        interval that decides their membership the same way.  A row found identical to
        an earlier one gets that row's (see :class:`defenses.ball_membership.RowCopies`)."""
        if not self.exact and undecided is not None:
            lower, upper, estimate, settled = (self._spread(bound) for bound in self._bounds())
            wanted = undecided(lower, upper) & self.admissible.unsqueeze(1)
            rows = (wanted & ~settled).any(1)  # [B, N]
            if self.copies is not None and self.copies.first is not None:
                rows &= self.copies.first == torch.arange(self.n, device=rows.device)  # copies take their first's
            count = int(rows.sum(-1).max())
            if count <= _FULL_PRODUCT_SHARE * self.n:
                approximate = torch.where(settled, estimate, lower)
                if count == 0:
                    return approximate
                products = row_products(self.z, rows, self.rho)  # <z_j, rho>
                if self._earlier is None:
                    self._earlier = scratch("earlier", self.rho.shape, self.rho)
                self.read = (self._earlier.copy_(self.rho), torch.ones_like(self.sigma), rows, products)
                exact = self._finish(self._known() - 2 * products)
                return self._spread(torch.where(rows.unsqueeze(1), exact, approximate))
        if not self.exact:
            self.full_product()
        return self._spread(self._finish(self._known()))

    def _spread(self, values: Tensor) -> Tensor:
        """``values[B, K, N]`` with identical rows' entries taken from their first copy."""
        return values if self.copies is None else self.copies.spread(values)

    def full_product(self) -> None:
        """Products of every point with ``rho`` and the pending ball change; then
        ``x := v`` and ``b :=`` the ball sum, so that ``rho = 0``.  While ``rho`` is a
        multiple of the pending change, one product with it serves both."""
        k = self.rho.shape[1]
        if self.gamma is not None:
            pending = torch.bmm(self.z, self.pending.transpose(1, 2)).transpose(1, 2)  # [B, K, N]
            residual = self.gamma.unsqueeze(-1) * pending
        else:
            pair = scratch("pair", (self.rho.shape[0], 2 * k, self.rho.shape[-1]), self.rho)
            vectors = torch.cat([self.rho, self.pending], dim=1, out=pair)  # [B, 2K, d]
            products = torch.bmm(self.z, vectors.transpose(1, 2)).transpose(1, 2)  # [B, 2K, N]
            residual, pending = products[:, :k], products[:, k:]
        sigma, t = self.sigma.unsqueeze(-1), self.t.unsqueeze(-1)
        self.x_dots = sigma * self.x_dots + t * self.b_dots + residual
        self.b_dots = self.b_dots + pending
        self.pending.zero_()
        self.rho.zero_()
        self.gamma = torch.zeros_like(self.sigma)
        self.read = None
        self.sigma, self.t = torch.ones_like(self.sigma), torch.zeros_like(self.t)
        self._known_now = None
        self.exact = True

    def step(self, change: Tensor | None, inside: Tensor) -> None:
        """One round of eq. 24: ``change[B, K, N]`` (+1 entered, -1 left; ``None`` when
        no membership changed) and the balls ``inside[B, K, N]``.

        The ball sum of the explicit centres is summed afresh over its members in a
        ball that some row left, as ``"direct"`` sums it: subtracting a large row that
        left would keep its rounding (``eps ||z||``) in the sum, and the centres of the
        evaluations would drift apart by more than the tie tolerance."""
        weights = inside.to(self.z.dtype)
        if change is not None:
            delta = weighted_rows(change, self.z)
            self.pending += delta
            left = (change < 0).any(-1, keepdim=True)  # [B, K, 1]
            if bool(left.any()):
                fresh = weighted_rows(weights * left, self.z)
                torch.where(left, fresh, self.ball + delta, out=self.ball)
            else:
                self.ball += delta
            if self.gamma is not None and bool(self.gamma.ne(0).any()):
                self.gamma = None  # rho holds an earlier pending: no longer a multiple
        self.spread = next_spread(self.spread, inside, self.lengths, self.n)
        keep = 1 - weights.sum(-1) / self.n  # a_l, [B, K]
        self.centres.mul_(keep.unsqueeze(-1)).add_(self.ball, alpha=1.0 / self.n)
        self._centre_norms = self._known_now = None
        self.sigma, self.t = keep * self.sigma, keep * self.t + 1.0 / self.n
        if not self.exact or change is not None:
            self.rho.mul_(keep.unsqueeze(-1)).add_(self.pending, alpha=1.0 / self.n)
            self.exact = False
            if self.gamma is not None:
                self.gamma = keep * self.gamma + 1.0 / self.n
        if self.read is not None:
            earlier, alpha, rows, products = self.read
            self.read = (earlier, alpha * keep, rows, products)



def nearest_centre(
    points: Tensor, centres: Tensor, method: Literal["direct", "gram"] = "direct"
) -> Tensor:
    """Index of the nearest centre for each point (``[..., N]``); inadmissible points
    get centre 0.  The assignment rule of Alg. 4 (unstated in the paper).

    ``method="gram"`` ranks ``||v_k||^2 - 2 <z_j, v_k>`` (one product with the points
    instead of one difference per pair; near-ties may rank differently to rounding)."""
    if centres.shape[-2] == 0:
        raise ValueError(_NO_NEAREST)
    norms = squared_norms(points)
    admissible = torch.isfinite(norms)
    clean = points if bool(admissible.all()) else torch.where(admissible.unsqueeze(-1), points, 0.0)
    centres = centres.to(points.dtype)
    if method == "gram":
        distances = squared_norms(centres).unsqueeze(-2) - 2 * torch.matmul(clean, centres.transpose(-1, -2))
    else:
        distances = euclidean_distances(clean, centres)
    distances = torch.where(torch.isnan(distances), torch.full_like(distances, math.inf), distances)
    return torch.where(admissible, distances.argmin(dim=-1), 0)
