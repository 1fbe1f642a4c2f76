"""The accelerator's batched engine (``robust_pfl.engine.devices.engine``) run on the CPU
against the CPU's blocked engine: the same mathematics in larger products, so every
kernel it changes and every algorithm built on them gives the blocked engine's results
to rounding.  (On a GPU the ``cuda`` tests run the batched engine on its own device.)"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

import attacks
import defenses
from defenses import row_reads
from defenses.clustering_algorithms import PAIRWISE_MAX_POINTS, PAIRWISE_MAX_POINTS_BATCHED, ClusteringParams
from defenses.pairwise_clustering import lower_nanmedian
from robust_pfl.engine.data import Batch, ClientData
from robust_pfl.engine.devices import using_engine
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.objectives import DenseNetwork

pytestmark = pytest.mark.usefixtures("single_thread")
tc = importlib.import_module("defenses.threshold_clustering")  # the module (the package exports its function)

ENGINES = ("blocked", "batched")


def both(function):
    """``function()`` under each engine: ``(blocked, batched)``."""
    out = []
    for kind in ENGINES:
        with using_engine(kind):
            out.append(function())
    return out


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-10) -> bool:
    """Equal to ``rtol`` of the largest finite entry (NaN where NaN)."""
    finite = a[torch.isfinite(a)]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=rtol, atol=rtol * max(scale, 1.0), equal_nan=True))


@pytest.fixture
def small_blocks(monkeypatch):
    """Cache blocks of a few rows, so that the blocked engine loops at these sizes."""
    monkeypatch.setattr("robust_pfl.engine.objectives._CACHE_BLOCK_BYTES", 2 * 8 * 40 * 8)
    monkeypatch.setattr(row_reads, "_BLOCK_BYTES", 3 * 1500 * 8)
    monkeypatch.setattr(tc, "_FUSED_BLOCK_BYTES", 4 * 1500 * 8)


NET = DenseNetwork(40, 5, (8,), "cross_entropy")


def batch_of(clients: int, samples: int = 6, seed: int = 0) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    return Batch(torch.rand(clients, samples, 40, generator=generator, dtype=torch.float64),
                 torch.randint(0, 5, (clients, samples), generator=generator))


def params_of(rows: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, NET.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 0.3


@pytest.mark.usefixtures("small_blocks")
def test_cross_gradients_agree():
    batch, params = batch_of(9), params_of(4)
    blocked, batched = both(lambda: NET.cross_gradients(params, batch))
    assert close(blocked, batched)
    # and both agree with autograd on one pair
    x = params[2].clone().requires_grad_(True)
    loss = NET.loss(x, batch.inputs[5], batch.targets[5])
    (expected,) = torch.autograd.grad(loss, x)
    assert close(batched[2, 5], expected, rtol=1e-9)


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("blend", [None, 0.25])
def test_paired_gradients_into_a_buffer_agree(blend):
    batch, params = batch_of(7), params_of(7)
    start = torch.randn(7, NET.dim, dtype=torch.float64)

    def gradients():
        out = start.clone()
        NET.paired_gradients(params, batch, out=out, blend=blend)
        return out

    blocked, batched = both(gradients)
    assert close(blocked, batched)
    if blend is None:  # the buffer holds the gradients themselves
        assert close(batched, NET.paired_gradients(params, batch))


def points_with_outliers(problems: int, n: int, dim: int, seed: int) -> torch.Tensor:
    """Clustered rows, a trailing block of 1e6-sized rows (far from every centre) and
    one NaN row: the shapes FC's messages take under attack."""
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn(2, dim, generator=generator, dtype=torch.float64)
    labels = torch.arange(n) % 2
    z = means[labels] + 0.3 * torch.randn(problems, n, dim, generator=generator, dtype=torch.float64)
    z[:, -3:] = 1e6 + 200 * torch.randn(problems, 3, dim, generator=generator, dtype=torch.float64)
    z[0, 1, 7] = math.nan
    return z


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("method", ["gram", "pairwise", "direct"])
@pytest.mark.parametrize("centres", ["own row", "coordinates"])
def test_threshold_clustering_agrees(method, centres):
    z = points_with_outliers(problems=3, n=24, dim=1500, seed=4)
    if centres == "own row":
        start = torch.tensor([[0], [2], [5]])
    else:
        start = z[:, :2].clone() + 0.1
    radius = {"policy": "quantile", "q": 0.4}
    blocked, batched = both(
        lambda: tc.threshold_clustering(z, start, radius, 6, method=method, final_distances=True)
    )
    assert torch.equal(blocked.inside, batched.inside)
    assert close(blocked.centres, batched.centres)
    assert close(blocked.radius, batched.radius)
    finite = torch.isfinite(blocked.distances)
    assert torch.equal(finite, torch.isfinite(batched.distances))
    assert close(blocked.distances[finite], batched.distances[finite], rtol=1e-8)


@pytest.mark.usefixtures("small_blocks")
def test_row_reads_agree():
    generator = torch.Generator().manual_seed(2)
    z = torch.randn(3, 20, 1500, generator=generator, dtype=torch.float64)
    vectors = torch.randn(3, 2, 1500, generator=generator, dtype=torch.float64)
    rows = torch.rand(3, 20, generator=generator) < 0.5
    weights = torch.randn(3, 2, 20, generator=generator, dtype=torch.float64)
    for blocked, batched in (
        both(lambda: row_reads.row_products(z, rows, vectors)),
        both(lambda: row_reads._blocked_product(weights, z)),
        both(lambda: row_reads.weighted_rows(weights * (weights > 1), z)),
    ):
        assert close(blocked, batched)
    expected = torch.einsum("bkd,bnd->bkn", vectors, z) * rows.unsqueeze(1)
    assert close(row_reads.row_products(z, rows, vectors), expected)


def test_auto_distance_method_by_engine():
    params = ClusteringParams(lr=0.1)
    small = torch.empty(2, 40, 1000, device="meta")
    assert both(lambda: params.distance_method(small)) == ["direct", "direct"]
    for n, expected in (
        (PAIRWISE_MAX_POINTS, ["pairwise", "pairwise"]),
        (PAIRWISE_MAX_POINTS + 1, ["gram", "pairwise"]),
        (PAIRWISE_MAX_POINTS_BATCHED, ["gram", "pairwise"]),
        (PAIRWISE_MAX_POINTS_BATCHED + 1, ["gram", "gram"]),
    ):
        assert both(lambda: params.distance_method(torch.empty(2, n, 2000, device="meta"))) == expected


@pytest.mark.parametrize("seed", range(20))
def test_lower_nanmedian_equals_torch_nanmedian(seed):
    generator = torch.Generator().manual_seed(seed)
    rows, width = 1 + seed % 4, 1 + seed % 7
    values = torch.randn(rows, width, generator=generator)
    values[torch.rand(rows, width, generator=generator) < 0.3] = math.nan
    values[torch.rand(rows, width, generator=generator) < 0.1] = math.inf
    values[0, : width // 2 + 1] = math.nan if seed % 5 == 0 else values[0, : width // 2 + 1]
    expected = values.nanmedian(-1).values
    got = lower_nanmedian(values)
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    assert torch.equal(got[~torch.isnan(got)], expected[~torch.isnan(expected)])


def test_lower_nanmedian_hand_cases():
    values = torch.tensor([[3.0, math.nan, 1.0, 2.0], [math.nan] * 4, [math.inf, 1.0, -math.inf, math.nan], [4.0, 1.0, 3.0, 2.0]])
    got = lower_nanmedian(values)
    assert got[0] == 2.0 and math.isnan(got[1]) and got[2] == 1.0 and got[3] == 2.0  # lower of 2, 3


# -- whole algorithms ---------------------------------------------------------------------------

CLIENTS, BYZANTINE = 12, 3


def mlp_federation(attack: str | None) -> Federation:
    """12 clients of an MLP 40-8-5 (d = 373), three Byzantine, two hidden clusters."""
    generator = torch.Generator().manual_seed(7)
    inputs = torch.rand(CLIENTS, 10, 40, generator=generator, dtype=torch.float64)
    clusters = torch.arange(CLIENTS) % 2
    targets = (torch.randint(0, 5, (CLIENTS, 10), generator=generator) + 2 * clusters.unsqueeze(1)) % 5
    byzantine = torch.zeros(CLIENTS, dtype=torch.bool)
    byzantine[-BYZANTINE:] = True
    return Federation(NET, ClientData(inputs, targets), clusters, byzantine, seed=0, batch_size=4,
                      attack=None if attack is None else attacks.build(attack), num_classes=5)


ALGORITHMS = {
    "fc": {"method": "gram"},
    "fc pairwise": {"method": "pairwise"},
    "fc groups": {"groups": 2, "method": "gram"},
    "fc uneven groups": {"groups": 5, "method": "pairwise"},  # sizes 3, 3, 2, 2, 2
    "mc": {"method": "gram"},
    "myopic": {"method": "pairwise"},
    "pdl_tc": {"method": "gram"},
    "global": {},
    "global median": {"aggregator": "median"},
    "ifca": {},
    "ground_truth": {},
    "local": {},
}


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("attack", [None, "large_gradient"])
@pytest.mark.parametrize("case", sorted(ALGORITHMS))
def test_algorithms_agree_across_engines(case, attack):
    name = case.split()[0]
    options = {"lr": 0.05, **ALGORITHMS[case]}
    if "radius" in defenses.REGISTRY[name].Params.model_fields:
        options["radius"] = {"policy": "quantile", "q": 0.5}

    def run():
        algorithm = defenses.build(name, mlp_federation(attack), options)
        for round_index in range(3):
            algorithm.step(round_index)
        return algorithm.client_models()

    blocked, batched = both(run)
    honest = torch.arange(CLIENTS) < CLIENTS - BYZANTINE
    assert torch.isfinite(batched[honest]).all()
    assert close(blocked[honest], batched[honest], rtol=1e-9)


@pytest.mark.parametrize("attack", [None, "large_gradient"])
def test_fc_groups_clustered_together_equal_groups_clustered_alone(attack, monkeypatch):
    """On the batched engine FC clusters the chunks of every group of one size in one
    call (``_Pending``); with room for one receiver per call instead (a flush after
    every chunk), the models are the same: the problems are independent."""
    from defenses.clustering_algorithms import FederatedClustering

    options = {"lr": 0.05, "groups": 5, "method": "pairwise", "radius": {"policy": "quantile", "q": 0.5}}

    def run():
        algorithm = defenses.build("fc", mlp_federation(attack), options)
        with using_engine("batched"):
            for round_index in range(3):
                algorithm.step(round_index)
        return algorithm.client_models()

    together = run()
    monkeypatch.setattr(FederatedClustering, "_rows_by_size",
                        lambda self, groups, row_bytes: {members.numel(): 1 for members, _, _ in groups})
    alone = run()
    honest = torch.arange(CLIENTS) < CLIENTS - BYZANTINE
    assert torch.isfinite(together[honest]).all()
    assert close(together[honest], alone[honest], rtol=1e-9)
