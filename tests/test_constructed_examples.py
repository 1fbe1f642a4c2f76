"""The exact 1-D failure examples of Werner et al. Sec. 2.1 (Fig. 1).

Client i's "data" is its index (one sample, input i); robust_pfl.ScalarFunctions
evaluates functions[i] for client i.  Everything is float64 and deterministic (full
batches, no Byzantine clients), so every trajectory below is hand-computable.
"""

from __future__ import annotations

import torch
import pytest

from defenses import build
from defenses.ifca import IFCA
from robust_pfl import ClientData, Federation, ScalarFunctions

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
ETA = 0.5


def federation(functions, cluster_ids) -> Federation:
    n = len(functions)
    data = ClientData(torch.arange(n, dtype=F64).view(n, 1, 1), torch.zeros(n, 1, dtype=F64))
    return Federation(
        ScalarFunctions(functions),
        data,
        torch.tensor(cluster_ids),
        torch.zeros(n, dtype=torch.bool),
    )


# -- Fig. 1a: Myopic-Clustering ---------------------------------------------------------


def f1(x):
    return x**2 / (6 * ETA)


def f2(x):
    y = x - 1
    return torch.where(x < 1, 4 * y**3 + 3 * y**4 + 1, y**2 / (2 * ETA) + 1)


def f3(x):
    return (x - 2) ** 2 / (2 * ETA)


def myopic_federation() -> Federation:
    # clients 1 and 2 share the optimum 0 (true cluster 0); client 3 is alone at 2
    return federation([f1, f2, f3], [0, 0, 1])


def test_myopic_example_functions_as_in_the_paper():
    """Sanity of the construction (Sec. 2.1): f2 is C^1 at x = 1 with f2'(1) = 0, so
    x = 1 is stationary for f2 but not optimal: f2(0) = 0 < f2(1) = 1; f1 and f2 share
    the minimiser 0, f3's is 2; at x0 = 1.5 the gradients are {1, 1, -1}."""
    x = torch.tensor([0.0, 1.0, 1.5], dtype=F64, requires_grad=True)
    (g2,) = torch.autograd.grad(f2(x).sum(), x)
    assert f2(x).tolist() == [0.0, 1.0, 1.25]
    assert g2.tolist() == [0.0, 0.0, 1.0]
    fed = myopic_federation()
    start = torch.full((3, 1), 1.5, dtype=F64)
    assert fed.gradients(start, fed.sample_batch()).view(-1).tolist() == [1.0, 1.0, -1.0]


def test_myopic_clustering_leaves_client_2_stuck_at_1():
    """Werner et al. Sec. 2.1, Fig. 1a: Myopic-Clustering (Alg. 1) with eta = 0.5, K = 2,
    all clients at x0 = 1.5.  Hand computation with the quantile radius q = 1/3 (the
    clustering of the gradients is exact): round 1 gradients {1, 1, -1} -> centres
    {1, -1}, models (1, 1, 2).  Round 2 gradients {2/3, 0, 0}: client 2 (f2'(1) = 0) is
    grouped with client 3 (at its optimum), receives 0 and never moves again, although
    its optimum is 0 (f2(0) = 0 < f2(1) = 1); client 1 alone contracts by 2/3 per round:
    x1 = (2/3)^(t-1).  In the end all three gradients are equal (0): the clients are
    indistinguishable, i.e. "all in one cluster"."""
    fed = myopic_federation()
    algo = build("myopic", fed, {"lr": ETA, "clusters": 2, "radius": {"policy": "quantile", "q": 1 / 3}})
    algo.models[:] = 1.5
    record = algo.step(0)
    assert record.gradients.view(-1).tolist() == [1.0, 1.0, -1.0]
    assert algo.client_models().view(-1).tolist() == [1.0, 1.0, 2.0]
    record = algo.step(1)
    assert record.gradients.view(-1).tolist() == pytest.approx([2 / 3, 0.0, 0.0], abs=1e-15)
    assert record.updates.view(-1).tolist() == pytest.approx([2 / 3, 0.0, 0.0], abs=1e-15)
    for t in range(2, 100):
        record = algo.step(t)
        models = algo.client_models().view(-1)
        assert models[1].item() == 1.0, f"client 2 moved in round {t}"
        assert models[2].item() == 2.0
        assert models[0].item() == pytest.approx((2 / 3) ** t, rel=1e-12)
    final = algo.client_models().view(-1)
    assert abs(final[0].item()) < 1e-12
    assert f2(final[1]).item() == 1.0 > f2(torch.tensor(0.0, dtype=F64)).item() == 0.0
    gradients = fed.gradients(algo.client_models(), fed.sample_batch()).view(-1)
    assert (gradients.max() - gradients.min()).item() <= 1e-12


def test_federated_clustering_solves_the_myopic_example():
    """Werner et al. Sec. 2.1: Federated-Clustering (Alg. 2) evaluates every client's
    gradient at every model, so client 2 sees that its gradients differ from client 3's
    at its own model and reaches its optimum 0; client 1 reaches 0 and client 3 stays at
    2.  Same functions (eta = 0.5 fixes them), but FC's own step is lr = 0.05: f2 has
    curvature 12 at 0, so a step of 0.5 is unstable there (FC with lr 0.5 does not
    converge); radius 1 fixed, start 1.5, 600 rounds."""
    fed = myopic_federation()
    algo = build("fc", fed, {"lr": 0.05, "radius": 1.0})
    algo.models[:] = 1.5
    for t in range(600):
        algo.step(t)
    models = algo.client_models().view(-1)
    assert models[0].item() == pytest.approx(0.0, abs=1e-8)
    assert models[1].item() == pytest.approx(0.0, abs=1e-8)
    assert models[2].item() == pytest.approx(2.0, abs=1e-8)


# -- Fig. 1b: IFCA / HypCluster ---------------------------------------------------------


def ifca_federation() -> Federation:
    return federation([lambda x: (x + 0.5) ** 2, lambda x: (x - 0.5) ** 2], [0, 1])


def test_ifca_stuck_with_both_clients_on_model_2():
    """Werner et al. Sec. 2.1, Fig. 1b: f1 = (x + 0.5)^2, f2 = (x - 0.5)^2, cluster
    models at -1.5 and 0.  Both clients have lower loss at 0 (0.25) than at -1.5 (1 and
    4), so both pick model 2, whose averaged gradient is (1 + (-1))/2 = 0 exactly: model
    2 never moves, model 1 is never updated, and neither client reaches its optimum."""
    fed = ifca_federation()
    algo = IFCA(fed, IFCA.Params(lr=0.1, clusters=2), initial_models=torch.tensor([[-1.5], [0.0]], dtype=F64))
    for t in range(50):
        record = algo.step(t)
        assert algo.assignment.tolist() == [1, 1]
        assert record.gradients.view(-1).tolist() == [1.0, -1.0]
        assert algo.models.view(-1).tolist() == [-1.5, 0.0]
    assert algo.client_models().view(-1).tolist() == [0.0, 0.0]


def test_federated_clustering_separates_the_ifca_example():
    """Werner et al. Sec. 2.1: FC separates the IFCA example: at any x the two clients'
    gradients 2(x + 0.5) and 2(x - 0.5) differ by 2 > radius 1, so each client follows
    its own gradient and reaches its own optimum (-0.5 and 0.5) from x = 0 (lr 0.1:
    error contracts by 0.8 per round)."""
    fed = ifca_federation()
    algo = build("fc", fed, {"lr": 0.1, "radius": 1.0})
    assert algo.client_models().view(-1).tolist() == [0.0, 0.0]
    for t in range(200):
        record = algo.step(t)
        torch.testing.assert_close(record.updates, record.gradients, rtol=0, atol=1e-15)
    models = algo.client_models().view(-1)
    assert models[0].item() == pytest.approx(-0.5, abs=1e-12)
    assert models[1].item() == pytest.approx(0.5, abs=1e-12)
