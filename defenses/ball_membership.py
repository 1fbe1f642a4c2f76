"""Ball membership of Threshold-Clustering (Werner et al., Alg. 3, eq. 24), its
rounding checks and the identical rows that must share it, shared by every distance
evaluation in :mod:`defenses.threshold_clustering` and
:mod:`defenses.pairwise_clustering`."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from robust_pfl.engine.rows import euclidean_distances
from defenses.radius import RadiusPolicy
from defenses.row_reads import scratch
from robust_pfl.engine.devices import engine

# Widening of the distance intervals for rounding, in units of the dtype's epsilon
# times ``sqrt(d) (||z_j||^2 + ||v||^2)``: the rounding error of a length-d inner
# product stays well inside it, so a point decided by its interval is decided as its
# computed distance would decide it.
ROUNDING_SLACK = 4.0

# The tie rule's tolerance, in units of the dtype's epsilon times ``||z_j||`` plus the
# centre's spread (see ``next_spread``): well above the distance error of a centre moved
# by rounded sums for tens of rounds (a few units each).  For points far from the origin
# relative to their spread it widens the balls noticeably (docs/design.md, "The tie rule").
TIE_ULPS = 64.0


def tie_tolerance(lengths: Tensor, spread: Tensor) -> Tensor:
    """``[..., K, N]``: how close to the radius a distance is a tie, ``TIE_ULPS * eps *
    (||z_j|| + s_k)`` for points of norms ``lengths[..., N]`` (0 for inadmissible
    ones) and centres of spread ``spread[..., K]`` (:func:`next_spread`, at least
    ``||v_k||``).

    The tie rule of every evaluation: a point whose distance is within this tolerance
    of the radius is inside the ball (outside when the inclusion is ``strict``).
    Distances computed by different arithmetic (coordinates, inner products, other
    centres' rounding) differ by far less than it, so a point at a radius in exact
    arithmetic (a copy, a mirror image, a point equidistant with the one the quantile
    reads) gets one membership whichever evaluation computed it."""
    eps = torch.finfo(lengths.dtype).eps
    return TIE_ULPS * eps * (lengths.unsqueeze(-2) + spread.unsqueeze(-1))


def next_spread(spread: Tensor, inside: Tensor, lengths: Tensor, n: float | Tensor) -> Tensor:
    """Eq. 24 applied to norms, ``s_l = a_l s_{l-1} + (1/N) sum_{j in ball} ||z_j||``
    (``s_0 = ||v_0||``), ``[..., K]``, for the balls ``inside[..., K, N]``, the points'
    norms ``lengths[..., N]`` and ``n`` (N, or a tensor broadcasting to ``[..., K]``):
    a bound on ``||v_l||`` and the magnitude of what the centre's sums rounded, which
    :func:`tie_tolerance` scales with."""
    weights = inside.to(lengths.dtype)
    keep = 1 - weights.sum(-1) / n
    return keep * spread + torch.bmm(weights, lengths.unsqueeze(-1)).squeeze(-1) / n


def inside_ball(distances: Tensor, tau: Tensor, strict: bool, tolerance: Tensor) -> Tensor:
    """``[..., K, N]``: the points within radius ``tau[..., K]`` by the tie rule
    (:func:`tie_tolerance`): ``d <= tau + tolerance``, or ``d < tau - tolerance`` when
    ``strict``; a point at infinite distance (inadmissible) never is."""
    tau = tau.unsqueeze(-1)
    within = distances < tau - tolerance if strict else distances <= tau + tolerance
    return within & torch.isfinite(distances)


def open_memberships(lower: Tensor, upper: Tensor, tau_low: Tensor, tau_high: Tensor, tolerance: Tensor,
                     strict: bool) -> Tensor:
    """``[..., K, N]``: the points whose membership by the tie rule the intervals
    ``lower <= d <= upper`` and ``tau_low <= tau <= tau_high`` leave open (some
    values inside, others outside)."""
    if strict:
        certain = (upper < tau_low.unsqueeze(-1) - tolerance) | (lower >= tau_high.unsqueeze(-1) - tolerance)
    else:
        certain = (upper <= tau_low.unsqueeze(-1) + tolerance) | (lower > tau_high.unsqueeze(-1) + tolerance)
    return ~certain & torch.isfinite(lower)


def read_ties(
    z: Tensor,
    centres_of: Callable[[Tensor], Tensor],
    admissible: Tensor,
    distances: Tensor,
    lower: Tensor,
    upper: Tensor,
    tolerance: Tensor,
    policy: RadiusPolicy,
    round_index: int,
) -> Tensor:
    """``distances[B, K, N]`` with the distance from coordinates (as the direct
    evaluation computes it; to the centres ``centres_of(problems[P]) -> [P, K, d]``)
    of every point whose membership by the tie rule the rounding
    intervals ``lower <= d <= upper`` of an inner-product evaluation leave open, and,
    in the balls that have one, of the points the radius may be read from (the
    policy's ``undecided``; every point for a policy without one).  The rest keep
    their values: their intervals lie
    wholly on one side of the radius's range widened by the tie tolerance, so any
    value in them decides alike.  Inner products round by ``eps sqrt(d)`` times the
    squared norms, far more than the tie tolerance; coordinates round by less than it."""
    if policy.undecided is None:
        rows = admissible
    else:
        tau_low, tau_high = policy(lower, round_index), policy(upper, round_index)
        wanted = open_memberships(lower, upper, tau_low, tau_high, tolerance, policy.strict)
        if not bool(wanted.any()):
            return distances  # every membership is decided, whatever the radius's exact value
        wanted |= policy.undecided(lower, upper) & wanted.any(-1, keepdim=True)
        rows = wanted.any(1) & admissible
    exact = _coordinate_distances(z, centres_of, rows)
    return torch.where(rows.unsqueeze(1), mask_distances(exact, ~admissible.unsqueeze(1)), distances)


# Bytes of centre copies per block of rows in ``_coordinate_distances``.
_COORDINATE_BLOCK_BYTES = 64 << 20
# Up to how many problems the blocked engine compares each problem's chosen rows with
# its own centres (a loop over problems) rather than gathering centre copies per row:
# FC's chunks of receivers on the CPU hold one to three problems of hundreds of rows.
_FEW_PROBLEMS = 4


def _coordinate_distances(z: Tensor, centres_of: Callable[[Tensor], Tensor], rows: Tensor) -> Tensor:
    """``[B, K, N]``: the distances of the rows ``rows[B, N]`` of ``z[B, N, d]`` to the
    centres of their problems by :func:`euclidean_distances` (other entries ``inf``).
    Only the problems with a chosen row have their centres formed; the chosen rows
    are read in blocks (a loop over row blocks, not clients)."""
    problems = rows.any(-1).nonzero().squeeze(-1)
    centres = centres_of(problems)  # [P, K, d]
    if bool(rows.all()):
        return euclidean_distances(centres, z)
    k, dim = centres.shape[1:]
    out = z.new_full((z.shape[0], k, z.shape[1]), math.inf)
    if problems.numel() <= (1 if engine(z.device) == "batched" else _FEW_PROBLEMS):
        return _few_problem_distances(z, centres, rows, problems, out)
    position = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    position[problems] = torch.arange(problems.numel(), device=z.device)
    problem, row = rows.nonzero().unbind(-1)
    flat_rows, flat_centres = z.reshape(-1, dim), centres.reshape(-1, k * dim)
    block = min(problem.numel(), max(1, _COORDINATE_BLOCK_BYTES // max(1, k * dim * z.element_size())))
    # gathered into reused buffers: fresh multi-MB tensors would page-fault on every call
    row_buffer = scratch("tie-rows", (block, dim), z)
    centre_buffer = scratch("tie-centres", (block, k * dim), z)
    for start in range(0, problem.numel(), block):
        p, r = problem[start : start + block], row[start : start + block]
        picked = torch.index_select(flat_rows, 0, p * z.shape[1] + r, out=row_buffer[: p.numel()])
        around = torch.index_select(flat_centres, 0, position[p], out=centre_buffer[: p.numel()])
        distances = euclidean_distances(around.view(-1, k, dim), picked.unsqueeze(1))
        out[p, :, r] = distances.squeeze(-1)
    return out


def _few_problem_distances(z: Tensor, centres: Tensor, rows: Tensor, problems: Tensor, out: Tensor) -> Tensor:
    """:func:`_coordinate_distances` when the chosen rows belong to few problems (MC's
    clustering, FC's chunks of one to three receivers on the CPU): each problem's rows,
    gathered in blocks, are compared with its ``K`` centres directly, so no centre is
    copied per row (the general path copies ``K d`` values per chosen row, as many as
    the rows themselves or more).  A loop over problems, not clients.  Each distance is
    computed by the same difference formula on the same two rows, so the values are
    those of the general path, bit for bit."""
    k, dim = centres.shape[1:]
    budget = max(1, _COORDINATE_BLOCK_BYTES // max(1, dim * z.element_size()))
    for position, problem in enumerate(problems.tolist()):
        (chosen,) = rows[problem].nonzero(as_tuple=True)
        block = chosen.numel() if engine(z.device) == "batched" else min(chosen.numel(), budget)
        row_buffer = scratch("tie-rows", (block, dim), z)  # one gather and product on an accelerator
        for start in range(0, chosen.numel(), block):
            part = chosen[start : start + block]
            picked = torch.index_select(z[problem], 0, part, out=row_buffer[: part.numel()])
            out[problem][:, part] = euclidean_distances(centres[position], picked)
    return out


# Columns compared when looking for identical rows: runs of one 64-byte cache line
# (float32) spread over the row tell most candidate pairs apart without reading whole
# rows; a wider probe costs several times as much (benchmarks/README.md,
# "Kernel choices").
_PROBE_RUNS, _PROBE_WIDTH = 16, 16


class RowCopies:
    """Identical rows (a mimic attack's copies) among the points of an inner-product
    evaluation, so that they never end on opposite sides of a radius.

    Those evaluations round each row's distances according to where the row sits in a
    product, so identical rows can get distances a rounding apart and be split by a
    radius between them.  ``pairs`` are candidate pairs (rows that may be identical);
    when a round's memberships split one, :meth:`split` compares the two rows and, if
    they are equal, every row from then on takes its first copy's distances
    (:meth:`spread`); the round is then evaluated again.  Rows are read only for the
    candidate pairs that a round splits (for identical rows, exact ties at the radius)."""

    def __init__(self, z: Tensor, problem: Tensor, first: Tensor, second: Tensor) -> None:
        """Candidate pairs ``(problem[p], first[p], second[p])`` of rows of ``z[B, N, d]``,
        ``first < second``."""
        self.z = z
        self.pairs = (problem, first, second)
        self.confirmed = (problem[:0], first[:0], second[:0])
        self.first: Tensor | None = None  # [B, N]: each row's first confirmed copy

    def spread(self, values: Tensor) -> Tensor:
        """``values[B, K, N]`` with every row's entries replaced by its first copy's."""
        if self.first is None:
            return values
        return values.gather(-1, self.first.unsqueeze(-2).expand_as(values))

    def split(self, inside: Tensor) -> bool:
        """Compare the candidate pairs on opposite sides of some ball of ``inside[B, K,
        N]`` (and drop them from the candidates); True when some were identical, so
        that the distances, now spread from first copies, must be evaluated again."""
        problem, first, second = self.pairs
        apart = (inside[problem, :, first] != inside[problem, :, second]).any(-1)
        if not bool(apart.any()):
            return False
        self.pairs = (problem[~apart], first[~apart], second[~apart])
        problem, first, second = problem[apart], first[apart], second[apart]
        equal = _equal_rows(self.z, problem, first, second)
        if not bool(equal.any()):
            return False
        found = (problem[equal], first[equal], second[equal])
        self.confirmed = tuple(torch.cat([old, new]) for old, new in zip(self.confirmed, found))
        self.first = _first_of_groups(self.z.shape[:2], *self.confirmed)
        return True


def row_copies(z: Tensor, admissible: Tensor, keys: Tensor, slack: Tensor) -> RowCopies | None:
    """The candidate identical rows of ``z[B, N, d]`` (inadmissible rows excluded), or
    ``None`` when there are none.  Identical rows have bit-identical coordinates, so
    rows are first grouped by a hash of a few spread columns (two sorts of ``B N``
    integers); only rows of one group are paired, and a pair stays a candidate where its
    ``keys[B, M, N]`` (values identical rows share up to ``slack[B, M, N]``: squared
    distances to the starting centres and squared norms) agree within the summed
    slack.  Every pair of a group is kept: a row crafted to match another's spread
    columns cannot hide the copies that share its group."""
    problem, row = admissible.nonzero().unbind(-1)
    if problem.numel() < 2:
        return None
    key = _probe_hash(_probe_columns(z)[problem, row])
    order = torch.argsort(key, stable=True)
    order = order[torch.argsort(problem[order], stable=True)]  # by problem, then key, then row
    problem, row, key = problem[order], row[order], key[order]
    starts = torch.ones_like(problem, dtype=torch.bool)
    starts[1:] = (problem[1:] != problem[:-1]) | (key[1:] != key[:-1])
    group = starts.cumsum(0)
    counts = torch.bincount(group)
    shared = counts[group] > 1
    if not bool(shared.any()):
        return None
    problem, row, group = problem[shared], row[shared], group[shared]
    parts = []
    for shift in range(1, int(counts.max())):  # pairs `shift` apart within a group
        same = group[shift:] == group[:-shift]
        parts.append((problem[shift:][same], row[:-shift][same], row[shift:][same]))
    problem, first, second = (torch.cat(column) for column in zip(*parts))
    close = ((keys[problem, :, first] - keys[problem, :, second]).abs()
             <= slack[problem, :, first] + slack[problem, :, second]).all(-1)
    if not bool(close.any()):
        return None
    return RowCopies(z, problem[close], first[close], second[close])


def _probe_hash(probes: Tensor) -> Tensor:
    """``[R]`` int64 hash of each row of ``probes[R, w]``: the coordinates' float64 bits
    times fixed odd multipliers, summed with wrap-around.  Integer sums do not depend on
    their order, so identical rows hash identically (``-0.0`` counts as ``0.0``); a
    collision only adds a candidate pair, which the keys and the full comparison judge."""
    bits = (probes.to(torch.float64) + 0.0).view(torch.int64)
    generator = torch.Generator().manual_seed(0)
    multipliers = torch.randint(-(2**62), 2**62, (probes.shape[-1],), generator=generator) * 2 + 1
    return (bits * multipliers.to(bits.device)).sum(-1)


def _probe_columns(z: Tensor) -> Tensor:
    """The columns of ``z[B, N, d]`` that :func:`row_copies` compares, as a ``[B, N, w]``
    copy: ``_PROBE_RUNS`` runs of ``_PROBE_WIDTH`` spread over the row (all of it for
    small ``d``)."""
    dim = z.shape[-1]
    if dim <= _PROBE_RUNS * _PROBE_WIDTH:
        return z
    step = dim // _PROBE_RUNS
    return torch.cat([z[..., start : start + _PROBE_WIDTH] for start in range(0, _PROBE_RUNS * step, step)], dim=-1)


def _equal_rows(z: Tensor, problem: Tensor, first: Tensor, second: Tensor) -> Tensor:
    """``[P]``: whether rows ``first[p]`` and ``second[p]`` of problem ``problem[p]`` are
    equal in every coordinate.  The pairs are the few that a round split; one
    ``torch.equal`` per pair reads both rows in place and stops at the first difference
    (a batched gather and compare copies the rows first, and is slower;
    benchmarks/README.md, "Kernel choices")."""
    pairs = zip(problem.tolist(), first.tolist(), second.tolist())
    return torch.tensor([torch.equal(z[b, i], z[b, j]) for b, i, j in pairs], dtype=torch.bool, device=z.device)


def _first_of_groups(shape: torch.Size, problem: Tensor, first: Tensor, second: Tensor) -> Tensor:
    """``[B, N]``: the smallest row that the pairs join to each row (itself if none)."""
    batch, n = shape
    labels = torch.arange(n, device=problem.device).repeat(batch, 1)
    ends = torch.cat([problem * n + first, problem * n + second])
    while True:
        low = torch.minimum(labels[problem, first], labels[problem, second])
        joined = labels.view(-1).scatter_reduce(0, ends, torch.cat([low, low]), "amin").view(batch, n)
        joined = joined.gather(-1, joined)  # a label's own label
        if torch.equal(joined, labels):
            return labels
        labels = joined


def mask_distances(distances: Tensor, excluded: Tensor) -> Tensor:
    """``inf`` for NaN distances and for the points in ``excluded`` (``[..., 1, N]``,
    the inadmissible ones: ``~admissible.unsqueeze(-2)``)."""
    return distances.masked_fill(excluded | torch.isnan(distances), math.inf)
