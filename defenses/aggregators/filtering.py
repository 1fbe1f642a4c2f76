"""Filtering aggregators from Blades and FLPoison: Bulyan, DnC, ClippedClustering,
SignGuard and FLAME, batched over leading problem dimensions ``[..., N, d]``.

Each one first *selects* rows (by repeated Krum, by spectral outlier scores, by
clustering of directions or of sign statistics) and then averages what it kept,
possibly clipped.  They follow the contract of :mod:`defenses.aggregators`
(see its module docstring): inadmissible rows (NaN, Inf, overflowing norm) are
absent, the output is finite wherever a problem has an admissible row, and the
variable number of admissible rows per problem is handled with masks.

The sequential parts of the algorithms (Bulyan's ``theta`` Krum selections, the
merges of agglomerative clustering, Lloyd steps of 2-means, DnC's ``niters`` rounds)
are Python loops over *steps*, each step batched over every problem and every row;
there is no loop over clients or over problems.  The clusterings are implemented
here (batched over problems, on the ``[..., N, N]`` matrices) rather than called
from scipy per problem.

Randomised rules (DnC's coordinate subsample, SignGuard's coordinate block, FLAME's
noise) draw from ``generator``; one draw serves every problem of the batch, so a
batched block aggregates as it does alone.  Without a generator they draw from a
fresh generator seeded 0 (deterministic, but predictable by an attacker; the
Global algorithm always passes its own seeded stream).

Importing this module registers the aggregators in
:data:`defenses.aggregators.AGGREGATORS` as ``bulyan``, ``dnc``,
``clipped_clustering``, ``signguard`` and ``flame``.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from pydantic import Field
from torch import Tensor

from defenses.aggregators.base import Aggregator, BudgetedAggregator, aggregator_options, register
from defenses.aggregators.statistics import clipped_mean, stream_or_default
from robust_pfl.engine.rows import (
    Rows,
    absent_pairs,
    agglomerate,
    cosine_distances,
    largest_cluster,
    masked_mean,
    masked_median,
    mean_nearest_median,
    row_norms,
    squared_distances,
)


@register
@aggregator_options
class Bulyan(BudgetedAggregator):
    """Bulyan (El Mhamdi, Guerraoui, Rouault 2018, "The hidden vulnerability of
    distributed learning in Byzantium", Sec. 4, Bulyan over Krum).

    1. *Selection*: ``theta = n - 2f`` times, apply Krum to the rows not yet selected
       (``n'`` of them; score = sum of squared distances to the ``n' - f - 2`` nearest
       other remaining rows, as :func:`~defenses.aggregators.krum_scores`) and
       move the lowest-scoring row (ties: lowest index) to the selection set.
    2. *Aggregation*: per coordinate, average the ``beta = theta - 2f`` selected values
       closest to the selection's coordinate-wise median (statistical median; they
       are a window of the sorted values, ties go to the window of lower values).

    Requires ``n >= 4f + 3``; with fewer admissible rows ``f`` shrinks to
    ``(n - 3) // 4``.  ``f = 0`` gives the mean.  The ``theta`` selections are a loop
    over steps, each batched over problems; pairwise distances are computed once
    (:func:`~robust_pfl.engine.rows.squared_distances`).
    """

    name = "bulyan"
    summary = "n-2f rows chosen by repeated Krum, then per coordinate the mean of the n-4f closest to the median"
    reference = "El Mhamdi, Guerraoui, Rouault 2018 (ICML), The hidden vulnerability of distributed learning in Byzantium, Bulyan"

    def check(self, n: int) -> None:
        super().check(n)
        f = self.budget(n)
        if n < 4 * f + 3:
            raise ValueError(f"{self.name}: needs n >= 4*f + 3, got f={f}, n={n}")

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        values, admissible, count = rows
        n = values.shape[-2]
        f = self.budgets(count, (count - 3).div(4, rounding_mode="floor"))
        theta = count - 2 * f
        beta = theta - 2 * f
        squared = squared_distances(values).to(F64)
        squared = torch.where(absent_pairs(admissible) | torch.isnan(squared), math.inf, squared)
        index = torch.arange(n, device=values.device)
        selected = torch.zeros_like(admissible)
        remaining = admissible.clone()
        steps = int(theta.max()) if theta.numel() else 0
        for step in range(steps):
            pairs = remaining.unsqueeze(-1) & remaining.unsqueeze(-2)
            nearest = torch.where(pairs, squared, math.inf).sort(dim=-1).values.cumsum(-1)  # only +inf added
            k = (count - step - f - 2).clamp_min(1)
            scores = nearest.gather(-1, (k - 1)[..., None, None].expand(*nearest.shape[:-1], 1)).squeeze(-1)
            scores = torch.nan_to_num(scores, nan=torch.finfo(F64).max, posinf=torch.finfo(F64).max)
            scores = torch.where(remaining, scores, math.inf)
            pick = scores.argmin(-1, keepdim=True)  # first minimum: lowest index
            chosen = (index == pick) & remaining & (step < theta).unsqueeze(-1)
            selected = selected | chosen
            remaining = remaining & ~chosen
        return mean_nearest_median(Rows(values, selected, theta), beta)


@register
@aggregator_options
class DnC(BudgetedAggregator):
    """Divide and conquer, DnC (Shejwalkar & Houmansadr 2021, NDSS, "Manipulating the
    Byzantine: optimizing model poisoning attacks and defenses for federated
    learning", Alg. 2).  For each of ``niters`` rounds:

    1. draw ``b`` coordinates uniformly without replacement (all ``d`` if ``b >= d``);
    2. centre the subsampled admissible rows at their mean;
    3. take the top right singular vector ``v`` of the centred matrix;
    4. score each row by ``<x_i - mu, v>^2`` and keep the ``n - floor(c f)`` lowest.

    The aggregate is the mean of the rows kept in every round (the intersection).
    Where the intersection is empty (possible when ``niters * c * f >= n``; the paper
    does not say), the rows kept in the most rounds are averaged instead; this equals
    the intersection whenever it is non-empty.

    The scores use the identity ``<c_i, v>^2 = lambda u_i^2`` for the top eigenpair
    ``(lambda, u)`` of the Gram matrix ``C C^T`` (``[N, N]``, float64), instead of an
    SVD of the ``[N, b]`` matrix.  The subsample of each round is one
    ``randperm(d)`` from ``generator`` shared by all problems of the batch.
    Defaults: ``b = 10000`` and ``c = 1`` as in the paper and Blades, ``niters = 5``
    as in FLPoison (Blades uses 1).  Removals are capped at ``n - 1``.
    """

    name = "dnc"
    summary = "rows with large projections on the top singular vector of random coordinate subsets removed"
    reference = "Shejwalkar & Houmansadr 2021 (NDSS), Manipulating the Byzantine, DnC, Alg. 2"

    niters: Annotated[int, Field(ge=1, description="rounds of random subsampling (intersection of kept sets)")] = 5
    b: Annotated[int, Field(ge=1, description="coordinates subsampled per round (all if b >= d)")] = 10000
    c: Annotated[float, Field(ge=0, description="filtering fraction: c * f rows removed per round")] = 1.0

    def check(self, n: int) -> None:
        super().check(n)
        f = self.budget(n)
        if math.floor(self.c * f) >= n:
            raise ValueError(f"{self.name}: needs floor(c*f) < n, got c={self.c}, f={f}, n={n}")

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        values, admissible, count = rows
        d = values.shape[-1]
        f = self.budgets(count, count)
        removed = torch.minimum((f.to(F64) * self.c).floor().to(count.dtype), (count - 1).clamp_min(0))
        keep = count - removed
        stream = stream_or_default(generator)
        times_kept = torch.zeros(admissible.shape, dtype=torch.int64, device=values.device)
        for _ in range(self.niters):
            chosen = torch.randperm(d, generator=stream, device=stream.device)[: self.b].to(values.device)
            sub = values.index_select(-1, chosen).to(F64)
            mu = masked_mean(sub, admissible)
            centred = torch.where(admissible.unsqueeze(-1), sub - mu.unsqueeze(-2), torch.zeros_like(sub))
            gram = centred @ centred.transpose(-1, -2)
            eigenvalues, eigenvectors = torch.linalg.eigh(gram)
            scores = eigenvalues[..., -1:].clamp_min(0) * eigenvectors[..., -1].square()
            scores = torch.where(admissible, scores, math.inf)
            rank = scores.argsort(dim=-1, stable=True).argsort(dim=-1)
            times_kept = times_kept + ((rank < keep.unsqueeze(-1)) & admissible).to(torch.int64)
        times_kept = torch.where(admissible, times_kept, torch.full_like(times_kept, -1))
        good = (times_kept == times_kept.amax(-1, keepdim=True)) & admissible
        return masked_mean(values, good)


@register
@aggregator_options
class ClippedClustering(Aggregator):
    """ClippedClustering (Li, Xie, Lu, Zhang, Li 2023, "An experimental study of
    Byzantine-robust aggregation schemes in federated learning", IEEE TBD; Blades).

    1. clip every admissible row to the median of the rows' norms (at most
       ``max_tau`` when given);
    2. agglomerative clustering of the rows into 2 clusters on cosine distances,
       average linkage (batched, :func:`agglomerate`; clipping does not change
       directions);
    3. the mean of the clipped rows of the larger cluster (ties: the cluster holding
       the lowest-index row).

    Blades takes the median over the norms of *all rounds so far* (a stateful
    history); an aggregator here is a pure function, so the median is over this
    round's admissible rows.  A zero row has cosine distance 1 to every row.
    """

    name = "clipped_clustering"
    summary = "rows clipped to the median norm, 2 clusters by cosine distance (average linkage), larger one averaged"
    reference = "Li et al. 2023 (IEEE TBD), An experimental study of Byzantine-robust aggregation schemes in FL, ClippedClustering"

    max_tau: Annotated[float | None, Field(gt=0, description="upper bound on the clipping norm (None: median only)")] = None

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        values, admissible, _ = rows
        norms = row_norms(values)
        bound = masked_median(norms, admissible)
        if self.max_tau is not None:
            bound = bound.clamp_max(self.max_tau)
        labels, sizes = agglomerate(cosine_distances(rows), admissible, "average", clusters=2)
        chosen = largest_cluster(labels, sizes) & admissible
        return clipped_mean(values, norms, bound, chosen)


def two_means(features: Tensor, present: Tensor, iterations: int = 20) -> Tensor:
    """Batched 2-means of ``features[..., N, k]`` over the ``present`` rows; returns the
    ``[..., N]`` mask of the larger cluster (ties: the first one).

    Deterministic start: centre A is the present row with the smallest sum of
    distances to the others (a medoid; ties lowest index), centre B the present row
    farthest from A (ties lowest index).  Lloyd steps assign each row to the nearer
    centre (ties: A) and move each non-empty cluster's centre to its mean, until no
    assignment changes in any problem or ``iterations`` steps."""
    x = features.to(F64)
    distance = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
    pairs = present.unsqueeze(-1) & present.unsqueeze(-2)
    total = torch.where(pairs, distance, torch.zeros_like(distance)).sum(-1)
    total = torch.where(present, total, math.inf)
    a = total.argmin(-1)
    from_a = distance.gather(-2, a[..., None, None].expand(*a.shape, 1, x.shape[-2])).squeeze(-2)
    b = torch.where(present, from_a, -math.inf).argmax(-1)
    centre_a = x.gather(-2, a[..., None, None].expand(*a.shape, 1, x.shape[-1]))
    centre_b = x.gather(-2, b[..., None, None].expand(*b.shape, 1, x.shape[-1]))
    in_b = torch.zeros_like(present)
    for step in range(iterations):
        to_a = torch.linalg.vector_norm(x - centre_a, dim=-1)
        to_b = torch.linalg.vector_norm(x - centre_b, dim=-1)
        new_b = (to_b < to_a) & present
        if step > 0 and torch.equal(new_b, in_b):
            break
        in_b = new_b
        in_a = present & ~in_b
        centre_a = torch.where(in_a.any(-1)[..., None, None], masked_mean(x, in_a).unsqueeze(-2), centre_a)
        centre_b = torch.where(in_b.any(-1)[..., None, None], masked_mean(x, in_b).unsqueeze(-2), centre_b)
    in_a = present & ~in_b
    a_larger = (in_a.sum(-1) >= in_b.sum(-1)).unsqueeze(-1)
    return torch.where(a_larger, in_a, in_b)


def sign_features(values: Tensor, start: int, size: int) -> Tensor:
    """``[..., N, 3]`` fractions of positive, zero and negative coordinates of each row
    on the block ``[start, start + size)`` (float64)."""
    block = values[..., start:start + size]
    denominator = max(size, 1)
    return torch.stack([(block > 0).sum(-1), (block == 0).sum(-1), (block < 0).sum(-1)], dim=-1).to(F64) / denominator


@register
@aggregator_options
class SignGuard(Aggregator):
    """SignGuard (Xu, Huang, Song, Lan 2022, ICDCS, "SignGuard: Byzantine-robust
    federated learning through collaborative malicious gradient filtering", Alg. 1).

    1. *Norm filter*: ``S1`` = rows with ``L <= ||x_i|| / M <= R``, ``M`` the median
       norm of the admissible rows (for ``M = 0``: the rows of norm 0);
    2. *Sign clustering*: on a random block of ``max(1, floor(sparsity * d))``
       consecutive coordinates (the reference code's contiguous block, its start drawn
       from ``generator``, shared by the batch), the features (fraction of positive,
       zero, negative coordinates) of each row are clustered; ``S2`` = the largest
       cluster.  **Substitute**: the paper uses MeanShift; here it is a deterministic
       2-means (:func:`two_means`), which always splits the rows in two, so that
       ``S2`` holds at least half of the admissible rows but may drop honest rows
       when all are alike.  The features are the raw fractions (the reference code
       also divides each by its maximum over the rows);
    3. ``S = S1 ∩ S2`` (``S2`` where that is empty); rows of ``S`` are clipped to
       ``M`` and averaged.
    """

    name = "signguard"
    summary = "norm-ratio filter and largest sign-statistics cluster (2-means), clipped to the median norm and averaged"
    reference = "Xu, Huang, Song, Lan 2022 (ICDCS), SignGuard, Alg. 1 (MeanShift replaced by 2-means)"

    lower: Annotated[float, Field(ge=0, le=1, description="L: least norm / median norm kept")] = 0.1
    upper: Annotated[float, Field(ge=1, description="R: largest norm / median norm kept")] = 3.0
    sparsity: Annotated[float, Field(gt=0, le=1, description="fraction of coordinates in the sign block")] = 0.1

    def block(self, d: int, generator: torch.Generator | None) -> tuple[int, int]:
        """``(start, size)`` of the sign block for dimension ``d``."""
        size = min(d, max(1, math.floor(self.sparsity * d)))
        stream = stream_or_default(generator)
        start = int(torch.randint(0, d - size + 1, (1,), generator=stream, device=stream.device)) if d else 0
        return start, size

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        values, admissible, _ = rows
        norms = row_norms(values)
        median = masked_median(norms, admissible).unsqueeze(-1)
        s1 = admissible & (norms >= self.lower * median) & (norms <= self.upper * median)
        start, size = self.block(values.shape[-1], generator)
        s2 = two_means(sign_features(values, start, size), admissible)
        chosen = s1 & s2
        chosen = torch.where(chosen.any(-1, keepdim=True), chosen, s2)
        return clipped_mean(values, norms, median.squeeze(-1), chosen)


@register
@aggregator_options
class Flame(Aggregator):
    """FLAME (Nguyen et al. 2022, USENIX Security, "FLAME: taming backdoors in
    federated learning", Alg. 1), on the rows (updates) as messages:

    1. *Clustering*: cosine distances between the rows; the paper runs HDBSCAN with
       ``min_cluster_size = n/2 + 1`` and ``min_samples = 1`` and admits the majority
       cluster.  **Substitute**: with ``min_samples = 1`` HDBSCAN's hierarchy is the
       single-linkage tree; here that tree is built (:func:`agglomerate`) until the
       first cluster of at least ``floor(n/2) + 1`` rows forms, and that cluster is
       admitted (the rest are noise).  Where other rows join that cluster at the very
       distance of the merge that made it a majority (ties), HDBSCAN
       (``allow_single_cluster``) admits them too and this substitute does not: it
       admits a subset of HDBSCAN's rows, the same rows without such ties
       (``tests/test_flame_hdbscan.py`` checks both against scikit-learn's HDBSCAN);
    2. *Clipping*: the bound ``S`` is the median norm of all admissible rows (the
       median distance to the global model in the paper); admitted rows are clipped to
       ``S`` and averaged;
    3. *Noise*: Gaussian noise of std ``lam * S`` per coordinate, drawn from
       ``generator`` (shared draw of shape ``[..., d]``).  ``lam = 0`` (default) adds
       none; the paper uses 0.001 for image classification.
    """

    name = "flame"
    summary = "majority cosine cluster (single linkage), clipped to the median norm, averaged, optional Gaussian noise"
    reference = "Nguyen et al. 2022 (USENIX Security), FLAME: taming backdoors in federated learning, Alg. 1"

    lam: Annotated[float, Field(ge=0, description="noise std as a multiple of the clipping bound (0: none)")] = 0.0

    def aggregate_rows(self, rows: Rows, previous: Tensor | None, generator: torch.Generator | None) -> Tensor:
        values, admissible, count = rows
        norms = row_norms(values)
        bound = masked_median(norms, admissible)
        need = count.div(2, rounding_mode="floor") + 1
        labels, sizes = agglomerate(cosine_distances(rows), admissible, "single", need=need)
        chosen = largest_cluster(labels, sizes) & admissible
        out = clipped_mean(values, norms, bound, chosen)
        if self.lam > 0:
            stream = stream_or_default(generator)
            # one draw of d for every problem, so a batched block aggregates as it does alone
            noise = torch.randn(out.shape[-1], generator=stream, dtype=F64, device=stream.device).to(out.device)
            out = out + (noise * (self.lam * bound.to(F64)).unsqueeze(-1)).to(out.dtype)
        return out


F64 = torch.float64
