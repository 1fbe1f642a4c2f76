"""Ball membership of Threshold-Clustering (Werner et al., Alg. 3, eq. 24), its
rounding checks and the identical rows that must share it, shared by every distance
evaluation in :mod:`defenses.threshold_clustering` and
:mod:`defenses.pairwise_clustering`."""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

# Widening of the distance intervals for rounding, in units of the dtype's epsilon
# times ``sqrt(d) (||z_j||^2 + ||v||^2)``: the rounding error of a length-d inner
# product stays well inside it, so a point decided by its interval is decided as its
# computed distance would decide it.
ROUNDING_SLACK = 4.0

# A squared distance whose rounding slack (see ``ROUNDING_SLACK``) exceeds this share
# of it is resolved far worse by inner products than by coordinates (whose relative
# rounding is about the slack's share of ``d^2`` without the norms).
RESOLVABLE = 1e-2


def inside_ball(distances: Tensor, tau: Tensor, strict: bool) -> Tensor:
    """``[..., K, N]``: the points within radius ``tau[..., K]`` (``<`` when
    ``strict``); a point at infinite distance (inadmissible) never is."""
    tau = tau.unsqueeze(-1)
    within = distances < tau if strict else distances <= tau
    return within & torch.isfinite(distances)


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


def decided_by_rounding(distances: Tensor, tau: Tensor, slack: Tensor) -> bool:
    """Whether, in some round, some ball had two or more points within their rounding
    slack of its radius, each with a slack above ``RESOLVABLE`` of its squared
    distance: their order, hence their memberships, was then rounding, where the
    direct evaluation would resolve it.  (One such point alone is usually the point the
    quantile radius is read from, e.g. a single point sitting on its centre.)  All
    rounds at once: ``distances[R, B, K, N]``, ``tau[R, B, K]`` and the rounding slack
    of every squared distance, ``slack[R, B, K, N]``."""
    squared = distances.square()
    near = (squared - tau.unsqueeze(-1).square()).abs() <= slack
    unresolved = near & (slack > RESOLVABLE * squared) & torch.isfinite(squared)
    return bool((unresolved.sum(-1) >= 2).any())


def warn_decided_by_rounding(method: str) -> None:
    """The warning of an inner-product evaluation whose :func:`decided_by_rounding`
    held; it points at the caller of ``threshold_clustering``."""
    warnings.warn(
        f"Threshold-Clustering (method={method!r}): a point at a ball's boundary is closer "
        "to the centre than float32 inner products of vectors this large resolve (e.g. "
        "1e6-sized attack rows near each other), so its membership is decided by "
        "rounding; method='direct' or float64 evaluates it exactly",
        RuntimeWarning,
        stacklevel=4,
    )
