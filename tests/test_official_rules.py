"""The official PRFL code's rules, each an explicit option (docs/official_code.md),
checked against hand-computed instances and independent re-implementations:

* quantile radius ``rule = "official"``: ``tau = 0.99 * sorted(d)[int(q N)]``, inside
  when ``d <= tau``;
* ``cd`` radius ``fit = "kmeans++"``: the optimal 3-means of the distances, against a
  brute-force search and against scikit-learn's ``KMeans(3, n_init=10)``;
* FC ``subgroup_split = "chunks"``: chunks of ``ceil(N / groups)`` of one shuffle;
* bit flip ``source = "client_model"``: ``-g_c(x_c)`` sent to every receiver;
* Table 1's FC on private label with the official run's settings.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attacks
from defenses import build
from defenses import radius as radius_module
from defenses.clustering_algorithms import FederatedClusteringParams
from defenses.radius import CenterDistanceRadius, QuantileRadius, make_radius
from defenses.threshold_clustering import threshold_clustering
from robust_pfl import ClientData, Federation, linear_regression
from robust_pfl.engine.types import AttackContext

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
FAST = settings(max_examples=60, deadline=None)


def _row(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64).view(1, 1, -1)


# -- quantile radius, rule "official" -------------------------------------------------------
def test_official_quantile_at_table1_subgroup_size_puts_three_points_in_the_ball():
    """N = 19 (a Table 1 subgroup), q = 0.2, distances 1..19.  Official: 19 * 0.2 is
    3.8000000000000003 in floating point, int() gives rank 3, tau = 0.99 * 4 = 3.96:
    the points 1, 2, 3 are inside.  Interpolated: position 0.2 * 18 = 3.6 between 4
    and 5, tau = 4.6: the points 1..4 are inside."""
    assert 19 * 0.2 == 3.8000000000000003 and int(19 * 0.2) == 3
    distances = _row(np.random.default_rng(0).permutation(np.arange(1.0, 20.0)))
    official = QuantileRadius(0.2, rule="official")
    interpolated = QuantileRadius(0.2)
    assert official(distances, 0).item() == 0.99 * 4.0
    assert interpolated(distances, 0).item() == pytest.approx(4.6, abs=1e-12)
    assert int((distances <= official(distances, 0).unsqueeze(-1)).sum()) == 3
    assert int((distances <= interpolated(distances, 0).unsqueeze(-1)).sum()) == 4
    # the same ball inside Threshold-Clustering: 19 points on a line, centre at 0
    points = torch.cat([distances.view(19, 1), torch.zeros(19, 1, dtype=F64)], dim=1)
    origin = torch.zeros(1, 2, dtype=F64)
    for policy, inside in ((official, 3), (interpolated, 4)):
        result = threshold_clustering(points, origin, policy, rounds=1)
        assert int(result.inside.sum()) == inside


def _official_numpy(distances: np.ndarray, q: float) -> tuple[float, np.ndarray]:
    """The official code's rule, written as it reads: ``ds = sorted(d)``,
    ``tau = ds[int(len(ds) * q)] * 0.99``, inside when ``d <= tau`` (the index capped
    at the last point, where the official code would fail for q = 1)."""
    ds = sorted(distances.tolist())
    tau = ds[min(int(len(ds) * q), len(ds) - 1)] * 0.99
    return tau, distances <= tau


@FAST
@given(
    values=st.lists(st.integers(0, 6), min_size=1, max_size=40),  # many ties
    scale=st.sampled_from([1.0, 0.37, 1e-3, 1e5]),
    infinite=st.integers(0, 3),
    q=st.one_of(st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.5, 1.0]), st.floats(0.0, 1.0)),
    seed=st.integers(0, 2**31 - 1),
)
def test_official_quantile_matches_a_direct_implementation(values, scale, infinite, q, seed):
    """Radius and ball, bit for bit, against the direct implementation above on
    random distances with ties; inadmissible (infinite) points sort last, as in a
    Python sort."""
    array = np.array([v * scale for v in values] + [math.inf] * infinite)
    array = array[np.random.default_rng(seed).permutation(array.size)]
    distances = _row(array)
    tau = QuantileRadius(q, rule="official")(distances, 0)
    expected_tau, expected_inside = _official_numpy(array, q)
    assert tau.item() == expected_tau or (math.isinf(expected_tau) and math.isinf(tau.item()))
    inside = (distances <= tau.unsqueeze(-1)).view(-1).numpy()
    assert (inside == expected_inside).all()


def test_official_quantile_is_batched_per_row():
    """Each (problem, centre) row takes its own order statistic: q = 0.5 of 4 values
    reads rank int(2.0) = 2."""
    rows = torch.tensor([[[4.0, 1.0, 3.0, 2.0], [40.0, 10.0, 30.0, 20.0]]], dtype=F64)
    tau = QuantileRadius(0.5, rule="official")(rows, 0)
    assert tau.tolist() == [[0.99 * 3.0, 0.99 * 30.0]]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"policy": "quantile", "q": 0.2, "rule": "numpy"}, ["radius.rule", "official", "interpolated", "numpy"]),
        ({"policy": "quantile", "q": 0.2, "rule": "offical"}, ["radius.rule", "did you mean 'official'"]),
        ({"policy": "quantile", "q": 0.2, "rule": "official", "factor": 0.99}, ["radius.factor", "'interpolated' only"]),
        ({"policy": "quantile", "q": 0.2, "rule": "official", "strict": True}, ["radius.strict", "'interpolated' only"]),
        ({"policy": "cd", "fit": "kmeans"}, ["radius.fit", "kmeans++", "lloyd"]),
        ({"policy": "cd", "fit": "kmeans++", "iterations": 5}, ["radius.iterations", "'lloyd' only"]),
    ],
)
def test_official_options_reject_bad_values_naming_the_field(spec, words):
    with pytest.raises(ValueError) as error:
        make_radius(spec)
    for word in words:
        assert word in str(error.value), (word, str(error.value))


def test_defaults_keep_the_interpolated_quantile_and_lloyd():
    assert QuantileRadius(0.2).rule == "interpolated"
    assert CenterDistanceRadius().fit == "lloyd"
    assert FederatedClusteringParams().subgroup_split == "balanced"
    assert attacks.BitFlip().source == "own"


# -- cd radius, fit "kmeans++" --------------------------------------------------------------
def _partition_taus(values: np.ndarray) -> tuple[float, list[float]]:
    """Brute force over every split of the sorted values into three non-empty runs
    (inside runs of equal values too): the least sum of squared deviations, and the
    radius (mean of the 2nd and 3rd run means) of every partition within rounding of
    it."""
    s = np.sort(values)
    found = []
    for i in range(1, s.size - 1):
        for j in range(i + 1, s.size):
            runs = (s[:i], s[i:j], s[j:])
            cost = sum(float(((run - run.mean()) ** 2).sum()) for run in runs)
            found.append((cost, 0.5 * (runs[1].mean() + runs[2].mean())))
    best = min(cost for cost, _ in found)
    slack = 1e-9 * max(1.0, float((s - s.mean()) @ (s - s.mean())))
    return best, [tau for cost, tau in found if cost <= best + slack]


@FAST
@given(
    values=st.lists(st.one_of(st.integers(0, 8).map(float), st.floats(0.0, 50.0)), min_size=3, max_size=25),
    infinite=st.integers(0, 3),
)
def test_kmeans_fit_is_the_optimal_three_means(values, infinite):
    """With at least 3 distinct finite distances, the radius is that of an optimal
    3-means partition (brute force over all splits; ties between partitions of equal
    cost allow any of their radii); infinite distances are ignored."""
    finite = np.array(values)
    if np.unique(finite).size < 3:
        return
    array = np.concatenate([finite, np.full(infinite, math.inf)])
    tau = CenterDistanceRadius(fit="kmeans++")(_row(array), 0).item()
    _, taus = _partition_taus(finite)
    assert any(math.isclose(tau, t, rel_tol=1e-9, abs_tol=1e-9) for t in taus), (tau, taus)


@pytest.mark.parametrize(
    ("values", "tau"),
    [
        ([2.0, 2.0, 2.0], 2.0),  # one value: every point inside
        ([1.0, 1.0, 5.0], 3.0),  # two values: midway, the farther ones outside
        ([1.0, 5.0, 5.0, math.inf], 3.0),
        ([7.0], 7.0),
        ([math.inf, math.inf], 0.0),  # no finite distance
    ],
)
def test_kmeans_fit_with_fewer_than_three_distinct_distances(values, tau):
    """Documented rule: the mean of the smallest and the largest finite distance
    (0 when there is none)."""
    assert CenterDistanceRadius(fit="kmeans++")(_row(values), 0).item() == tau


def test_kmeans_fit_is_batched_and_blocked(monkeypatch):
    """Rows of ``[B, K, N]`` are independent, and the memory blocking of the split
    table does not change a bit."""
    g = torch.Generator().manual_seed(3)
    distances = torch.rand(4, 3, 17, generator=g, dtype=F64) * 10
    distances[0, 1, :5] = math.inf
    policy = CenterDistanceRadius(fit="kmeans++")
    together = policy(distances, 0)
    one_by_one = torch.stack([torch.stack([policy(distances[b, k].view(1, 1, -1), 0).view(()) for k in range(3)])
                              for b in range(4)])
    assert torch.equal(together, one_by_one)
    monkeypatch.setattr(radius_module, "_SPLIT_TABLE_ENTRIES", 17 * 17 * 2)  # blocks of 2 rows
    assert torch.equal(policy(distances, 0), together)
    assert policy(distances.float(), 0).dtype == torch.float32


def _mixed_distances(rng: np.random.Generator) -> np.ndarray:
    """Distances at three scales (an exponential times 1, 3 or 10)."""
    n = int(rng.integers(5, 41))
    return rng.exponential(1.0, size=n) * rng.choice([1.0, 3.0, 10.0], size=n)


def test_kmeans_fit_agrees_with_scikit_learn_and_lloyd_does_not():
    """Against the official code's fit, scikit-learn ``KMeans(n_clusters=3)`` with
    k-means++ and 10 restarts, on 40 random cases: wherever scikit-learn reaches the
    optimal inertia (brute force), the radii agree; the cases where they differ must
    be cases where scikit-learn's inertia is above the optimum (its restarts missed
    it; about 4% of such cases in a 200-case trial, at most 4 of these 40 allowed).
    The default ``lloyd`` fit (one Lloyd sequence from fixed starts) is more than
    5% off the optimal radius on at least a fifth of them (about a third measured)."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(2024)
    exact, lloyd = CenterDistanceRadius(fit="kmeans++"), CenterDistanceRadius()
    cases, sklearn_missed, lloyd_off = 40, 0, 0
    for case in range(cases):
        values = _mixed_distances(rng)
        tau = exact(_row(values), 0).item()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = KMeans(n_clusters=3, n_init=10, random_state=case).fit(values.reshape(-1, 1))
        centres = np.sort(fitted.cluster_centers_.ravel())
        sklearn_tau = 0.5 * (centres[1] + centres[2])
        optimum, _ = _partition_taus(values)
        if math.isclose(sklearn_tau, tau, rel_tol=1e-7):
            assert fitted.inertia_ <= optimum * (1 + 1e-7)
        else:
            assert fitted.inertia_ > optimum * (1 + 1e-9), (case, sklearn_tau, tau)
            sklearn_missed += 1
        if abs(lloyd(_row(values), 0).item() - tau) > 0.05 * tau:
            lloyd_off += 1
    assert sklearn_missed <= 4
    assert lloyd_off >= cases // 5


# -- FC subgroups, subgroup_split "chunks" ----------------------------------------------------
def _regression_federation(clients: int, byzantine: list[int] = (), attack=None, batch_size=None) -> Federation:
    g = torch.Generator().manual_seed(clients)
    data = ClientData(torch.randn(clients, 4, 3, generator=g, dtype=F64), torch.randn(clients, 4, generator=g, dtype=F64))
    mask = torch.zeros(clients, dtype=torch.bool)
    mask[list(byzantine)] = True
    return Federation(linear_regression(3), data, torch.arange(clients) % 2, mask, seed=7,
                      batch_size=batch_size, attack=attack)


@pytest.mark.parametrize(
    ("clients", "groups", "sizes"),
    [
        (300, 16, [19] * 15 + [15]),  # Table 1 rotation
        (200, 16, [13] * 15 + [5]),
        (300, 15, [20] * 15),  # Table 1 private label
        (10, 4, [3, 3, 3, 1]),
        (10, 6, [2] * 5),  # fewer groups than asked
    ],
)
def test_chunked_subgroups_have_the_official_sizes(clients, groups, sizes):
    """Chunks of ceil(N / groups) in order, the last shorter (hand computed: 300 / 16
    -> 19, 15 x 19 = 285, 15 left); every client in exactly one group, every round."""
    fc = build("fc", _regression_federation(clients), {"groups": groups, "subgroup_split": "chunks"})
    for _ in range(3):
        parts = fc._subgroups()
        assert [part.numel() for part in parts] == sizes
        assert sorted(torch.cat(parts).tolist()) == list(range(clients))


def test_chunks_and_balanced_cut_the_same_shuffle():
    """The split only changes where the seeded shuffle is cut (balanced: 300 / 16 ->
    12 x 19 + 4 x 18)."""
    chunks = build("fc", _regression_federation(300), {"groups": 16, "subgroup_split": "chunks"})._subgroups()
    balanced = build("fc", _regression_federation(300), {"groups": 16})._subgroups()
    assert [part.numel() for part in balanced] == [19] * 12 + [18] * 4
    assert torch.equal(torch.cat(chunks), torch.cat(balanced))


# -- bit flip, source "client_model" ----------------------------------------------------------
def _least_squares_gradient(x: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Gradient of 0.5 * mean_s (a_s . x - y_s)^2: A^T (A x - y) / b, by hand."""
    return inputs.T @ (inputs @ x - targets) / inputs.shape[0]


def _delivered_rounds(source: str, client: int, rounds: int = 3, groups: int = 1):
    """Run FC with the bit flip and record, per delivery of the last round: the
    delivered messages, the receivers and senders, the models and the batch of the
    round."""
    attack = attacks.build("bit_flip", {"source": source, "client": client})
    fed = _regression_federation(8, byzantine=[2, 6], attack=attack, batch_size=3)
    fc = build("fc", fed, {"lr": 0.3, "radius": {"policy": "quantile", "q": 0.5}, "clustering_rounds": 2,
                           "groups": groups})
    for t in range(rounds - 1):
        fc.step(t)
    deliveries, batches = [], []
    deliver, sample = fed.deliver, fed.sample_batch

    def spy_deliver(messages, *args, **kwargs):
        out = deliver(messages, *args, **kwargs)
        deliveries.append((out.clone(), kwargs["receivers"].clone(), kwargs["senders"].clone()))
        return out

    def spy_sample(*args, **kwargs):
        batches.append(sample(*args, **kwargs))
        return batches[-1]

    fed.deliver, fed.sample_batch = spy_deliver, spy_sample
    models = fc.models.clone()
    fc.step(rounds - 1)
    return fed, models, batches[0], deliveries


@pytest.mark.parametrize("groups", [1, 2])
def test_client_model_bit_flip_sends_minus_the_clients_own_gradient_to_every_receiver(groups):
    """Every Byzantine row delivered to every receiver (in every subgroup) is
    ``-g_c(x_c)``: client c's least-squares gradient (by hand) at its own model on
    this round's batch.  Checked in round 3, when the clients' models differ, where
    the ``"client"`` source sends ``-g_c(x_i)``, a different row per receiver."""
    c = 5
    fed, models, batch, deliveries = _delivered_rounds("client_model", c, groups=groups)
    assert not torch.allclose(models[0], models[1])  # the receivers' models differ
    expected = -_least_squares_gradient(models[c], batch.inputs[c], batch.targets[c])
    reached = []
    for delivered, receivers, senders in deliveries:
        flipped = delivered[:, fed.byzantine[senders]]
        assert flipped.shape[:2] == (receivers.numel(), int(fed.byzantine[senders].sum()))
        for row in flipped.reshape(-1, 3):
            torch.testing.assert_close(row, expected, rtol=1e-12, atol=1e-12)
        reached += receivers.tolist()
    assert sorted(reached) == [0, 1, 3, 4, 5, 7]  # every honest client received messages
    # the "client" source evaluates client c's gradient at each receiver's model
    fed, models, batch, per_receiver = _delivered_rounds("client", c)
    delivered, receivers, senders = per_receiver[0]
    at_receivers = delivered[:, fed.byzantine[senders]][:, 0]
    for row, receiver in zip(at_receivers, receivers.tolist()):
        expected = -_least_squares_gradient(models[receiver], batch.inputs[c], batch.targets[c])
        torch.testing.assert_close(row, expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(at_receivers[0], at_receivers[1])


def test_client_model_bit_flip_of_a_byzantine_client_flips_the_lowest_honest_one():
    """``client`` Byzantine (2) or not a client (99): the honest client of lowest
    index (0), as the ``"client"`` source falls back."""
    for client in (2, 99):
        fed, models, batch, deliveries = _delivered_rounds("client_model", client)
        expected = -_least_squares_gradient(models[0], batch.inputs[0], batch.targets[0])
        delivered, _, senders = deliveries[0]
        for row in delivered[:, fed.byzantine[senders]].reshape(-1, 3):
            torch.testing.assert_close(row, expected, rtol=1e-12, atol=1e-12)


def _context(kind: str, byzantine: torch.Tensor, state: dict | None = None, senders=None) -> AttackContext:
    return AttackContext(
        round_index=0,
        kind=kind,
        byzantine=byzantine,
        cluster_ids=torch.zeros(byzantine.shape[0], dtype=torch.long),
        generator=torch.Generator().manual_seed(0),
        senders=senders,
        defense_state=state or {},
    )


@FAST
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["gradient", "momentum", "model"]), client=st.integers(0, 8))
def test_client_model_is_the_client_source_on_the_clients_own_vectors(seed, kind, client):
    """Where the messages are the clients' own vectors (MC, Myopic, Global), client
    c's row is ``g_c(x_c)``: ``"client_model"`` sends exactly what ``"client"`` does."""
    g = torch.Generator().manual_seed(seed)
    messages = torch.randn(7, 4, generator=g, dtype=F64)
    byzantine = torch.rand(7, generator=g) < 0.4
    senders = torch.randperm(9, generator=g)[:7]
    ctx = _context(kind, byzantine, senders=senders)
    model = attacks.BitFlip(source="client_model", client=client)(messages, ctx)
    plain = attacks.BitFlip(source="client", client=client)(messages, ctx)
    assert torch.equal(model, plain)


def test_client_model_on_cross_gradients_needs_the_defense_state():
    """Without ``defense_state["client_gradient"]`` the attack cannot know ``g_c(x_c)``:
    a clear error naming the option; with it, non-finite values pass through unchanged
    (Threshold-Clustering rejects such rows) and the messages are never mutated."""
    byzantine = torch.tensor([False, True, False, True])
    messages = torch.randn(2, 4, 3, dtype=F64)
    attack = attacks.BitFlip(source="client_model")
    with pytest.raises(ValueError, match="bit_flip.source 'client_model'.*client_gradient"):
        attack(messages, _context("cross_gradient", byzantine))
    hostile = torch.tensor([1.0, math.nan, -math.inf], dtype=F64)
    before = messages.clone()
    rows = attack(messages, _context("cross_gradient", byzantine, {"client_gradient": lambda c: hostile}))
    assert rows.shape == (2, 2, 3) and torch.equal(messages, before)
    assert torch.equal(rows[..., 0], torch.full((2, 2), -1.0, dtype=F64))
    assert rows[..., 1].isnan().all() and (rows[..., 2] == math.inf).all()


# -- Table 1's FC on private label --------------------------------------------------------------
def test_table1_private_label_fc_runs_the_official_settings():
    """Private label: 15 groups at 300 clients, 3 clustering rounds, the official
    rules, batch 1000 (more than a client's ~200 images: the whole local set, one
    round per epoch) and 50 epochs for the others' 30.  Rotation keeps 16 groups and
    the mode's batch and epochs (200 images in batches of 32: 7 rounds per epoch)."""
    from robust_pfl.recipes import table1

    full = table1.MNIST_FULL
    fc = table1.methods("private_label", 300)["FC"]
    assert fc["groups"] == 15 and fc["clustering_rounds"] == 3 and fc["subgroup_split"] == "chunks"
    assert fc["radius"] == {"policy": "quantile", "q": 0.2, "rule": "official"}
    assert table1.cell_length("private_label", "FC", full, samples=200) == {"batch_size": 1000, "rounds": 50}
    assert table1.methods("rotation", 300)["FC"]["groups"] == 16
    for kind, method in (("rotation", "FC"), ("private_label", "Local")):
        assert table1.cell_length(kind, method, full, samples=200) == {"batch_size": 32, "rounds": 30 * 7}
    quick = table1.cell_length("private_label", "FC", table1.MNIST_QUICK, samples=200)
    assert quick == {"batch_size": 1000, "rounds": 5}  # round(3 * 50 / 30) epochs
    for spec in (fc, table1.methods("rotation", 300)["FC"]):
        FederatedClusteringParams(**{k: v for k, v in spec.items() if k != "name"})  # valid options


def test_listings_state_each_option_and_its_default():
    """``robust-pfl defenses`` / ``attacks`` print these descriptions and summaries."""
    fields = FederatedClusteringParams.model_fields
    assert fields["subgroup_split"].default == "balanced"
    assert "chunks" in fields["subgroup_split"].description and "balanced (default)" in fields["subgroup_split"].description
    radius = fields["radius"].description
    assert "rule = interpolated (default" in radius and "official" in radius
    assert "fit = lloyd (default" in radius and "kmeans++" in radius
    assert "client_model" in attacks.BitFlip.summary and "own honest row (default)" in attacks.BitFlip.summary
