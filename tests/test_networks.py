"""Tests for the image classifiers (robust_pfl.engine.networks) and the prediction API of
robust_pfl.engine.objectives.Objective (outputs, features, paired_outputs/features/accuracy).

Gradients and losses of every network kind are checked against an independent
reference: a plain ``torch.nn`` module with the flat row loaded into its parameters,
differentiated by autograd one client (and one model) at a time, in float64.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn.utils import vector_to_parameters

from robust_pfl import Batch, DenseNetwork, Objective
from robust_pfl.engine.networks import (
    ModuleObjective,
    logistic,
    make_network,
    mlp_classifier,
    small_cnn,
    vgg,
)

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
TOL = dict(rtol=1e-8, atol=1e-8)
CLASSES = 3

# (spec, image shape): tiny widths and images keep the whole module fast on a CPU.
KINDS = {
    "cnn": ({"name": "cnn", "width": 2}, (1, 8, 8)),
    "cnn_rect_softmax_nll": ({"name": "cnn", "width": 2, "loss": "softmax_nll"}, (2, 6, 10)),
    "vgg8": ({"name": "vgg8", "width": 0.125}, (3, 8, 8)),
    "vgg11": ({"name": "vgg11", "width": 0.125, "hidden_layers": 1}, (3, 8, 8)),
    "vgg16": ({"name": "vgg16", "width": 0.125, "hidden_layers": 0}, (3, 8, 8)),
    "vgg8_16px": ({"name": "vgg8", "width": 0.0625}, (3, 16, 16)),
    "mlp": ({"name": "mlp", "hidden": [5, 4]}, (1, 4, 4)),
    "mlp_softmax_nll": ({"name": "mlp", "hidden": [6], "loss": "softmax_nll"}, (2, 3, 3)),
    "logistic": ({"name": "logistic"}, (3, 2, 2)),
}


def reference_module(net: Objective, in_shape: tuple[int, int, int]) -> nn.Module:
    """An ordinary float64 ``nn.Module`` computing the same function (built
    independently of the flat-parameter code for DenseNetwork)."""
    if isinstance(net, ModuleObjective):
        module = net.module_factory()
        return nn.Sequential(nn.Unflatten(1, in_shape), module).to(F64)
    assert isinstance(net, DenseNetwork)
    sizes = [net.in_features, *net.hidden, net.out_features]
    layers: list[nn.Module] = [nn.Flatten()]
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if index < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(F64)


def reference_loss(module: nn.Module, loss_kind: str, inputs: Tensor, targets: Tensor) -> Tensor:
    logits = module(inputs.reshape(inputs.shape[0], -1))
    if loss_kind == "cross_entropy":
        return nn.functional.cross_entropy(logits, targets)
    return -torch.softmax(logits, -1).gather(1, targets.unsqueeze(1)).mean()


def reference_loss_and_grad(net, in_shape, row: Tensor, inputs: Tensor, targets: Tensor):
    """Loss and flat gradient of one model on one client's batch, by autograd on a
    plain module with ``row`` loaded into its parameters."""
    module = reference_module(net, in_shape)
    vector_to_parameters(row.detach().clone(), module.parameters())
    value = reference_loss(module, net.loss_kind, inputs, targets)
    grads = torch.autograd.grad(value, list(module.parameters()))
    return value.detach(), torch.cat([g.reshape(-1) for g in grads])


def make_case(kind: str, clients: int = 3, batch: int = 4, models: int = 2, seed: int = 0):
    spec, in_shape = KINDS[kind]
    net = make_network(spec, in_shape, CLASSES)
    g = torch.Generator().manual_seed(seed)
    params = net.init(max(clients, models), g, F64)
    params = params + 0.05 * torch.randn(params.shape, generator=g, dtype=F64)
    inputs = torch.randn(clients, batch, *in_shape, generator=g, dtype=F64)
    targets = torch.randint(0, CLASSES, (clients, batch), generator=g)
    return net, in_shape, params, Batch(inputs, targets)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_batched_gradients_and_losses_equal_per_client_autograd(kind):
    """paired_gradients[i] = grad f_i(x_i), cross_gradients[m, j] = grad f_j(x_m) and
    cross_losses[m, j] = f_j(x_m), each computed one (model, client) at a time by
    autograd on an ordinary nn.Module (float64, 1e-8)."""
    net, in_shape, params, batch = make_case(kind)
    n, models = batch.clients, 2
    reference = [
        [reference_loss_and_grad(net, in_shape, params[m], batch.inputs[j], batch.targets[j]) for j in range(n)]
        for m in range(n)
    ]
    paired = net.paired_gradients(params[:n], batch)
    assert paired.shape == (n, net.dim)
    torch.testing.assert_close(paired, torch.stack([reference[i][i][1] for i in range(n)]), **TOL)
    torch.testing.assert_close(
        net.paired_losses(params[:n], batch), torch.stack([reference[i][i][0] for i in range(n)]), **TOL
    )
    cross = net.cross_gradients(params[:models], batch)
    assert cross.shape == (models, n, net.dim)
    expected = torch.stack([torch.stack([reference[m][j][1] for j in range(n)]) for m in range(models)])
    torch.testing.assert_close(cross, expected, **TOL)
    losses = net.cross_losses(params[:models], batch)
    assert losses.shape == (models, n)
    expected = torch.stack([torch.stack([reference[m][j][0] for j in range(n)]) for m in range(models)])
    torch.testing.assert_close(losses, expected, **TOL)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_outputs_features_and_last_layer(kind):
    """outputs/features shapes; outputs equal the reference module's logits; the last
    linear layer (weight [C, F] then bias [C], the end of the flat vector) applied to
    the features reproduces the outputs; the batched forms equal the single-model ones
    for any chunk size."""
    net, in_shape, params, batch = make_case(kind, batch=5)
    n = batch.clients
    outputs = net.paired_outputs(params[:n], batch)
    features = net.paired_features(params[:n], batch)
    assert outputs.shape == (n, 5, CLASSES)
    feature_dim = features.shape[-1]
    assert features.shape == (n, 5, feature_dim)
    assert net.dim >= CLASSES * (feature_dim + 1)
    for i in range(n):
        module = reference_module(net, in_shape)
        vector_to_parameters(params[i].clone(), module.parameters())
        single = net.outputs(params[i], batch.inputs[i])
        torch.testing.assert_close(single, module(batch.inputs[i].reshape(5, -1)).detach(), **TOL)
        torch.testing.assert_close(outputs[i], single, **TOL)
        torch.testing.assert_close(features[i], net.features(params[i], batch.inputs[i]), **TOL)
        weight = params[i, -CLASSES * (feature_dim + 1) : -CLASSES].reshape(CLASSES, feature_dim)
        torch.testing.assert_close(features[i] @ weight.T + params[i, -CLASSES:], outputs[i], **TOL)
    for chunk in (1, 2, 5, 100):
        torch.testing.assert_close(net.paired_outputs(params[:n], batch, chunk=chunk), outputs, **TOL)
        torch.testing.assert_close(net.paired_features(params[:n], batch, chunk=chunk), features, **TOL)


def test_dense_feature_dimensions_and_func_engine():
    """DenseNetwork's features are the last hidden activation (flattened input without
    hidden layer); the manual fast path equals the torch.func engine; forward is kept
    as an alias of outputs."""
    g = torch.Generator().manual_seed(1)
    inputs = torch.randn(2, 6, 2, 3, 3, generator=g, dtype=F64)
    batch = Batch(inputs, torch.randint(0, 4, (2, 6), generator=g))
    for hidden, feature_dim in (((), 18), ((7,), 7), ((5, 3), 3)):
        manual = DenseNetwork(18, 4, hidden)
        func = DenseNetwork(18, 4, hidden, engine="func")
        params = manual.init(2, g, F64)
        features = manual.paired_features(params, batch)
        assert features.shape == (2, 6, feature_dim)
        torch.testing.assert_close(features, func.paired_features(params, batch), **TOL)
        torch.testing.assert_close(manual.paired_outputs(params, batch), func.paired_outputs(params, batch), **TOL)
        torch.testing.assert_close(manual.forward(params[0], inputs[0]), manual.outputs(params[0], inputs[0]))
    torch.testing.assert_close(DenseNetwork(18, 4).paired_features(params, batch), inputs.reshape(2, 6, 18))


def test_dense_network_accepts_image_shaped_inputs():
    """Every batched DenseNetwork method gives the same result on [N, b, C, H, W]
    inputs as on the flattened [N, b, C*H*W]."""
    g = torch.Generator().manual_seed(2)
    net = mlp_classifier(12, 3, hidden=(5,))
    params = net.init(3, g, F64)
    images = Batch(torch.randn(3, 4, 3, 2, 2, generator=g, dtype=F64), torch.randint(0, 3, (3, 4), generator=g))
    flat = Batch(images.inputs.reshape(3, 4, 12), images.targets)
    for method in (
        "paired_gradients",
        "cross_gradients",
        "cross_losses",
        "paired_losses",
        "paired_outputs",
        "paired_features",
        "paired_accuracy",
    ):
        torch.testing.assert_close(getattr(net, method)(params, images), getattr(net, method)(params, flat))


def test_paired_accuracy_hand_count():
    """A logistic model with identity weights predicts argmax of the input; accuracy is
    the fraction of samples whose input argmax equals the target, per client, in the
    parameters' dtype, for every chunk size and both the fast and generic paths."""
    net = logistic(3, 3)
    eye = torch.cat([torch.eye(3).reshape(-1), torch.zeros(3)])
    inputs = torch.tensor(
        [
            [[5.0, 0, 0], [0, 5, 0], [0, 0, 5], [5, 0, 0]],  # argmax 0 1 2 0
            [[0.0, 1, 0], [0, 1, 0], [2, 0, 0], [0, 0, 3]],  # argmax 1 1 0 2
        ]
    )
    targets = torch.tensor([[0, 1, 2, 1], [2, 2, 2, 2]])
    expected = torch.tensor([3 / 4, 1 / 4])
    batch = Batch(inputs, targets)
    for dtype in (torch.float32, F64):
        params = torch.stack([eye, eye]).to(dtype)
        batch_d = Batch(inputs.to(dtype), targets)
        for chunk in (None, 1, 3, 4):
            accuracy = net.paired_accuracy(params, batch_d, chunk=chunk)
            assert accuracy.dtype == dtype
            torch.testing.assert_close(accuracy, expected.to(dtype))
            torch.testing.assert_close(Objective.paired_accuracy(net, params, batch_d, chunk), expected.to(dtype))
    with pytest.raises(ValueError, match="chunk"):
        net.paired_accuracy(torch.stack([eye, eye]), batch, chunk=0)


def test_many_samples_are_evaluated_in_bounded_chunks(monkeypatch):
    """With chunk=None at most eval_rows client-sample rows are in one forward pass (a
    client's whole test split), and the chunked result equals the one-pass result."""
    net = small_cnn(1, CLASSES, 8, width=2)
    g = torch.Generator().manual_seed(3)
    params = net.init(2, g, F64)
    batch = Batch(torch.randn(2, 50, 1, 8, 8, generator=g, dtype=F64), torch.randint(0, 3, (2, 50), generator=g))
    whole = net.paired_outputs(params, batch, chunk=50)
    seen: list[int] = []
    original = ModuleObjective._paired_outputs

    def spy(self, rows, inputs):
        seen.append(inputs.shape[0] * inputs.shape[1])
        return original(self, rows, inputs)

    monkeypatch.setattr(ModuleObjective, "_paired_outputs", spy)
    monkeypatch.setattr(net, "eval_rows", 16)
    torch.testing.assert_close(net.paired_outputs(params, batch), whole, **TOL)
    assert len(seen) == 7 and max(seen) <= 16
    expected = (whole.argmax(-1) == batch.targets).to(F64).mean(-1)
    torch.testing.assert_close(net.paired_accuracy(params, batch), expected)


@pytest.mark.parametrize("kind", ["cnn", "vgg8", "mlp", "logistic"])
def test_init_deterministic_independent_rows_and_dtype(kind):
    """init is a function of the generator state only (the global RNG is neither used
    nor advanced), rows differ, and the dtype is respected."""
    spec, in_shape = KINDS[kind]
    global_state = torch.random.get_rng_state()
    net = make_network(spec, in_shape, CLASSES)
    first = net.init(3, torch.Generator().manual_seed(7), F64)
    torch.manual_seed(123)  # must not matter
    second = net.init(3, torch.Generator().manual_seed(7), F64)
    assert first.shape == (3, net.dim) and first.dtype == F64
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    assert not torch.equal(first, net.init(3, torch.Generator().manual_seed(8), F64))
    single = net.init(2, torch.Generator().manual_seed(7), torch.float32)
    assert single.dtype == torch.float32
    if isinstance(net, ModuleObjective):
        torch.testing.assert_close(single.to(F64), first[:2], rtol=0, atol=0)  # same draws, cast
        torch.manual_seed(0)
        state = torch.random.get_rng_state()
        net.init(2, torch.Generator().manual_seed(7), F64)
        assert torch.equal(torch.random.get_rng_state(), state)
    torch.random.set_rng_state(global_state)


def test_module_init_is_pytorch_default_initialisation():
    """Every conv / linear weight and bias is drawn from PyTorch's default
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as in a freshly built module."""
    net = vgg(8, in_channels=2, num_classes=4, width=0.25, image_size=8)
    row = net.init(1, torch.Generator().manual_seed(0), F64)[0]
    offset, checked = 0, 0
    for layer in net.module_factory():
        for parameter in layer.parameters():
            block = row[offset : offset + parameter.numel()]
            offset += parameter.numel()
            fan_in = layer.weight[0].numel()
            bound = fan_in**-0.5
            assert block.abs().max() <= bound
            if block.numel() >= 500:  # uniform: spread over the whole interval
                assert block.abs().max() > 0.95 * bound
                assert abs(block.std().item() - bound / 3**0.5) < 0.1 * bound
                checked += 1
    assert offset == net.dim and checked >= 5


def test_architectures():
    """Layer plans: small_cnn 8x8 -> 4 -> 2, 28 -> 7, 32 -> 8; VGG-8/11/16 have 5/8/13
    convolutions and 3 linear layers by default (depth = weight layers), widths scaled,
    pools skipped on small images; a module with BatchNorm buffers is refused."""

    def count(net: ModuleObjective, kind: type) -> int:
        return sum(isinstance(layer, kind) for layer in net.module_factory())

    for size, side in ((8, 2), (28, 7), (32, 8)):
        net = small_cnn(1, 10, size, width=4)
        assert net.feature_dim == 8 * side * side and count(net, nn.Conv2d) == 2
    for depth, convs in ((8, 5), (11, 8), (16, 13)):
        net = vgg(depth, width=0.25, image_size=32)
        assert (count(net, nn.Conv2d), count(net, nn.Linear), count(net, nn.MaxPool2d)) == (convs, 3, 5)
        assert net.feature_dim == 128 and net.num_classes == 10
        assert count(vgg(depth, width=0.25, image_size=8), nn.MaxPool2d) == 3
    assert vgg(8, width=0.25, image_size=8, hidden_layers=0).feature_dim == 128
    with pytest.raises(ValueError, match="stateless"):
        ModuleObjective(lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="nn.Linear"):
        ModuleObjective(lambda: nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    grouped = ModuleObjective(
        lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(16, 2)),
        input_shape=(1, 4, 4),
    )
    params = grouped.init(2, torch.Generator().manual_seed(0), torch.float32)
    batch = Batch(torch.randn(2, 3, 16), torch.tensor([[0, 1, 0], [1, 1, 0]]))
    assert grouped.paired_gradients(params, batch).shape == (2, grouped.dim)


@pytest.mark.parametrize(
    "spec, field",
    [
        ({}, "model.name"),
        ({"name": "resnet"}, "model.name"),
        ({"name": "vgg8", "width": 0}, "model.width"),
        ({"name": "vgg8", "width": "wide"}, "model.width"),
        ({"name": "cnn", "width": 2.5}, "model.width"),
        ({"name": "cnn", "depth": 3}, "model.depth"),
        ({"name": "mlp", "hidden": [0]}, "model.hidden"),
        ({"name": "mlp", "hidden": "200"}, "model.hidden"),
        ({"name": "logistic", "loss": "mse"}, "model.loss"),
        ({"name": "vgg16", "hidden_layers": -1}, "model.hidden_layers"),
        ({"name": "logistic", "width": 2}, "model.width"),
    ],
)
def test_make_network_errors_name_the_field(spec, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make_network(spec, (1, 8, 8), 10)


def test_make_network_kinds_and_argument_errors():
    assert isinstance(make_network({"name": "logistic"}, (1, 28, 28), 10), DenseNetwork)
    mlp = make_network({"name": "mlp"}, (1, 28, 28), 10)
    assert isinstance(mlp, DenseNetwork) and mlp.hidden == (200,) and mlp.in_features == 784
    assert make_network({"name": "mlp", "loss": "softmax_nll"}, (1, 8, 8), 10).loss_kind == "softmax_nll"
    assert isinstance(make_network({"name": "cnn"}, (3, 32, 32), 10), ModuleObjective)
    with pytest.raises(ValueError, match="in_shape"):
        make_network({"name": "cnn"}, (32, 32), 10)
    with pytest.raises(ValueError, match="num_classes"):
        make_network({"name": "cnn"}, (1, 8, 8), 1)
    with pytest.raises(ValueError, match="depth"):
        vgg(13)
