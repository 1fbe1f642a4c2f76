"""Edge cases of Threshold-Clustering, the robust aggregators, IFCA and the grid store:
empty shapes, low-precision dtypes, huge centres, identical rows and foreign lines in
a grid's ``results.csv``.  Expected values are worked out by hand in each test."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attacks
from defenses.ball_membership import row_copies
from defenses.ifca import IFCA
from robust_pfl.engine.rows import admissible_points
from defenses.aggregators import AGGREGATORS, make_aggregator
from defenses.threshold_clustering import METHODS, nearest_centre, threshold_clustering
from robust_pfl import Federation, experiments
from robust_pfl.engine.data import ClientData
from robust_pfl.grid import run_grid
from robust_pfl.grid_file import expand_grid
from robust_pfl.engine.objectives import linear_regression

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
RADII = [2.0, {"policy": "theory", "delta": 0.5, "sigma": 1.0, "separation": 2.0},
         {"policy": "quantile", "q": 0.5}, {"policy": "cd"}]


# -- zero points, no centres, no problems, d = 0 --------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("radius", RADII, ids=["fixed", "theory", "quantile", "cd"])
def test_zero_points_return_the_centres_unchanged(method, radius):
    """Eq. 24 divides by N: with no points nothing enters a ball, every method and
    policy returns the starting centres, empty memberships and radius 0 (as rounds = 0),
    and no distances."""
    centres = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, 4.0]])
    for points, start in ((torch.zeros(0, 3), centres), (torch.zeros(2, 0, 3), centres.expand(2, 2, 3))):
        result = threshold_clustering(points, start, radius, 3, method=method, final_distances=True, nearest=True)
        assert torch.equal(result.centres, start)
        assert result.inside.shape == (*start.shape[:-1], 0)
        assert torch.equal(result.radius, torch.zeros(start.shape[:-1]))
        assert result.distances.shape == (*start.shape[:-1], 0)
        assert result.nearest.shape == (*start.shape[:-2], 0)


@pytest.mark.parametrize("method", METHODS)
def test_no_centres_and_no_problems_give_empty_results(method):
    points = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    no_centres = threshold_clustering(points, torch.zeros(2, 0, 3), 1.0, 2, method=method, final_distances=True)
    assert no_centres.centres.shape == (2, 0, 3) and no_centres.inside.shape == (2, 0, 5)
    assert no_centres.radius.shape == (2, 0) and no_centres.distances.shape == (2, 0, 5)
    no_problems = threshold_clustering(torch.zeros(0, 5, 3), torch.zeros(0, 2, 3), 1.0, 2, method=method)
    assert no_problems.centres.shape == (0, 2, 3) and no_problems.inside.shape == (0, 2, 5)
    by_index = threshold_clustering(torch.zeros(0, 5, 3), torch.zeros(0, 1, dtype=torch.long), 1.0, 2, method=method)
    assert by_index.centres.shape == (0, 1, 3)


@pytest.mark.parametrize("method", METHODS)
def test_a_nearest_centre_needs_a_centre(method):
    message = "nearest centre: needs at least one centre (K >= 1), got K = 0"
    with pytest.raises(ValueError) as error:
        threshold_clustering(torch.zeros(4, 3), torch.zeros(0, 3), 1.0, 2, method=method, nearest=True)
    assert str(error.value) == message
    with pytest.raises(ValueError) as error:
        nearest_centre(torch.zeros(4, 3), torch.zeros(0, 3))
    assert str(error.value) == message


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("radius", RADII, ids=["fixed", "theory", "quantile", "cd"])
def test_zero_dimensional_points_are_all_at_distance_zero(method, radius):
    """With d = 0 every distance is 0: every point is inside every ball (radius >= 0)."""
    result = threshold_clustering(torch.zeros(4, 0), torch.zeros(2, 0), radius, 2, method=method, final_distances=True)
    assert result.centres.shape == (2, 0)
    assert result.inside.all() and result.inside.shape == (2, 4)
    assert torch.equal(result.distances, torch.zeros(2, 4))
    assert torch.equal(nearest_centre(torch.zeros(4, 0), torch.zeros(2, 0)), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_every_aggregator_takes_zero_dimensional_messages(name):
    aggregator = make_aggregator(name)
    assert aggregator(torch.zeros(2, 7, 0), previous=torch.zeros(0)).shape == (2, 0)
    assert aggregator(torch.zeros(7, 0), generator=torch.Generator().manual_seed(0)).shape == (0,)


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_previous_of_the_wrong_shape_is_a_value_error_naming_it(name):
    messages = torch.zeros(2, 7, 3)
    with pytest.raises(ValueError) as error:
        make_aggregator(name)(messages, previous=torch.zeros(3, 3))
    assert str(error.value) == (
        f"{name}: previous must have the aggregate's shape (2, 3) (or broadcast to it) for "
        "messages of shape (2, 7, 3); got (3, 3)"
    )
    make_aggregator(name)(messages, previous=torch.zeros(3))  # one vector broadcasts to every problem


# -- float16 and bfloat16 ----------------------------------------------------------------------
ROWS = [[0.0], [1.0], [2.0], [10.0], [11.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_krum_and_multi_krum_in_half_precision(dtype):
    """f = 1, n = 5: scores are the sums of the 2 smallest squared distances, 5, 2, 5,
    65, 82; Krum takes row 1, Multi-Krum the mean of the 4 lowest, (0 + 1 + 2 + 10) / 4."""
    rows = torch.tensor(ROWS, dtype=dtype)
    krum = make_aggregator({"name": "krum", "f": 1})(rows)
    multi = make_aggregator({"name": "multi_krum", "f": 1})(rows)
    assert krum.dtype == dtype and torch.equal(krum, torch.tensor([1.0], dtype=dtype))
    assert multi.dtype == dtype and torch.equal(multi, torch.tensor([3.25], dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_direct_clustering_in_half_precision(dtype):
    """Radius 2.5 around 0 holds 0, 1 and 2 of the five rows: v = (0 + 1 + 2) / 5."""
    rows = torch.tensor(ROWS, dtype=dtype)
    result = threshold_clustering(rows, torch.zeros(1, 1, dtype=dtype), 2.5, 1, method="direct", nearest=True)
    assert result.centres.dtype == dtype and torch.equal(result.centres, torch.tensor([[0.6]], dtype=dtype))
    assert result.inside.tolist() == [[True, True, True, False, False]]
    assert torch.equal(nearest_centre(rows, torch.tensor([[0.0], [10.0]], dtype=dtype)), torch.tensor([0, 0, 0, 1, 1]))


# -- a huge centre that captures every point ----------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_a_ball_holding_every_point_gives_their_mean_however_far_its_centre(method):
    """Every point inside: v_1 = (1 - N/N) v_0 + (5 + 7) / 2 = 6, exactly, with no trace
    of v_0 = 1e38 (float64) or 1e18 (float32, radius 1e39 past float32's range)."""
    points = torch.tensor([[5.0], [7.0]], dtype=F64)
    result = threshold_clustering(points, torch.tensor([[1e38]], dtype=F64), 1e39, 1, method=method)
    assert torch.equal(result.centres, torch.tensor([[6.0]], dtype=F64))
    result = threshold_clustering(points.float(), torch.tensor([[1e18]]), 1e39, 1, method=method)
    assert torch.equal(result.centres, torch.tensor([[6.0]])) and result.radius.tolist() == [math.inf]


# -- identical rows -------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Threshold-Clustering")  # ties at the radius are the point here
@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(1, 3),
    n=st.integers(4, 40),
    d=st.integers(1, 300),
    copies=st.integers(1, 3),
    rounds=st.integers(1, 3),
    by_index=st.booleans(),
)
def test_identical_rows_never_end_on_opposite_sides(seed, b, n, d, copies, rounds, by_index):
    """A mimic attack's copies of a row: with the radius at exactly their distance from
    the start (fixed, or the quantile at their rank), every method gives all copies the
    same membership in every ball."""
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.randint(-3, 4, (2,), generator=g)
    z = torch.randn(b, n, d, generator=g) * scale[0] + torch.randn(b, 1, d, generator=g) * scale[1]
    order = torch.argsort(torch.rand(b, n, generator=g), dim=-1)
    row, twins, start = order[:, 0], order[:, 1 : 1 + copies], order[:, -1]
    problems = torch.arange(b).unsqueeze(-1)
    z[problems, twins] = z[torch.arange(b), row].unsqueeze(1)
    starts = start.unsqueeze(-1) if by_index else z[torch.arange(b), start].unsqueeze(1).clone()
    gap = torch.linalg.vector_norm(z - z[torch.arange(b), start].unsqueeze(1), dim=-1)  # [b, n]
    tau = float(gap[0, row[0]])
    rank = int((gap[0] < gap[0, row[0]]).sum())
    for radius in (tau, {"policy": "quantile", "q": rank / (n - 1)}):
        for method in METHODS:
            inside = threshold_clustering(z, starts, radius, rounds, method=method).inside  # [b, 1, n]
            first = inside[problems, :, row.unsqueeze(-1)]
            assert torch.equal(inside[problems, :, twins], first.expand_as(inside[problems, :, twins])), method


def test_rows_that_agree_in_keys_and_probes_but_differ_are_never_merged():
    """Row 1 is row 0 with two coordinates swapped outside the probed columns: same norm,
    same distance to the origin, same probes, so a candidate pair; split by a ball, it is
    compared whole and stays apart.  Row 2, an exact copy, is merged."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1000, generator=g)
    swapped = base.clone()
    swapped[[20, 30]] = base[[30, 20]]  # the probes read columns 0-15, 62-77, ...: not 20 or 30
    z = torch.stack([base, swapped, base, torch.randn(1000, generator=g)]).unsqueeze(0)  # [1, 4, 1000]
    norms = torch.linalg.vector_norm(z, dim=-1).square()
    keys = torch.stack([norms, norms], dim=1)  # [1, 2, 4]: squared distance to 0 and squared norm
    copies = row_copies(z, torch.ones(1, 4, dtype=torch.bool), keys, 1e-3 * keys)
    assert copies is not None and sorted(zip(*(p.tolist() for p in copies.pairs[1:]))) == [(0, 1), (0, 2), (1, 2)]
    assert not copies.split(torch.tensor([[[True, False, True, True]]]))  # 0|1 and 1|2 split: not equal
    assert copies.first is None
    assert copies.split(torch.tensor([[[True, True, False, False]]]))  # 0|2 split: identical
    assert copies.first.tolist() == [[0, 1, 0, 3]]
    spread = copies.spread(torch.tensor([[[1.0, 2.0, 3.0, 4.0]]]))
    assert spread.tolist() == [[[1.0, 2.0, 1.0, 4.0]]]


# -- IFCA with one hostile row per model ----------------------------------------------------------
def _ifca_federation(value: float | None):
    """Clients 0-2 fit optimum 0 and 3-5 optimum 1; clients 2 and 5 are Byzantine, one
    per model, and send ``value`` in every coordinate."""
    g = torch.Generator().manual_seed(0)
    optima = torch.tensor([[1.0, -2.0, 0.5], [30.0, 40.0, -50.0]], dtype=F64)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    a = torch.randn(6, 8, 3, generator=g, dtype=F64)
    y = torch.einsum("cnd,cd->cn", a, optima[ids]) + 0.1 * torch.randn(6, 8, generator=g, dtype=F64)
    byzantine = torch.tensor([False, False, True, False, False, True])
    attack = None if value is None else attacks.ConstantValue(value)
    return Federation(linear_regression(3), ClientData(a, y), ids, byzantine, 0, None, attack), optima


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_ifca_keeps_training_with_one_hostile_row_per_model(value):
    """Full batches: each model moves by lr times the mean gradient of the honest clients
    that picked it, the hostile rows dropped as IFCA's model averaging drops them."""
    fed, optima = _ifca_federation(value)
    algo = IFCA(fed, IFCA.Params(lr=0.01), initial_models=optima + 1.0)
    honest = ~fed.byzantine
    for t in range(3):
        models = algo.models.clone()
        chosen = fed.cross_losses(models, fed.train).argmin(0)
        gradients = fed.gradients(models[chosen], fed.train)
        record = algo.step(t)
        assert record.assignment.tolist() == chosen.tolist() == [0, 0, 0, 1, 1, 1]
        for k in range(2):
            picked = (chosen == k) & honest
            expected = models[k] - 0.01 * gradients[picked].mean(0)
            torch.testing.assert_close(algo.models[k], expected, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(algo.models).all() and not torch.equal(algo.models, optima + 1.0)


# -- foreign lines in a grid's results.csv -------------------------------------------------------
_ATTACKS = {"x": "none", "y": "large_gradient", "z": "gaussian_noise"}


def _grid(labels: str):
    data = {"rounds": 1, "task": {"clusters": 1, "clients_per_cluster": 2}, "methods": [{"name": "global"}],
            "grid": {"attack": [{"name": _ATTACKS[label], "label": label} for label in labels]}}
    return expand_grid(data, "edge")


def _one_row_runs(monkeypatch, calls):
    def run(payload, source, **kwargs):
        calls.append(source.split("attack=")[1].rstrip(")"))
        return [{"round": 1, "metric": "value", "value": float(len(calls))}]

    monkeypatch.setattr(experiments, "run_cell_config", run)


def test_lines_that_are_not_store_rows_are_dropped_reported_and_their_cells_rerun(tmp_path, monkeypatch):
    """Lines of another shape ({} null 5 "text" a,b: not the 12 fields cell, method,
    seed, attack and the 8 fixed columns) and a last line cut by a kill are dropped
    alike: one warning names the file and their line numbers (the header is line 1,
    the first cell's block lines 2-3), the missing cells run, and the store is
    clean afterwards: a later rerun warns of nothing and runs nothing."""
    path = tmp_path / "results.csv"
    calls: list[str] = []
    _one_row_runs(monkeypatch, calls)
    run_grid(_grid("x"), tmp_path)
    with open(path, "a") as handle:
        handle.write('{}\nnull\n5\n"text"\na,b\ncut mid-wa')
    with pytest.warns(RuntimeWarning) as caught:
        run_grid(_grid("xyz"), tmp_path)
    assert calls == ["x", "y", "z"]
    assert str(caught[0].message) == (
        f"{path}: dropped lines 4, 5, 6, 7, 8, 9, not rows of 12 fields (cut by a kill, or written by something "
        "else); a cell such a line held runs again"
    )
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 3 * 2 and [line.split(",")[3] for line in lines[1:]] == ["x", "x", "y", "y", "z", "z"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_grid(_grid("xyz"), tmp_path)
    assert calls == ["x", "y", "z"] and path.read_text().splitlines() == lines


@pytest.mark.parametrize("method", METHODS)
def test_float16_rows_of_ordinary_norm_are_admissible(method):
    """A float16 row of norm 300 has a squared norm past float16's range (65504) but is an
    ordinary row: it enters balls as in float32, and the centres come back in float16."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(2, 20, 5, generator=g) * 150  # norms ~ 300
    wide = threshold_clustering(z, z[:, :1].clone(), {"policy": "quantile", "q": 0.5}, 3, method=method)
    half = threshold_clustering(z.half(), z[:, :1].half(), {"policy": "quantile", "q": 0.5}, 3, method=method)
    assert half.centres.dtype == torch.float16
    assert int(half.inside.sum()) == int(wide.inside.sum()) > 0
    torch.testing.assert_close(half.centres.float(), wide.centres, rtol=2e-3, atol=0.5)
    assert bool(admissible_points(z.half()).all())


def test_a_row_matching_the_probes_cannot_hide_true_copies():
    """Row 0 agrees with rows 1 and 2 in every probed column and in the keys but differs
    elsewhere; rows 1 and 2 are exact copies.  A ball that splits 1 from 2 has them
    compared, and they merge, whatever row 0 does."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(1000, generator=g)
    crafted = base.clone()
    crafted[[20, 30]] = base[[30, 20]]  # outside the probed columns, same norm
    z = torch.stack([crafted, base, base, torch.randn(1000, generator=g)]).unsqueeze(0)
    norms = torch.linalg.vector_norm(z, dim=-1).square()
    keys = torch.stack([norms, norms], dim=1)
    copies = row_copies(z, torch.ones(1, 4, dtype=torch.bool), keys, 1e-3 * keys)
    assert copies is not None
    assert copies.split(torch.tensor([[[True, True, False, False]]]))  # 0 with 1, 2 apart
    assert copies.first.tolist() == [[0, 1, 1, 3]]
