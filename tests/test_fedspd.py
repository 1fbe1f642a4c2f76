"""FedSPD (Lin, Yagin, Joe-Wong 2025): decentralised soft clustering on a graph.

The properties checked are the paper's: on a mixture of clusters inside every client
the centres reach the clusters' optima and the personalised model of eq. 2 beats one
global model (Sec. 3-4; the convex setting of Sec. 5); step 4 labels every point with
its lowest-loss centre; the proof's doubly stochastic W_s (Lemma A.1) preserves the
network mean of every cluster's centres, the experiments' uniform weights (eq. 1) do
not; dynamic graphs (App. B.2.4) change every round and are reproducible.  Plus the
testbed's own: hostile rows never reach an honest model, and what finite ones do.
"""

from __future__ import annotations

from robust_pfl.engine.types import AttackBase

import math

import pytest
import torch

import attacks
import defenses
from defenses.fedspd import FedSPD, cluster_weights, per_sample_losses
from robust_pfl import Federation
from robust_pfl.engine.data import ClientData
from robust_pfl.engine.graphs import GraphSpec, federation_graph, make_graph
from robust_pfl.engine.objectives import linear_regression, mlp

pytestmark = pytest.mark.usefixtures("single_thread")

DIM = 5


def mixture_task(seed: int = 0, clients: int = 20, samples: int = 40, byzantine: int = 0):
    """A mixture of two linear regressions inside every client: each point of client i
    follows ``y = <a, x>`` with probability ``share_i`` (0.8 or 0.2) and ``y = <b, x>``
    otherwise (FedSPD's data model, Sec. 3, with convex losses as in Sec. 5)."""
    g = torch.Generator().manual_seed(seed)
    optima = torch.randn(2, DIM, generator=g, dtype=torch.float64) * 3
    total = clients + byzantine
    share = torch.where(torch.arange(total) % 2 == 0, 0.8, 0.2).double()

    def split(m: int):
        x = torch.randn(total, m, DIM, generator=g, dtype=torch.float64)
        component = (torch.rand(total, m, generator=g, dtype=torch.float64) >= share[:, None]).long()
        y = (x * optima[component]).sum(-1) + 0.1 * torch.randn(total, m, generator=g, dtype=torch.float64)
        return ClientData(x, y), component

    (train, component), (test, _) = split(samples), split(200)
    mask = torch.zeros(total, dtype=torch.bool)
    mask[clients:] = True
    return optima, share, train, component, test, mask


def federation(train, mask, seed=0, attack=None, batch=8) -> Federation:
    clusters = torch.zeros(mask.numel(), dtype=torch.long)  # unused by FedSPD
    return Federation(linear_regression(DIM), train, clusters, mask, seed, batch, attack)


def trained(algo: FedSPD, rounds: int) -> FedSPD:
    for t in range(rounds):
        algo.step(t)
    return algo


# -- (a) it learns the clusters of a mixture and beats one global model -----------------------
@pytest.mark.parametrize("centre_init", ["shared", "independent"])
def test_learns_the_mixture_components_and_beats_global_and_local(centre_init):
    optima, share, train, component, test, mask = mixture_task()
    objective = linear_regression(DIM)
    results = {}
    fedspd_options = {"finetune_steps": 0, "centre_init": centre_init}
    for name, options in (("fedspd", fedspd_options), ("global", {}), ("local", {})):
        algo = defenses.build(name, federation(train, mask), {"lr": 0.05, **options})
        for t in range(200):
            algo.step(t)
        results[name] = float(objective.paired_losses(algo.client_models(), test).mean())
        if name == "fedspd":
            fedspd = algo
    # every point's label is its true component (up to the clusters' order)
    agree = float((fedspd.labels == component).double().mean())
    assert max(agree, 1 - agree) > 0.97
    # the centres reached the two optima, at every client (consensus)
    order = [0, 1] if agree > 0.5 else [1, 0]
    assert float((fedspd.centres[order] - optima[:, None]).norm(dim=-1).max()) < 0.5
    # the mixture weights are the clients' shares
    u = fedspd.mixture_weights[:, order[0]]
    assert float((u - share).abs().max()) < 0.2
    # eq. 2's personalised model is near the best single model for each client's mix
    ideal = share[:, None] * optima[0] + (1 - share[:, None]) * optima[1]
    best = float(objective.paired_losses(ideal, test).mean())
    assert results["fedspd"] < 1.1 * best
    assert results["fedspd"] < 0.8 * results["global"]
    assert results["fedspd"] < 0.9 * results["local"]


# -- step 4: the lowest-loss label, exactly ---------------------------------------------------
def test_relabelling_assigns_each_point_its_lowest_loss_centre():
    # 1-D regression without bias, x = 1: the loss of centre c on (1, y) is (c - y)^2 / 2
    targets = torch.tensor([[0.0, 1.0, 3.0, -2.0], [2.0, 2.5, 0.2, 5.0]], dtype=torch.float64)
    train = ClientData(torch.ones(2, 4, 1, dtype=torch.float64), targets)
    fed = Federation(linear_regression(1), train, torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.bool), 0)
    algo = FedSPD(fed, FedSPD.Params(graph=GraphSpec(kind="complete")))
    algo.centres = torch.tensor([[[0.0], [0.0]], [[2.0], [3.0]]], dtype=torch.float64)  # [S=2, N=2, d=1]
    labels = algo._lowest_loss_labels()
    # client 0: c = 0 or 2; y = 1 is a tie (0.5 each): the lower index wins
    # client 1: c = 0 or 3
    assert labels.tolist() == [[0, 0, 1, 0], [1, 1, 0, 1]]
    algo.labels = labels
    assert algo.mixture_weights.tolist() == [[0.75, 0.25], [0.25, 0.75]]


def test_every_step_ends_with_the_lowest_loss_labels_of_its_new_centres():
    _, _, train, _, _, mask = mixture_task(samples=12, clients=6)
    objective = linear_regression(DIM)
    algo = FedSPD(federation(train, mask), FedSPD.Params(centres=3, finetune_steps=0))
    for t in range(4):
        record = algo.step(t)
        # each loss from the objective's own loss on a one-point batch
        losses = torch.tensor(
            [
                [[float(objective.loss(algo.centres[s, i], train.inputs[i, k : k + 1], train.targets[i, k : k + 1]))
                  for k in range(12)] for i in range(6)]
                for s in range(3)
            ],
            dtype=torch.float64,
        )
        assert torch.equal(algo.labels, losses.argmin(dim=0))
        u = algo.mixture_weights
        assert torch.equal(record.extras["mixture_weights"], u)
        assert torch.allclose(u.sum(-1), torch.ones(6, dtype=torch.float64))
        assert torch.equal(record.assignment, u.argmax(-1))


def test_a_client_only_trains_clusters_it_holds_points_of():
    _, _, train, _, _, mask = mixture_task()
    algo = FedSPD(federation(train, mask), FedSPD.Params(centres=3))
    for t in range(30):
        before = algo.mixture_weights
        record = algo.step(t)
        chosen = before.gather(1, record.extras["selected"].unsqueeze(-1)).squeeze(-1)
        assert bool((chosen > 0).all())


def test_per_sample_losses_match_the_objective_on_one_point_batches():
    torch.manual_seed(0)
    net = mlp(6, (4,), 3)
    params = net.init(2, torch.Generator().manual_seed(1), torch.float64)
    data = ClientData(torch.randn(2, 5, 6, dtype=torch.float64), torch.randint(3, (2, 5)))
    expected = torch.tensor(
        [[float(net.loss(params[i], data.inputs[i, k : k + 1], data.targets[i, k : k + 1])) for k in range(5)]
         for i in range(2)],
        dtype=torch.float64,
    )
    assert torch.allclose(per_sample_losses(net, params, data), expected, atol=1e-12)

    class Plain:  # an objective without batched outputs: the vmap path
        dim = net.dim

        def loss(self, row, inputs, targets):
            return net.loss(row, inputs, targets)

    assert torch.allclose(per_sample_losses(Plain(), params, data), expected, atol=1e-12)


# -- the mixing matrices W_s (eq. 1; Alg. 1 line 24; Lemma A.1) -------------------------------
def weight_matrices(rule: str, seed: int = 0, n: int = 12, clusters: int = 3):
    graph = make_graph(GraphSpec(kind="erdos_renyi", p=0.3), n, torch.Generator().manual_seed(seed))
    selected = torch.randint(clusters, (n,), generator=torch.Generator().manual_seed(seed + 1))
    mixing = graph.mixing_weights(rule)
    return graph, selected, cluster_weights(mixing, selected, torch.arange(n), clusters, rule)


@pytest.mark.parametrize("rule", ["uniform", "metropolis"])
def test_only_clients_that_trained_a_cluster_change_it_and_rows_sum_to_one(rule):
    graph, selected, w = weight_matrices(rule)
    n = graph.n
    eye = torch.eye(n, dtype=w.dtype)
    closed = graph.adjacency | torch.eye(n, dtype=torch.bool)
    for s in range(w.shape[0]):
        assert torch.allclose(w[s].sum(-1), torch.ones(n, dtype=w.dtype))
        others = selected != s
        assert torch.equal(w[s][others], eye[others])  # Alg. 1 line 24: identity row
        trainers = ~others
        # a trainer mixes only centres of clients in its closed neighbourhood that trained s
        used = w[s][trainers] != 0
        assert bool((~used | (closed[trainers] & trainers.unsqueeze(0))).all())
        if rule == "uniform":  # eq. 1: the plain mean over those clients
            expected = (closed[trainers] & trainers.unsqueeze(0)).double()
            assert torch.allclose(w[s][trainers], expected / expected.sum(-1, keepdim=True))


def test_metropolis_weights_are_doubly_stochastic_uniform_are_not():
    found_uniform_counterexample = False
    for seed in range(5):
        _, _, metropolis = weight_matrices("metropolis", seed)
        assert torch.allclose(metropolis.sum(-2), torch.ones_like(metropolis.sum(-2)))
        assert torch.equal(metropolis, metropolis.transpose(-1, -2))
        _, _, uniform = weight_matrices("uniform", seed)
        found_uniform_counterexample |= not torch.allclose(uniform.sum(-2), torch.ones_like(uniform.sum(-2)))
    assert found_uniform_counterexample


def capture_exchange(algo: FedSPD, seen: list):
    """Wrap the algorithm's exchange to keep (centres before, trained, selected, graph)."""
    exchange = algo._exchange

    def wrapped(trained, selected, graph, round_index):
        seen.append((algo.centres.clone(), trained.clone(), selected.clone(), graph))
        return exchange(trained, selected, graph, round_index)

    algo._exchange = wrapped


@pytest.mark.parametrize("rule", ["uniform", "metropolis"])
def test_metropolis_mixing_preserves_every_clusters_network_mean(rule):
    """Lemma A.1: with a doubly stochastic W_s the mean over all clients of C_s (the
    trained rows in place) is what the exchange leaves; eq. 1's uniform weights move it."""
    _, _, train, _, _, mask = mixture_task(clients=16)
    spec = {"kind": "erdos_renyi", "p": 0.25, "weights": rule}
    algo = FedSPD(federation(train, mask), FedSPD.Params(graph=GraphSpec(**spec), finetune_steps=0))
    seen: list = []
    capture_exchange(algo, seen)
    gaps = []
    for t in range(5):
        algo.step(t)
        before, trained_rows, selected, _ = seen[-1]
        before[selected, torch.arange(16)] = trained_rows
        gaps.append(float((algo.centres.mean(1) - before.mean(1)).abs().max()))
    if rule == "metropolis":
        assert max(gaps) < 1e-12
    else:
        assert max(gaps) > 1e-3


# -- graphs: static and dynamic (App. B.2.4) --------------------------------------------------
def test_dynamic_graph_changes_every_round_and_is_reproducible():
    _, _, train, _, _, mask = mixture_task()
    spec = GraphSpec(kind="erdos_renyi", p=0.3, dynamic=True)
    runs = []
    for _ in range(2):
        algo = FedSPD(federation(train, mask), FedSPD.Params(graph=spec))
        seen: list = []
        capture_exchange(algo, seen)
        trained(algo, 4)
        runs.append(([g.adjacency for *_, g in seen], algo.client_models()))
    (graphs_a, models_a), (graphs_b, models_b) = runs
    assert all(torch.equal(a, b) for a, b in zip(graphs_a, graphs_b))
    assert all(not torch.equal(graphs_a[t], graphs_a[t + 1]) for t in range(3))
    assert torch.equal(models_a, models_b)
    fed = federation(train, mask)
    assert torch.equal(graphs_a[2], federation_graph(fed, spec, 2).adjacency)
    static = FedSPD(fed, FedSPD.Params(graph=GraphSpec(kind="erdos_renyi", p=0.3)))
    assert torch.equal(static.graph_of(0).adjacency, static.graph_of(3).adjacency)


def test_graph_parameters_are_validated_naming_the_field():
    _, _, train, _, _, mask = mixture_task(clients=4)
    with pytest.raises(ValueError, match="p"):
        defenses.build("fedspd", federation(train, mask), {"graph": {"kind": "erdos_renyi", "p": 0.0}})
    with pytest.raises(ValueError, match="centres"):
        defenses.build("fedspd", federation(train, mask), {"centres": 0})
    with pytest.raises(ValueError, match="lr_decay"):
        defenses.build("fedspd", federation(train, mask), {"lr_decay": 1.5})


def test_learning_rate_decays_every_lr_decay_every_rounds():
    _, _, train, _, _, mask = mixture_task(clients=4)
    algo = defenses.build("fedspd", federation(train, mask), {"lr": 0.05, "lr_decay": 0.8, "lr_decay_every": 3})
    assert [algo.learning_rate(t) for t in (0, 2, 3, 7)] == [0.05, 0.05, 0.05 * 0.8, 0.05 * 0.8**2]


# -- the personalised model (eq. 2 and the final phase) --------------------------------------
def test_personalised_model_is_the_mixture_of_centres_then_local_steps_cached_per_round():
    _, _, train, _, _, mask = mixture_task(clients=6)
    fed = federation(train, mask)
    plain = trained(FedSPD(fed, FedSPD.Params(finetune_steps=0)), 3)
    assert torch.allclose(plain.client_models(), torch.einsum("ns,snd->nd", plain.mixture_weights, plain.centres))
    tuned = trained(FedSPD(federation(train, mask), FedSPD.Params(finetune_steps=2, finetune_lr=0.01)), 3)
    start = torch.einsum("ns,snd->nd", tuned.mixture_weights, tuned.centres)
    once = start - 0.01 * fed.gradients(start, fed.train)  # full local data, as Alg. 1 line 42
    twice = once - 0.01 * fed.gradients(once, fed.train)
    models = tuned.client_models()
    assert torch.allclose(models, twice, atol=1e-12)
    assert tuned.client_models() is models  # cached within the round
    tuned.step(3)
    assert tuned.client_models() is not models


# -- attacks ---------------------------------------------------------------------------------
def expected_mix(before, trained_rows, selected, graph, byzantine, value, rule="uniform"):
    """Eq. 1 by hand for every honest client, the Byzantine rows replaced by ``value``
    (dropped when not finite)."""
    n = selected.numel()
    centres = before.clone()
    centres[selected, torch.arange(n)] = trained_rows
    out = centres.clone()
    closed = graph.adjacency | torch.eye(n, dtype=torch.bool)
    for i in range(n):
        if byzantine[i]:
            continue
        s = int(selected[i])
        rows = []
        for j in range(n):
            if closed[i, j] and int(selected[j]) == s:
                if byzantine[j] and j != i:
                    if math.isfinite(value):
                        rows.append(torch.full_like(trained_rows[j], value))
                else:
                    rows.append(centres[s, j])
        out[s, i] = torch.stack(rows).mean(0)
    return out


@pytest.mark.parametrize("value", [math.nan, math.inf, 7.0])
def test_hostile_rows_are_dropped_and_finite_ones_averaged_in_as_eq_1_says(value):
    _, _, train, _, _, mask = mixture_task(clients=10, byzantine=3)
    fed = federation(train, mask, attack=attacks.ConstantValue(value))
    algo = FedSPD(fed, FedSPD.Params(graph=GraphSpec(kind="erdos_renyi", p=0.4), finetune_steps=0))
    seen: list = []
    capture_exchange(algo, seen)
    for t in range(4):
        algo.step(t)
        before, trained_rows, selected, graph = seen[-1]
        expected = expected_mix(before, trained_rows, selected, graph, fed.byzantine, value)
        honest = ~fed.byzantine
        assert torch.allclose(algo.centres[:, honest], expected[:, honest], atol=1e-12)
    assert torch.isfinite(algo.client_models()[~fed.byzantine]).all()


@pytest.mark.parametrize(
    "attack, limit",
    [(attacks.LargeGradient(), None), (attacks.build("bit_flip"), 3.0)],
    ids=["large_gradient", "bit_flip"],
)
def test_under_attack_honest_models_stay_finite_and_the_damage_is_as_stated(attack, limit):
    """FedSPD averages whatever a neighbour sends (no robust aggregation): large
    gradients (N(1e6, 200^2) rows) ruin the honest models they reach, but never make
    them non-finite; sign-flipped centres (2 Byzantine of 22 clients) cost at most
    ``limit`` times the attack-free test loss."""
    optima, share, train, _, test, mask = mixture_task(byzantine=2)
    objective = linear_regression(DIM)
    honest = ~mask
    losses = {}
    for name, attacked in (("none", None), ("attack", attack)):
        algo = trained(FedSPD(federation(train, mask, attack=attacked), FedSPD.Params(lr=0.05)), 100)
        models = algo.client_models()[honest]
        assert torch.isfinite(models).all()
        honest_test = ClientData(test.inputs[honest], test.targets[honest])
        losses[name] = float(objective.paired_losses(models, honest_test).mean())
    if limit is None:
        assert losses["attack"] > 100 * losses["none"]  # the attack is not absorbed
    else:
        assert losses["attack"] < limit * losses["none"]


@pytest.mark.parametrize(
    "attack",
    [attacks.LargeGradient(mean=3.0, std=2.0), attacks.GaussianNoise(std=5.0), attacks.build("alie"), None],
    ids=["large_gradient", "gaussian_noise", "alie", "none"],
)
def test_the_memory_budget_does_not_change_results(attack):
    """``budget_mb`` only decides how many receivers are handled at once: the honest
    centres are the same with one receiver per chunk and with all in one (attacks
    that draw only the rows read draw one block per receiver, whatever the chunks)."""
    _, _, train, _, _, mask = mixture_task(clients=12, byzantine=3)
    spec = GraphSpec(kind="erdos_renyi", p=0.5)
    centres = []
    for budget in (1e-4, 256.0):  # 1e-4 MB: one receiver per chunk
        algo = trained(FedSPD(federation(train, mask, attack=attack), FedSPD.Params(graph=spec, budget_mb=budget)), 3)
        centres.append(algo.centres[:, ~mask])
    torch.testing.assert_close(centres[0], centres[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rule", ["uniform", "metropolis"])
def test_aggregate_probe_gives_what_the_honest_exchange_gives(rule):
    """The probe an adaptive attack may call: for the honest broadcast it returns the
    centre every client ends the round with for the cluster it trained."""
    _, _, train, _, _, mask = mixture_task(clients=10)
    spec = GraphSpec(kind="erdos_renyi", p=0.3, weights=rule)
    algo = FedSPD(federation(train, mask), FedSPD.Params(graph=spec, finetune_steps=0))
    seen: list = []
    capture_exchange(algo, seen)
    for t in range(3):
        algo.step(t)
        before, trained_rows, selected, graph = seen[-1]
        algo_centres = algo.centres
        algo.centres = before  # the state the probe was built on
        state = algo._defense_state(graph, selected, graph.mixing_weights(rule))
        algo.centres = algo_centres
        expected = algo.centres[selected, torch.arange(10)]
        assert torch.allclose(state["aggregate"](trained_rows), expected, atol=1e-12)
        stacked = state["aggregate"](torch.stack([trained_rows, trained_rows]))  # leading dimensions
        assert torch.allclose(stacked[1], expected, atol=1e-12)


@pytest.mark.parametrize("name", ["ball_edge", "neighbour_poison", "optimised"])
def test_per_receiver_attacks_see_each_receivers_own_centres_and_neighbourhood(name):
    """Adaptive attacks work per receiver (the leading dimension of the delivered
    messages): each receiver's state holds its own S centres ``[R, S, d]``, its closed
    neighbourhood ``[R, N]`` and a probe giving ``[..., R, 1, d]``; the run stays
    finite."""
    _, _, train, _, _, mask = mixture_task(clients=12, byzantine=3)
    seen: list = []

    class Spy(AttackBase):
        def __init__(self, inner):
            self.inner = inner
            self.needs = inner.needs

        def __call__(self, messages, context):
            seen.append((messages, context))
            return self.inner(messages, context)

    inner = attacks.build(name, {"base": {"name": "ipm"}} if name == "optimised" else {})
    fed = federation(train, mask, attack=Spy(inner))
    spec = GraphSpec(kind="erdos_renyi", p=0.4)
    algo = FedSPD(fed, FedSPD.Params(graph=spec, budget_mb=0.001))  # several receiver chunks
    trained(algo, 3)
    assert torch.isfinite(algo.client_models()[~mask]).all()
    graph = federation_graph(fed, spec)
    messages, context = seen[-1]
    receivers, state = context.receivers, context.defense_state
    assert state["centres"].shape == (receivers.numel(), algo.params.centres, messages.shape[-1])
    assert torch.equal(state["centres"][:, 0], state["all_centres"][0, receivers])
    own = torch.zeros(receivers.numel(), mask.numel(), dtype=torch.bool)
    own[torch.arange(receivers.numel()), receivers] = True
    assert torch.equal(state["neighbours"], graph.adjacency[receivers] | own)
    probe = state["aggregate"](messages)
    assert probe.shape == (receivers.numel(), 1, messages.shape[-1])
