"""Bulyan, DnC, ClippedClustering, SignGuard and FLAME
(:mod:`defenses.aggregators`).

Each aggregator is compared with a straightforward implementation written here from
its paper's definition (NumPy loops over rows, scipy's hierarchical clustering where
the rule clusters), one problem at a time with the inadmissible rows removed, against
the batched aggregator on ``[B, N, d]`` with NaN / Inf rows in some problems.  The
randomised rules draw their coordinates from the seeded generator in the documented
way (one ``randperm`` per DnC round, one ``randint`` for SignGuard's block, one
``randn`` for FLAME's noise), which the references reproduce.  Then: the public
conformance check, constructed instances where Byzantine rows are plainly excluded,
and Bulyan's ``n >= 4f + 3``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from defenses.aggregators import AGGREGATORS, make_aggregator
from defenses.conformance import check_aggregator
from robust_pfl.engine.rows import agglomerate

pytestmark = pytest.mark.usefixtures("single_thread")

NAMES = ["bulyan", "dnc", "clipped_clustering", "signguard", "flame"]
F64 = torch.float64
EMPTY: list[bool] = []  # per DnC reference call: was the intersection empty?


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- references from the papers' definitions (one problem, admissible rows only) --------------
def bulyan_reference(x: np.ndarray, f: int) -> np.ndarray:
    n, d = x.shape
    remaining, selected = list(range(n)), []
    for _ in range(n - 2 * f):
        m = len(remaining)
        k = max(m - f - 2, 1)
        scores = []
        for i in remaining:
            dist = sorted(float(((x[i] - x[j]) ** 2).sum()) for j in remaining if j != i)
            scores.append(sum(dist[:k]) if len(dist) >= k else math.inf)
        best = remaining[int(np.argmin(scores))]
        selected.append(best)
        remaining.remove(best)
    chosen = x[sorted(selected)]
    beta = len(selected) - 2 * f
    median = np.median(chosen, axis=0)
    out = np.empty(d)
    for c in range(d):
        closest = np.argsort(np.abs(chosen[:, c] - median[c]), kind="stable")[:beta]
        out[c] = chosen[closest, c].mean()
    return out


def dnc_reference(x: np.ndarray, f: int, niters: int, b: int, c: float, seed: int) -> np.ndarray:
    """Alg. 2; where the intersection of the kept sets is empty, the rows kept in the
    most rounds (the documented extension)."""
    n, d = x.shape
    stream = seeded(seed)
    times = np.zeros(n, dtype=int)
    for _ in range(niters):
        coordinates = torch.randperm(d, generator=stream)[:b].numpy()
        sub = x[:, coordinates]
        centred = sub - sub.mean(axis=0)
        v = np.linalg.svd(centred, full_matrices=False)[2][0]
        scores = np.array([float(np.dot(centred[i], v)) ** 2 for i in range(n)])
        for i in np.argsort(scores)[: n - min(math.floor(c * f), n - 1)]:
            times[i] += 1
    EMPTY.append(times.max() < niters)
    return x[times == times.max()].mean(axis=0)


def clip_rows(x: np.ndarray, bound: float) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1)
    return np.array([row * min(1.0, bound / norm) if norm > 0 else row for row, norm in zip(x, norms)])


def clipped_clustering_reference(x: np.ndarray) -> np.ndarray:
    bound = float(np.median(np.linalg.norm(x, axis=1)))
    labels = fcluster(linkage(pdist(x, "cosine"), method="average"), t=2, criterion="maxclust")
    values, sizes = np.unique(labels, return_counts=True)
    larger = values[np.argmax(sizes)]
    return clip_rows(x, bound)[labels == larger].mean(axis=0)


def two_means_reference(features: np.ndarray, iterations: int = 20) -> np.ndarray:
    """The documented 2-means (medoid start, farthest second centre, Lloyd steps)."""
    n = len(features)
    dist = np.array([[np.linalg.norm(features[i] - features[j]) for j in range(n)] for i in range(n)])
    a = int(np.argmin(dist.sum(axis=1)))
    b = int(np.argmax(dist[a]))
    centres = [features[a], features[b]]
    in_b = np.zeros(n, dtype=bool)
    for step in range(iterations):
        new = np.array([np.linalg.norm(p - centres[1]) < np.linalg.norm(p - centres[0]) for p in features])
        if step > 0 and (new == in_b).all():
            break
        in_b = new
        if (~in_b).any():
            centres[0] = features[~in_b].mean(axis=0)
        if in_b.any():
            centres[1] = features[in_b].mean(axis=0)
    return ~in_b if (~in_b).sum() >= in_b.sum() else in_b


def signguard_reference(x: np.ndarray, seed: int, lower=0.1, upper=3.0, sparsity=0.1) -> np.ndarray:
    d = x.shape[1]
    norms = np.linalg.norm(x, axis=1)
    median = float(np.median(norms))
    s1 = np.array([lower <= norm / median <= upper for norm in norms])
    size = max(1, math.floor(sparsity * d))
    start = int(torch.randint(0, d - size + 1, (1,), generator=seeded(seed)))
    block = x[:, start:start + size]
    features = np.array([[(r > 0).mean(), (r == 0).mean(), (r < 0).mean()] for r in block])
    s2 = two_means_reference(features)
    chosen = s1 & s2 if (s1 & s2).any() else s2
    return clip_rows(x, median)[chosen].mean(axis=0)


def flame_reference(x: np.ndarray) -> np.ndarray:
    """Single-linkage tree (HDBSCAN's for min_samples = 1) up to the first cluster of
    at least n // 2 + 1 rows."""
    n = len(x)
    need = n // 2 + 1
    members = {i: [i] for i in range(n)}
    admitted = list(range(n)) if need <= 1 else None
    for step, (p, q, _, size) in enumerate(linkage(pdist(x, "cosine"), method="single")):
        members[n + step] = members.pop(int(p)) + members.pop(int(q))
        if size >= need:
            admitted = members[n + step]
            break
    bound = float(np.median(np.linalg.norm(x, axis=1)))
    return clip_rows(x, bound)[sorted(admitted)].mean(axis=0)


# -- agreement ----------------------------------------------------------------------------------
def batch_with_hostile_rows(seed: int, b: int, n: int, d: int) -> tuple[torch.Tensor, list[np.ndarray]]:
    """``[b, n, d]`` rows (clouds around random centres, a few scaled and flipped
    rows) with NaN / Inf rows in some problems; and each problem's admissible rows."""
    g = seeded(seed)
    centre = torch.randn(b, 1, d, generator=g, dtype=F64)
    x = centre + 0.7 * torch.randn(b, n, d, generator=g, dtype=F64)
    x[:, 0] = -3 * x[:, 0]
    x[:, 1] = 5 * x[:, 1]
    x[0, 2] = math.nan
    x[1, 3, 1] = math.inf
    x[1, n - 1] = -math.inf
    kept = []
    for problem in x:
        admissible = torch.isfinite(problem).all(-1)
        kept.append(problem[admissible].numpy())
    return x, kept


@pytest.mark.parametrize("seed", range(4))
def test_bulyan_agrees_with_reference(seed):
    x, kept = batch_with_hostile_rows(seed, 3, 14, 6)
    agg = make_aggregator({"name": "bulyan", "f": 2})
    out = agg(x)
    for i, rows in enumerate(kept):
        f = min(2, (len(rows) - 3) // 4)
        np.testing.assert_allclose(out[i].numpy(), bulyan_reference(rows, f), rtol=1e-10, atol=1e-12)


def test_bulyan_shrinks_f_and_f0_is_the_mean():
    x, kept = batch_with_hostile_rows(9, 2, 8, 3)  # 7 and 6 admissible rows, f = 1 and 0
    out = make_aggregator({"name": "bulyan", "f": 1})(x)
    np.testing.assert_allclose(out[0].numpy(), bulyan_reference(kept[0], 1), rtol=1e-10)
    np.testing.assert_allclose(out[1].numpy(), kept[1].mean(axis=0), rtol=1e-10)


@pytest.mark.parametrize("seed", range(4))
def test_dnc_agrees_with_reference(seed):
    x, kept = batch_with_hostile_rows(seed, 3, 12, 30)
    agg = make_aggregator({"name": "dnc", "f": 2, "niters": 3, "b": 10, "c": 1.0})
    out = agg(x, generator=seeded(100 + seed))
    for i, rows in enumerate(kept):
        np.testing.assert_allclose(out[i].numpy(), dnc_reference(rows, 2, 3, 10, 1.0, 100 + seed),
                                   rtol=1e-10, atol=1e-12)


def test_dnc_without_generator_is_seed_zero():
    x, _ = batch_with_hostile_rows(5, 2, 10, 8)
    agg = make_aggregator({"name": "dnc", "f": 1, "niters": 2, "b": 4})
    assert torch.equal(agg(x), agg(x, generator=seeded(0)))


@pytest.mark.parametrize("seed", range(3))
def test_dnc_empty_intersection_averages_the_rows_kept_most_often(seed):
    """Each round keeps only 1 or 2 rows (c * f = 8 of 9 or 10): the rounds' kept sets
    rarely intersect."""
    x, kept = batch_with_hostile_rows(seed, 2, 10, 8)
    agg = make_aggregator({"name": "dnc", "fraction": 0.45, "c": 2.0, "niters": 4, "b": 3})
    out = agg(x, generator=seeded(seed))
    EMPTY.clear()
    for i, rows in enumerate(kept):
        f = math.floor(0.45 * len(rows))
        np.testing.assert_allclose(out[i].numpy(), dnc_reference(rows, f, 4, 3, 2.0, seed), rtol=1e-10)
    assert any(EMPTY), "no empty intersection: the fallback was not exercised"


@pytest.mark.parametrize("seed", range(4))
def test_clipped_clustering_agrees_with_reference(seed):
    x, kept = batch_with_hostile_rows(seed, 3, 13, 5)
    out = make_aggregator("clipped_clustering")(x)
    for i, rows in enumerate(kept):
        np.testing.assert_allclose(out[i].numpy(), clipped_clustering_reference(rows), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_signguard_agrees_with_reference(seed):
    g = seeded(seed)
    b, n, d = 3, 11, 200
    # rows whose sign statistics vary: each row has its own offset
    x = torch.randn(b, n, d, generator=g, dtype=F64) + 2 * torch.rand(b, n, 1, generator=g, dtype=F64) - 1
    x[:, 0] *= 20.0  # beyond R times the median norm
    x[:, 1] *= 0.01  # below L times the median norm
    x[:, 2, :100] = 0.0  # zeros in its sign features
    x[0, 3] = math.nan
    x[2, 4, 7] = math.inf
    out = make_aggregator("signguard")(x, generator=seeded(50 + seed))
    for i in range(b):
        rows = x[i][torch.isfinite(x[i]).all(-1)].numpy()
        np.testing.assert_allclose(out[i].numpy(), signguard_reference(rows, 50 + seed), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_flame_agrees_with_reference(seed):
    x, kept = batch_with_hostile_rows(seed, 3, 12, 5)
    out = make_aggregator("flame")(x)
    for i, rows in enumerate(kept):
        np.testing.assert_allclose(out[i].numpy(), flame_reference(rows), rtol=1e-10, atol=1e-12)


def test_bulyan_averages_the_values_nearest_the_median_on_ties():
    """Hand-computed, with tied values (identical attacker rows make ties ordinary):
    Krum with f = 1 keeps {-3, -3, 0, 1, 3}; the beta = 3 values nearest their median 0
    are 0, 1 and one -3, mean -2/3 (not the window -3, -3, 0)."""
    x = torch.tensor([[-3.0], [-3.0], [0.0], [1.0], [3.0], [100.0], [-100.0]], dtype=F64)
    torch.testing.assert_close(make_aggregator({"name": "bulyan", "f": 1})(x), torch.tensor([-2.0 / 3.0], dtype=F64))


def test_flame_noise_is_lambda_times_the_bound():
    x, kept = batch_with_hostile_rows(7, 2, 9, 4)
    plain = make_aggregator("flame")(x)
    noisy = make_aggregator({"name": "flame", "lam": 0.5})(x, generator=seeded(11))
    noise = torch.randn(4, generator=seeded(11), dtype=F64)  # one draw, shared by the problems
    bound = torch.tensor([np.median(np.linalg.norm(rows, axis=1)) for rows in kept], dtype=F64)
    torch.testing.assert_close(noisy - plain, 0.5 * bound.unsqueeze(-1) * noise, rtol=1e-10, atol=1e-12)


def test_agglomerate_average_linkage_matches_scipy_partition():
    g = seeded(3)
    distance = torch.rand(2, 9, 9, generator=g, dtype=F64)
    distance = (distance + distance.transpose(-1, -2)) / 2
    present = torch.ones(2, 9, dtype=torch.bool)
    present[1, [2, 5]] = False
    labels, _ = agglomerate(distance, present, "average", clusters=3)
    for p in range(2):
        idx = present[p].nonzero().squeeze(-1)
        sub = distance[p][idx][:, idx].numpy().copy()
        np.fill_diagonal(sub, 0.0)
        ref = fcluster(linkage(sub[np.triu_indices(len(idx), 1)], "average"), t=3, criterion="maxclust")
        ours = labels[p][idx].numpy()
        same_ours = ours[:, None] == ours[None, :]
        same_ref = ref[:, None] == ref[None, :]
        assert (same_ours == same_ref).all()
    assert (labels[1, [2, 5]] == -1).all()


# -- conformance and constructed instances ---------------------------------------------------
def test_registered_with_reference_and_summary():
    for name in NAMES:
        cls = AGGREGATORS[name]
        assert cls.summary and cls.reference and cls.__doc__


@pytest.mark.parametrize("name", [*NAMES, {"name": "flame", "lam": 0.001}])
def test_conformance(name):
    check_aggregator(name)


@pytest.mark.parametrize("spec", [{"name": "bulyan", "f": 2}, {"name": "dnc", "f": 2}, "clipped_clustering",
                                  "signguard", "flame", {"name": "flame", "lam": 0.001}])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_byzantine_rows_are_excluded(spec, dtype):
    """9 honest rows near a common direction, 2 Byzantine rows far away in the opposite
    direction: the aggregate is close to the honest mean."""
    g = seeded(1)
    d = 20
    honest = 1.0 + 0.1 * torch.randn(9, d, generator=g, dtype=F64)
    byzantine = torch.full((2, d), -100.0, dtype=F64)
    x = torch.cat([byzantine, honest]).to(dtype)
    out = make_aggregator(spec)(x, generator=seeded(2))
    assert out.dtype == dtype
    assert float((out.double() - honest.mean(0)).abs().max()) < 0.35
    # and along the honest direction, rows at +100 cannot pull far either
    x = torch.cat([torch.full((2, d), 100.0, dtype=F64), honest]).to(dtype)
    out = make_aggregator(spec)(x, generator=seeded(2))
    assert float((out.double() - honest.mean(0)).abs().max()) < 0.35


@pytest.mark.parametrize("name", ["clipped_clustering", "signguard", "flame"])
def test_sign_flipped_rows_of_honest_norm_are_excluded(name):
    """3 of 11 rows are honest rows negated (same norms: the norm filters pass them):
    the direction / sign clustering excludes them, and the output is the mean of the
    8 honest rows clipped to the median norm."""
    g = seeded(4)
    honest = 1.0 + 0.2 * torch.randn(8, 30, generator=g, dtype=F64)
    x = torch.cat([-honest[:3], honest])
    out = make_aggregator(name)(x, generator=seeded(5))
    bound = torch.linalg.vector_norm(x, dim=-1).median()  # 11 rows: the middle one
    norms = torch.linalg.vector_norm(honest, dim=-1, keepdim=True)
    expected = (honest * torch.clamp(bound / norms, max=1.0)).mean(0)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_bulyan_refuses_n_below_4f_plus_3():
    agg = make_aggregator({"name": "bulyan", "f": 2})
    agg.check(11)
    with pytest.raises(ValueError, match=r"n >= 4\*f \+ 3"):
        agg.check(10)
    with pytest.raises(ValueError, match="bulyan"):
        agg(torch.zeros(10, 3))
    with pytest.raises(ValueError):
        make_aggregator({"name": "bulyan", "fraction": 0.2}).check(6)  # f = 1: needs 7


def test_options_are_validated():
    with pytest.raises(ValueError, match="dnc.niters"):
        make_aggregator({"name": "dnc", "niters": 0})
    with pytest.raises(ValueError, match="signguard.upper"):
        make_aggregator({"name": "signguard", "upper": 0.5})
    with pytest.raises(ValueError, match="flame.lam"):
        make_aggregator({"name": "flame", "lam": -1.0})
    with pytest.raises(ValueError):
        make_aggregator({"name": "dnc", "f": 3, "c": 4.0}).check(12)
