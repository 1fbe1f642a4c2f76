"""Werner et al. Fig. 7 (robust_pfl.recipes.fig7): Threshold-Clustering on blobs, the
elbow score of Sec. 4.5, and ``robust-pfl reproduce fig7`` / ``fig2`` dispatch."""

from __future__ import annotations

import csv
import json
import math
import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from robust_pfl import cli
from robust_pfl.recipes import fig7

pytestmark = pytest.mark.usefixtures("single_thread")

# A hand-computed curve: min f = 1.5, reached at l = 4 and l = 5.
CURVE = [10.0, 6.0, 3.0, 2.0, 1.5, 1.5, 1.6]
# e(l) = (f(l) - f(l-1)) / (f(l-1) - 1.5): -4/8.5, -3/4.5, -1/1.5, -0.5/0.5, then f(l-1) is the minimum
SCORES = [-4 / 8.5, -2 / 3, -2 / 3, -1.0, math.nan, math.nan]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig7")
    summary = fig7.run(out, quick=True)
    return out, summary


def test_elbow_scores_match_the_hand_computed_sequence():
    np.testing.assert_allclose(fig7.elbow_scores(np.array(CURVE)), SCORES, equal_nan=True)


@pytest.mark.parametrize(
    "fraction, elbow",
    # excess left of the initial 8.5 after l = 1, 2, 3, 4: 4.5, 1.5, 0.5, 0 (/ 8.5)
    [(0.6, 1), (0.5, 2), (0.1, 3), (0.05, 4), (0.0, 4)],
)
def test_elbow_iteration_on_the_hand_computed_sequence(fraction, elbow):
    assert fig7.elbow_iteration(np.array(CURVE), fraction) == elbow


def test_a_curve_that_never_decreases_has_its_elbow_at_zero():
    assert fig7.elbow_iteration(np.array([1.0, 1.0, 2.0])) == 0


@settings(deadline=None, max_examples=100)
@given(st.floats(0.5, 0.95), st.floats(0.1, 10), st.floats(-5, 5), st.integers(2, 30))
def test_scores_of_a_geometric_curve_follow_the_closed_form(ratio, scale, floor, horizon):
    # f(l) = floor + scale * ratio^l, l = 0..L: min f = f(L), so
    # e(l) = (ratio - 1) / (1 - ratio^(L - l + 1))
    steps = np.arange(horizon + 1)
    curve = floor + scale * ratio**steps
    expected = (ratio - 1) / (1 - ratio ** (horizon - steps[1:] + 1))
    np.testing.assert_allclose(fig7.elbow_scores(curve), expected, rtol=1e-4)  # f(L-1) - f(L) >~ 1e-10


@settings(deadline=None, max_examples=100)
@given(
    st.lists(st.integers(0, 1000), min_size=2, max_size=30), st.integers(1, 10), st.integers(-50, 50),
)
def test_elbow_is_unchanged_by_shifting_and_scaling_the_curve(values, scale, shift):
    # the score is a ratio of differences: invariant under f -> a f + b, a > 0 (integers
    # keep the differences exact, so rounding cannot move a ratio across the threshold)
    curve = np.array(values, dtype=float)
    assert fig7.elbow_iteration(scale * curve + shift) == fig7.elbow_iteration(curve)


def test_initial_centres_take_one_point_of_each_cluster():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 5)[rng.permutation(20)]
    points = np.column_stack([labels * 10.0, np.arange(20.0)])  # first coordinate = 10 * label
    centres = fig7.initial_centres(points, labels, np.random.default_rng(1))
    assert centres.shape == (4, 2)
    np.testing.assert_array_equal(centres[:, 0], [0.0, 10.0, 20.0, 30.0])  # centre k lies in cluster k
    assert len(set(centres[:, 1])) == 4  # distinct points


def test_datasets_of_one_repeat_share_their_true_centres():
    problems = fig7.make_problems((0.5, 4.0), repeats=2)
    assert problems.points.shape == (4, fig7.POINTS, fig7.DIMENSION)
    torch.testing.assert_close(problems.truth[:2], problems.truth[2:])  # std-major: same repeat, other std
    assert not torch.equal(problems.truth[0], problems.truth[1])


def test_first_iteration_is_one_step_of_eq_24():
    problems = fig7.make_problems((1.0,), repeats=1)
    errors = fig7.centre_errors(problems, iterations=1)
    z, v = problems.points[0], problems.centres[0]
    distances = torch.cdist(v, z)  # [K, N]
    inside = distances <= torch.quantile(distances, 0.1, dim=1, keepdim=True)
    # v_1 = v_0 + (1/N) sum_{j inside} (z_j - v_0)
    moved = v + (inside.double() @ z - inside.sum(1, keepdim=True) * v) / z.shape[0]
    expected = (moved - problems.truth[0]).norm(dim=-1).mean()
    assert errors.shape == (2, 1)
    assert float(errors[1, 0]) == pytest.approx(float(expected), rel=1e-12)


def test_quick_run_writes_its_files(quick_run):
    out, summary = quick_run
    assert {"history.csv", "summary.json", "fig7.png", "fig7.md"} <= {p.name for p in out.iterdir()}
    assert (out / "fig7.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "history.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert set(rows[0]) == {"cluster_std", "method", "seed", "round", "metric", "value"}
    assert len(rows) == len(fig7.STDS) * summary["repeats"] * (summary["iterations"] + 1)
    json.loads((out / "summary.json").read_text())
    table = (out / "fig7.md").read_text()
    for std in fig7.STDS:
        assert f"| {std:g} (sigma = " in table
    assert "paper (Sec. 4.5, Fig. 7)" in table


def test_error_decreases_from_the_first_iteration_to_the_elbow_for_every_std(quick_run):
    _, summary = quick_run
    for std, entry in summary["stds"].items():
        curve = np.array(entry["curve"])
        elbow = entry["elbow"]
        assert 1 < elbow < summary["iterations"], std
        assert np.all(np.diff(curve[1 : elbow + 1]) < 0), std
        # after the elbow the curve is flat next to the drop before it
        assert curve[elbow] - curve.min() <= 0.1 * (curve[0] - curve.min()) + 1e-12, std


def test_larger_std_gives_larger_error_at_every_iteration(quick_run):
    # same true centres, points spread std times wider: the error grows with the std
    curves = np.array([entry["curve"] for entry in quick_run[1]["stds"].values()])
    assert np.all(np.diff(curves, axis=0) > 0)


def test_full_run_keeps_the_shape(tmp_path):
    summary = fig7.run(tmp_path)
    assert summary["repeats"] == 10 and summary["seconds"] < 120
    for entry in summary["stds"].values():
        assert entry["decreasing_to_elbow"]


def test_cli_reproduce_fig7(tmp_path, capsys):
    assert cli.main(["reproduce", "fig7", "--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["repeats"] == 2 and summary["mode"] == "quick"
    assert "fig7.png" in capsys.readouterr().out


@pytest.mark.parametrize("status", [0, 1])
def test_cli_reproduce_fig2_calls_the_recipe_and_passes_its_status(tmp_path, monkeypatch, status):
    calls = []

    def fake_main(out, quick=False, seeds=None):
        calls.append((out, quick, seeds))
        return status

    fake = types.ModuleType("robust_pfl.recipes.fig2")
    fake.main = fake_main
    monkeypatch.setitem(sys.modules, "robust_pfl.recipes.fig2", fake)
    import robust_pfl.recipes

    monkeypatch.setattr(robust_pfl.recipes, "fig2", fake, raising=False)
    assert cli.main(["reproduce", "fig2", "--quick", "--seeds", "3", "--out", str(tmp_path)]) == status
    assert calls == [(tmp_path, True, 3)]


@pytest.mark.parametrize("figure", ["fig2", "fig7"])
def test_data_dir_is_for_the_data_recipes_only(tmp_path, capsys, figure):
    assert cli.main(["reproduce", figure, "--data-dir", str(tmp_path)]) == 2
    assert "table1 and fig6 only" in capsys.readouterr().err
