"""Tests for the batched client objectives (robust_pfl.engine.objectives) and client data
sampling (robust_pfl.engine.data).

The algorithms need g_i(x_i) (Alg. 1, 4), g_j(x_m) for every model m and client j
(Federated-Clustering, Alg. 2 step 5) and f_j(x_m) (IFCA's choice).  DenseNetwork's
hand-written batched backward pass must equal the generic torch.func reference, which
in turn must equal an independent per-client autograd / finite-difference computation.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from robust_pfl import Batch, ClientData, DenseNetwork, Federation, Objective
from robust_pfl.engine import objectives

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
TOL = dict(rtol=1e-10, atol=1e-10)

seeds = st.integers(0, 2**31 - 1)
hiddens = st.sampled_from([(), (7,), (5, 6)])
losses = st.sampled_from(["mse", "cross_entropy", "softmax_nll"])


def make_case(seed, hidden, loss, bias, clients, batch, models, in_features, out_features, shaped_inputs):
    """A manual-engine net, its func-engine twin, parameters for `models` models and one
    batch per client (inputs optionally [b, 1, in] to exercise flattening; mse targets
    are scalar per sample when there is one output)."""
    g = torch.Generator().manual_seed(seed)
    manual = DenseNetwork(in_features, out_features, hidden, loss=loss, bias=bias)
    func = DenseNetwork(in_features, out_features, hidden, loss=loss, bias=bias, engine="func")
    params = manual.init(models, g, F64) + 0.3 * torch.randn(models, manual.dim, generator=g, dtype=F64)
    shape = (clients, batch, 1, in_features) if shaped_inputs else (clients, batch, in_features)
    inputs = torch.randn(*shape, generator=g, dtype=F64)
    if loss == "mse":
        if out_features == 1:
            targets = torch.randn(clients, batch, generator=g, dtype=F64)
        else:
            targets = torch.randn(clients, batch, out_features, generator=g, dtype=F64)
    else:
        targets = torch.randint(0, out_features, (clients, batch), generator=g)
    return manual, func, params, Batch(inputs, targets)


case_args = dict(
    seed=seeds,
    hidden=hiddens,
    loss=losses,
    bias=st.booleans(),
    clients=st.integers(1, 4),
    batch=st.integers(1, 4),
    models=st.integers(1, 3),
    in_features=st.integers(1, 4),
    out_features=st.integers(1, 4),
    shaped_inputs=st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(**case_args)
def test_manual_engine_equals_torch_func_reference(**case):
    """DenseNetwork's hand-written backward pass equals the torch.func reference
    (vmap over grad of the single-model loss) for g_i(x_i) and g_j(x_m), for linear
    models and ReLU MLPs, every loss, with and without biases (float64, 1e-10)."""
    manual, func, params, batch = make_case(**case)
    n = batch.inputs.shape[0]
    paired_params = params[torch.arange(n) % params.shape[0]]
    torch.testing.assert_close(
        manual.paired_gradients(paired_params, batch), func.paired_gradients(paired_params, batch), **TOL
    )
    cross = manual.cross_gradients(params, batch)
    assert cross.shape == (params.shape[0], n, manual.dim)
    torch.testing.assert_close(cross, func.cross_gradients(params, batch), **TOL)


@settings(max_examples=40, deadline=None)
@given(**case_args, block_bytes=st.sampled_from([1, 300, 3000]), alpha=st.floats(0.0, 1.0))
def test_weight_gradients_in_cache_blocks_equal_reference(block_bytes, alpha, **case):
    """The manual engine computes weight gradients in cache-sized blocks of (model,
    client) pairs and copies or blends each block out.  With blocks of one pair or a
    few, cross and paired gradients, and the blended momentum update
    ``out <- lerp(out, g, alpha)``, still equal the torch.func reference."""
    manual, func, params, batch = make_case(**case)
    n = batch.inputs.shape[0]
    paired_params = params[torch.arange(n) % params.shape[0]]
    reference = func.paired_gradients(paired_params, batch)
    start = torch.randn(n, manual.dim, dtype=F64, generator=torch.Generator().manual_seed(1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(objectives, "_CACHE_BLOCK_BYTES", block_bytes)
        torch.testing.assert_close(manual.paired_gradients(paired_params, batch), reference, **TOL)
        torch.testing.assert_close(manual.cross_gradients(params, batch), func.cross_gradients(params, batch), **TOL)
        blended = manual.paired_gradients(paired_params, batch, out=start.clone(), blend=alpha)
    torch.testing.assert_close(blended, torch.lerp(start, reference, alpha), **TOL)


@settings(max_examples=60, deadline=None)
@given(**case_args)
def test_losses_equal_per_client_loop(**case):
    """cross_losses[m, j] = f_j(x_m) and paired_losses[i] = f_i(x_i), where f_j is the
    mean loss of one model on client j's batch (checked against a plain Python loop of
    single-model loss evaluations, for both engines)."""
    manual, func, params, batch = make_case(**case)
    n = batch.inputs.shape[0]
    expected = torch.stack(
        [
            torch.stack([manual.loss(params[m], batch.inputs[j], batch.targets[j]) for j in range(n)])
            for m in range(params.shape[0])
        ]
    )
    torch.testing.assert_close(manual.cross_losses(params, batch), expected, **TOL)
    torch.testing.assert_close(func.cross_losses(params, batch), expected, **TOL)
    torch.testing.assert_close(Objective.cross_losses(manual, params, batch), expected, **TOL)
    paired_params = params[torch.arange(n) % params.shape[0]]
    paired = torch.stack([manual.loss(paired_params[i], batch.inputs[i], batch.targets[i]) for i in range(n)])
    torch.testing.assert_close(manual.paired_losses(paired_params, batch), paired, **TOL)
    torch.testing.assert_close(func.paired_losses(paired_params, batch), paired, **TOL)


def explicit_forward(params, inputs, sizes, bias):
    """The documented flat layout, written out independently: for each layer the
    row-major weight [out, in], then (if bias) the bias [out]; ReLU between layers."""
    a = inputs.reshape(inputs.shape[0], -1)
    offset = 0
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = params[offset : offset + fan_out * fan_in].reshape(fan_out, fan_in)
        offset += fan_out * fan_in
        a = a @ w.T
        if bias:
            a = a + params[offset : offset + fan_out]
            offset += fan_out
        if index < len(sizes) - 2:
            a = torch.relu(a)
    assert offset == params.numel()
    return a


def explicit_loss(out, targets, kind):
    if kind == "mse":
        targets = targets if targets.dim() == out.dim() else targets.unsqueeze(-1)
        return (0.5 * ((out - targets) ** 2).sum(-1)).mean()
    p = torch.softmax(out, dim=-1)[torch.arange(out.shape[0]), targets]
    return (-torch.log(p)).mean() if kind == "cross_entropy" else (-p).mean()


@pytest.mark.parametrize("loss", ["mse", "cross_entropy", "softmax_nll"])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_against_independent_autograd_and_finite_differences(loss, bias):
    """Independent check on a tiny 3-4-2 ReLU net: the library's loss equals an explicit
    forward pass over the documented parameter layout; paired and cross gradients equal
    torch.autograd of that explicit loss, client by client, and central finite
    differences (h = 1e-6) of it."""
    sizes = [3, 4, 2]
    g = torch.Generator().manual_seed(7)
    net = DenseNetwork(3, 2, (4,), loss=loss, bias=bias)
    assert net.dim == 3 * 4 + 4 * 2 + (4 + 2 if bias else 0)
    clients, batch = 3, 5
    params = torch.randn(2, net.dim, generator=g, dtype=F64)
    inputs = torch.randn(clients, batch, 3, generator=g, dtype=F64)
    targets = (
        torch.randn(clients, batch, 2, generator=g, dtype=F64)
        if loss == "mse"
        else torch.randint(0, 2, (clients, batch), generator=g)
    )
    data = Batch(inputs, targets)

    def f(x, j):
        return explicit_loss(explicit_forward(x, inputs[j], sizes, bias), targets[j], loss)

    expected = torch.empty(2, clients, net.dim, dtype=F64)
    for m in range(2):
        for j in range(clients):
            x = params[m].clone().requires_grad_(True)
            value = f(x, j)
            assert math.isclose(value.item(), net.loss(params[m], inputs[j], targets[j]).item(), rel_tol=1e-12)
            (expected[m, j],) = torch.autograd.grad(value, x)
    torch.testing.assert_close(net.cross_gradients(params, data), expected, rtol=1e-12, atol=1e-12)
    paired = net.paired_gradients(params[[0, 1, 0]], data)
    torch.testing.assert_close(paired, expected[[0, 1, 0], [0, 1, 2]], rtol=1e-12, atol=1e-12)
    h = 1e-6
    eye = torch.eye(net.dim, dtype=F64)
    for j in range(clients):
        numeric = torch.stack([(f(params[0] + h * e, j) - f(params[0] - h * e, j)) / (2 * h) for e in eye])
        torch.testing.assert_close(expected[0, j], numeric, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("engine", ["manual", "func"])
@pytest.mark.parametrize("hidden", [(), (5,)])
def test_cross_gradients_writes_into_the_given_buffer(engine, hidden):
    """cross_gradients(out=buffer) fills the given [M, N, d] buffer (FC reuses one
    workspace across chunks): the returned tensor shares the buffer's storage, every
    entry is overwritten (the buffer starts as NaN) and memory beyond it is untouched."""
    g = torch.Generator().manual_seed(3)
    net = DenseNetwork(4, 3, hidden, loss="cross_entropy", engine=engine)
    models, clients = 3, 4
    params = net.init(models, g, F64)
    data = Batch(torch.randn(clients, 2, 4, generator=g, dtype=F64), torch.randint(0, 3, (clients, 2), generator=g))
    size = models * clients * net.dim
    storage = torch.full((size + 11,), math.nan, dtype=F64)
    buffer = storage[:size].view(models, clients, net.dim)
    result = net.cross_gradients(params, data, out=buffer)
    assert result.data_ptr() == buffer.data_ptr()
    assert torch.isfinite(buffer).all()
    reference = DenseNetwork(4, 3, hidden, loss="cross_entropy", engine="func").cross_gradients(params, data)
    torch.testing.assert_close(buffer, reference, **TOL)
    assert torch.isnan(storage[size:]).all()
    # reusing the same buffer for a different chunk overwrites it completely
    again = net.cross_gradients(params[:1], data, out=storage[: clients * net.dim].view(1, clients, net.dim))
    torch.testing.assert_close(again[0], reference[0], **TOL)


def test_dense_network_rejects_bad_configuration():
    """Layer widths must be >= 1 and the engine 'manual' or 'func'."""
    with pytest.raises(ValueError, match="width"):
        DenseNetwork(3, 2, (0,))
    with pytest.raises(ValueError, match="engine"):
        DenseNetwork(3, 2, engine="jax")  # type: ignore[arg-type]


# -- ClientData.sample ---------------------------------------------------------------------


def indexed_data(clients: int, n: int) -> ClientData:
    """Sample j of client i has id i*n + j: inputs [N, n, 2] = (id, -id), targets id."""
    ids = torch.arange(clients * n, dtype=F64).view(clients, n)
    return ClientData(torch.stack([ids, -ids], dim=-1), ids.long())


@settings(max_examples=60, deadline=None)
@given(clients=st.integers(1, 5), n=st.integers(1, 8), batch_size=st.integers(1, 10), seed=seeds)
def test_sample_draws_distinct_own_samples(clients, n, batch_size, seed):
    """ClientData.sample: a batch of batch_size distinct samples per client, drawn
    from that client's own samples without replacement, inputs and targets aligned;
    the same generator seed gives the identical batch; batch_size >= n gives the full
    local data in order."""
    data = indexed_data(clients, n)
    batch = data.sample(batch_size, torch.Generator().manual_seed(seed))
    again = data.sample(batch_size, torch.Generator().manual_seed(seed))
    assert torch.equal(batch.inputs, again.inputs) and torch.equal(batch.targets, again.targets)
    if batch_size >= n:
        assert torch.equal(batch.inputs, data.inputs) and torch.equal(batch.targets, data.targets)
        return
    assert batch.inputs.shape == (clients, batch_size, 2)
    assert batch.targets.shape == (clients, batch_size)
    ids = batch.inputs[..., 0]
    assert torch.equal(batch.inputs[..., 1], -ids)
    assert torch.equal(batch.targets, ids.long())
    for i in range(clients):
        own = ids[i].long().tolist()
        assert len(set(own)) == batch_size
        assert all(i * n <= s < (i + 1) * n for s in own)


def test_sample_none_gives_full_data_and_batches_vary():
    """batch_size None means the full local data; with batch_size < n, successive
    draws from one generator are not all the same subset (sampling is random)."""
    data = indexed_data(3, 6)
    full = data.sample(None, torch.Generator().manual_seed(0))
    assert torch.equal(full.inputs, data.inputs) and torch.equal(full.targets, data.targets)
    g = torch.Generator().manual_seed(0)
    draws = {tuple(data.sample(2, g).targets.view(-1).tolist()) for _ in range(20)}
    assert len(draws) > 1


def test_federation_batches_are_reproducible_per_seed():
    """Seeded streams: two federations with the same seed draw identical batch
    sequences; a different seed draws a different one."""
    data = indexed_data(4, 10)
    net = DenseNetwork(2, 1, loss="mse")

    def run(seed):
        fed = Federation(net, data, torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.bool), seed=seed, batch_size=3)
        return [fed.sample_batch().targets.clone() for _ in range(5)]

    first, second, other = run(1), run(1), run(2)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
