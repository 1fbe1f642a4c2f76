"""The gradient constants of Assumptions 4-5 (eq. 16-17), estimated as in Werner et
al.'s Sec. 5 from full-batch gradients at a set of evaluation points:

* ``A^2``: the largest intra-cluster ratio (eq. 31);
* ``Delta^2`` with ``D = 0``: the smallest cross-cluster gradient gap (eq. 32);
* for ``D > 0`` the feasible ``(D^2, Delta^2)`` pairs: one linear constraint
  ``Delta^2 <= ||g_i - g_j||^2 + D^2 ||g_i||^2`` per ordered cross pair and point.

``gradients[M, N, d]`` holds ``grad f_j(x_m)`` for client ``j`` at point ``m``
(:func:`full_gradients`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from robust_pfl.engine.data import Batch
from robust_pfl.engine.objectives import Objective
from theory_checks.estimators.fractions import select_included
from theory_checks.types import Estimate

# Elements of ``g_i - g_j`` formed at once when taking pairwise distances.
_DIFFERENCE_BLOCK = 1 << 23
# (model, client, sample) rows per cross_gradients call in full_gradients by default.
_GRADIENT_ROWS = 1 << 20
# Intersections this close (relative) count as one breakpoint of the frontier.
_TIE = 1e-12


def _selected(gradients: Tensor, clusters: Tensor, include: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The included clients' gradients ``[M, k, d]``, their clusters relabelled
    ``0..K-1`` and their original indices (selection before any arithmetic)."""
    if not isinstance(gradients, Tensor) or gradients.dim() != 3 or not gradients.dtype.is_floating_point:
        shape = tuple(gradients.shape) if isinstance(gradients, Tensor) else type(gradients).__name__
        raise ValueError(f"gradients must be a floating tensor [M, N, d], got {shape}")
    models, _, dim = gradients.shape
    if models == 0 or dim == 0:
        raise ValueError(f"gradients needs at least one model and one coordinate, got shape {tuple(gradients.shape)}")
    selected, groups, _, index = select_included(gradients, clusters, include)
    return selected, groups, index


def _ratios(selected: Tensor, groups: Tensor) -> Tensor:
    """Eq. (31) per point and client, ``[M, k]``: ``||g_i - gbar||^2 / ||gbar||^2`` with
    ``gbar`` the mean of ``i``'s cluster among the selected clients (0/0 -> 0, x/0 -> inf,
    NaN where a gradient is NaN)."""
    models, _, dim = selected.shape
    count = int(groups.max()) + 1
    sizes = torch.bincount(groups, minlength=count).to(selected.dtype)
    means = selected.new_zeros(models, count, dim).index_add_(1, groups, selected) / sizes.unsqueeze(-1)
    spread = (selected - means[:, groups]).square().sum(-1)
    scale = means.square().sum(-1)[:, groups]
    zero, inf, nan = spread.new_zeros(()), spread.new_full((), math.inf), spread.new_full((), math.nan)
    ratio = torch.where(scale > 0, spread / scale, torch.where(spread > 0, inf, zero))
    return torch.where(spread.isnan() | scale.isnan(), nan, ratio)  # a NaN gradient is no evidence of 0


def intra_cluster_ratio(gradients: Tensor, clusters: Tensor, include: Tensor | None = None) -> Estimate:
    """``A^2`` of Assumption 4 (eq. 16), estimated by eq. (31): the largest
    ``||g_i - gbar_c(i)||^2 / ||gbar_c(i)||^2`` over points ``m`` and included clients
    ``i``, with ``gbar`` the mean over the included clients of ``i``'s cluster at the
    same point.  ``0/0`` counts as 0, ``x/0`` (``x > 0``) as ``inf``.

    ``where = {"model": m, "client": i}``; ``details["per_client"]``: the max over
    points per client (``nan`` for excluded clients)."""
    selected, groups, index = _selected(gradients, clusters, include)
    models, clients, _ = selected.shape
    ratio = _ratios(selected, groups)
    flat = int(ratio.reshape(-1).argmax())
    model, client = divmod(flat, clients)
    per_client = gradients.new_full((gradients.shape[1],), math.nan)
    per_client[index] = ratio.max(0).values
    return Estimate(
        "A2", float(ratio[model, client]), "max", models * clients,
        {"model": model, "client": int(index[client])},
        {"per_client": per_client.tolist()},
    )


def pairwise_squared_distances(points: Tensor) -> Tensor:
    """``||z_i - z_j||^2`` for ``points[M, k, d]`` -> ``[M, k, k]``, from explicit
    differences (exact where the Gram formula cancels), in blocks of about
    ``_DIFFERENCE_BLOCK`` elements (at least one model row at a time)."""
    models, count, dim = points.shape
    out = points.new_empty(models, count, count)
    per_model = count * count * dim
    model_step = max(1, _DIFFERENCE_BLOCK // max(1, per_model))
    row_step = count if model_step > 1 else max(1, _DIFFERENCE_BLOCK // max(1, count * dim))
    for first_model in range(0, models, model_step):
        block = points[first_model : first_model + model_step]
        for first_row in range(0, count, row_step):
            rows = block[:, first_row : first_row + row_step]
            out[first_model : first_model + model_step, first_row : first_row + row_step] = (
                (rows.unsqueeze(2) - block.unsqueeze(1)).square().sum(-1)
            )
    return out


def cross_gaps(points: Tensor, cross: Tensor) -> Tensor:
    """``||z_i - z_j||^2`` for the pairs ``cross[k, k]`` marks at every point of
    ``points[M, k, d]`` (``inf`` elsewhere), exact (explicit differences, as
    :func:`pairwise_squared_distances`) wherever a pair may be some client's smallest,
    and from the Gram matrix elsewhere.

    The Gram formula ``||z_i||^2 + ||z_j||^2 - 2 <z_i, z_j>`` is off by at most about
    ``2 d eps (||z_i||^2 + ||z_j||^2)`` (sums of ``d`` products); a pair whose lower end
    exceeds the smallest upper end of its client's pairs cannot be that client's
    minimum, and neither the overall one, so the minima and their arg-mins are those
    of the exact differences.  ``M k^2 d`` multiply-adds at GEMM speed instead of as
    many subtractions, plus the pairs near a minimum."""
    models, count, dim = points.shape
    norms = _rowdot(points)  # [M, k]
    both = norms.unsqueeze(-1) + norms.unsqueeze(-2)
    approximate = (both - 2 * torch.bmm(points, points.transpose(1, 2))).clamp_min(0)
    slack = 2 * dim * torch.finfo(points.dtype).eps * both
    excluded = ~cross.unsqueeze(0)
    lower = (approximate - slack).masked_fill(excluded, math.inf)
    upper = (approximate + slack).masked_fill(excluded, math.inf)
    best = upper.amin(dim=(0, 2))  # [k]: a bound on each client's smallest gap
    near = (lower <= best.view(1, -1, 1)) | ~torch.isfinite(approximate)  # NaN/Inf rows: the exact route
    gaps = approximate.masked_fill(excluded, math.inf)
    model, row, other = (near & ~excluded).nonzero(as_tuple=True)
    step = max(1, _DIFFERENCE_BLOCK // max(1, dim))
    for first in range(0, model.numel(), step):
        pick = slice(first, first + step)
        exact = (points[model[pick], row[pick]] - points[model[pick], other[pick]]).square().sum(-1)
        gaps[model[pick], row[pick], other[pick]] = exact
    return gaps


def _rowdot(points: Tensor) -> Tensor:
    """``||z||^2`` of every row of ``points[M, k, d]`` by one batched product."""
    models, count, dim = points.shape
    flat = points.reshape(models * count, 1, dim)
    return torch.bmm(flat, flat.transpose(1, 2)).reshape(models, count)


def _cross_pairs(groups: Tensor) -> Tensor:
    """``[k, k]`` mask of pairs of different clusters; ValueError if there are none."""
    cross = groups.unsqueeze(1) != groups.unsqueeze(0)
    if not bool(cross.any()):
        raise ValueError(
            "separation needs included clients from at least two clusters; "
            f"all {groups.numel()} included clients are in one cluster"
        )
    return cross


def separation(gradients: Tensor, clusters: Tensor, include: Tensor | None = None) -> Estimate:
    """``Delta^2`` of Assumption 5 (eq. 17) with ``D = 0``, estimated by eq. (32): the
    smallest ``||g_i - g_j||^2`` over points and included pairs of different clusters.

    ``where = {"model", "client", "other"}``; ``details["per_client"]``: per client the
    smallest gap to any client of another cluster (``nan`` for excluded clients).
    Raises ValueError when the included clients span fewer than two clusters."""
    selected, groups, index = _selected(gradients, clusters, include)
    cross = _cross_pairs(groups)
    gaps = cross_gaps(selected, cross)
    models, clients = gaps.shape[:2]
    flat = int(gaps.reshape(-1).argmin())
    model, rest = divmod(flat, clients * clients)
    client, other = divmod(rest, clients)
    per_client = gradients.new_full((gradients.shape[1],), math.nan)
    per_client[index] = gaps.amin(dim=(0, 2))
    return Estimate(
        "Delta2", float(gaps[model, client, other]), "min", models * int(cross.sum()) // 2,
        {"model": model, "client": int(index[client]), "other": int(index[other])},
        {"per_client": per_client.tolist()},
    )


def _own_models(gradients: Tensor, clusters: Tensor, include: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`_selected` for gradients at the clients' own models (``M = N``, point ``m``
    is client ``m``'s model): the included clients' gradients at the included models."""
    if isinstance(gradients, Tensor) and gradients.dim() == 3 and gradients.shape[0] != gradients.shape[1]:
        raise ValueError(f"gradients must be [N, N, d] (point m = client m's model), got {tuple(gradients.shape)}")
    selected, groups, index = _selected(gradients, clusters, include)
    return selected.index_select(0, index), groups, index, torch.arange(index.numel(), device=index.device)


def own_model_ratios(gradients: Tensor, clusters: Tensor, include: Tensor | None = None) -> Tensor:
    """Eq. (31) per client at its own model (Fig. 2 left, grey lines):
    ``||grad f_i(x_i) - grad fbar_i(x_i)||^2 / ||grad fbar_i(x_i)||^2`` from
    ``gradients[N, N, d]`` with point ``m`` = client ``m``'s model; ``[N]``, ``nan`` for
    excluded clients."""
    selected, groups, index, diagonal = _own_models(gradients, clusters, include)
    out = gradients.new_full((gradients.shape[1],), math.nan)
    out[index] = _ratios(selected, groups)[diagonal, diagonal]
    return out


def own_model_separations(gradients: Tensor, clusters: Tensor, include: Tensor | None = None) -> Tensor:
    """Eq. (32) per client at its own model (Fig. 2 right, grey lines):
    ``min_{j not~ i} ||grad f_i(x_i) - grad f_j(x_i)||^2`` over included ``j`` from
    ``gradients[N, N, d]`` with point ``m`` = client ``m``'s model; ``[N]``, ``nan`` for
    excluded clients.  Raises ValueError when fewer than two clusters are included."""
    selected, groups, index, diagonal = _own_models(gradients, clusters, include)
    cross = _cross_pairs(groups)
    own = selected[diagonal, diagonal]
    gaps = (selected - own.unsqueeze(1)).square().sum(-1).masked_fill(~cross, math.inf)
    out = gradients.new_full((gradients.shape[1],), math.nan)
    out[index] = gaps.amin(-1)
    return out


@dataclass(frozen=True)
class SeparationFrontier:
    """The feasible constants of Assumption 5 (eq. 17) with ``D > 0``: ``(D^2,
    Delta^2)`` is feasible on the sampled points iff ``Delta^2 <= c_p + D^2 a_p`` for
    every constraint ``p`` (an ordered cross-cluster pair ``(i, j)`` at one point), with
    ``c_p = ||g_i - g_j||^2`` (``offsets``) and ``a_p = ||g_i||^2`` (``slopes``).

    The largest feasible ``Delta^2`` is the lower envelope of these lines: concave,
    piecewise linear and nondecreasing in ``D^2``."""

    offsets: Tensor
    slopes: Tensor

    def max_separation(self, d_squared: float | Tensor) -> Tensor:
        """``min_p (c_p + D^2 a_p)``: the largest feasible ``Delta^2`` at ``D^2`` (a
        0-d tensor for a float, else the shape of ``d_squared``)."""
        values = torch.as_tensor(d_squared, dtype=self.offsets.dtype, device=self.offsets.device)
        if bool((values < 0).any()) or bool(torch.isnan(values).any()):
            raise ValueError(f"d_squared must be >= 0, got {d_squared}")
        return (self.offsets + self.slopes * values.unsqueeze(-1)).amin(-1)

    def feasible(self, delta_squared: float, d_squared: float) -> bool:
        """Whether ``(D^2, Delta^2)`` satisfies every sampled constraint."""
        return bool(delta_squared <= float(self.max_separation(d_squared)))

    def envelope(self) -> list[tuple[float, float]]:
        """Breakpoints ``(D^2, Delta^2)`` of the frontier from ``D^2 = 0`` on: the
        first is ``(0, min_p c_p)``; past the last one the frontier follows the line
        of smallest slope.  A walk along the lower envelope, one vectorised step per
        breakpoint (at most one per distinct slope)."""
        offsets, slopes = self.offsets, self.slopes
        start = offsets.min()
        tied = offsets == start
        line = int(torch.where(tied, slopes, torch.full_like(slopes, math.inf)).argmin())
        position = 0.0
        points = [(0.0, float(self.max_separation(0.0)))]
        while True:
            shallower = slopes < slopes[line]
            if not bool(shallower.any()):
                return points
            crossing = (offsets - offsets[line]) / (slopes[line] - slopes)
            crossing = torch.where(shallower, crossing.clamp_min(position), torch.full_like(crossing, math.inf))
            nearest = crossing.min()
            ties = crossing <= nearest + _TIE * nearest.abs().clamp_min(1.0)
            line = int(torch.where(ties, slopes, torch.full_like(slopes, math.inf)).argmin())
            position = float(nearest)
            points.append((position, float(self.max_separation(position))))


def separation_frontier(gradients: Tensor, clusters: Tensor, include: Tensor | None = None) -> SeparationFrontier:
    """The :class:`SeparationFrontier` of the sampled gradients: one constraint per
    point and ordered pair ``(i, j)`` of included clients in different clusters, in
    row-major ``(m, i, j)`` order, as float64."""
    selected, groups, _ = _selected(gradients, clusters, include)
    cross = _cross_pairs(groups)
    gaps = pairwise_squared_distances(selected)
    norms = selected.square().sum(-1)
    mask = cross.expand_as(gaps)
    offsets = gaps[mask].to(torch.float64)
    slopes = norms.unsqueeze(-1).expand_as(gaps)[mask].to(torch.float64)
    return SeparationFrontier(offsets, slopes)


def full_gradients(objective: Objective, models: Tensor, data: Batch, chunk_models: int | None = None) -> Tensor:
    """``grad f_j(x_m)`` for every model row ``models[M, d]`` and client ``j`` of
    ``data``: ``[M, N, d]``, by ``objective.cross_gradients`` over chunks of
    ``chunk_models`` models (default: about ``_GRADIENT_ROWS`` (model, client, sample)
    rows per call)."""
    if not isinstance(models, Tensor) or models.dim() != 2:
        raise ValueError(f"models must be a tensor [M, d], got {tuple(getattr(models, 'shape', ()))}")
    dim = getattr(objective, "dim", models.shape[1])
    if models.shape[1] != dim:
        raise ValueError(f"models must have the objective's {dim} parameters per row, got {models.shape[1]}")
    clients, samples = data.inputs.shape[:2]
    if chunk_models is None:
        chunk_models = max(1, _GRADIENT_ROWS // max(1, clients * samples))
    elif chunk_models < 1:
        raise ValueError(f"chunk_models must be >= 1, got {chunk_models}")
    out = models.new_empty(models.shape[0], clients, dim)
    for first in range(0, models.shape[0], chunk_models):
        objective.cross_gradients(models[first : first + chunk_models], data, out=out[first : first + chunk_models])
    return out
