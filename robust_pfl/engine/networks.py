"""Image-classification networks on flat parameter vectors.

Every network here is an :class:`~robust_pfl.engine.objectives.Objective`: a client's model is
one row of the stacked ``X[N, d]``, and the generic ``torch.func`` path (``vmap`` over
clients of ``grad`` of :meth:`Objective.loss`) gives ``paired_gradients``,
``cross_gradients``, ``cross_losses`` and the batched predictions unchanged.

* :class:`ModuleObjective` wraps any *stateless* ``torch.nn.Sequential`` ending in an
  ``nn.Linear`` (the head) with ``torch.func.functional_call``;
* :func:`small_cnn` is a LeNet-like convolutional network (LeCun et al., "Gradient-based
  learning applied to document recognition", Proc. IEEE 1998);
* :func:`vgg` builds VGG-8/11/16 (Simonyan & Zisserman, "Very Deep Convolutional
  Networks for Large-Scale Image Recognition", ICLR 2015), scaled by a width factor;
* :func:`mlp_classifier` and :func:`logistic` return the hand-differentiated
  :class:`~robust_pfl.engine.objectives.DenseNetwork` (images are flattened);
* :func:`make_network` builds any of them from a config mapping, validating it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, Literal, Mapping, Sequence, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call

from robust_pfl.engine.objectives import DenseNetwork, Objective, loss_from_outputs
from robust_pfl.engine.registry import did_you_mean

ClassificationLoss = Literal["cross_entropy", "softmax_nll"]
CLASSIFICATION_LOSSES: tuple[str, ...] = ("cross_entropy", "softmax_nll")

#: A convolutional plan: output channels of a 3x3 convolution (padding 1) + ReLU, or
#: ``"M"`` for a 2x2 max-pool.
Plan = Sequence[int | Literal["M"]]

#: VGG convolutional plans.  11 and 16 are configurations A and D of Simonyan &
#: Zisserman (2015, Table 1).  8 is the five-convolution "VGG-8" of federated-learning
#: papers (one convolution per block, 64-128-256-512-512).  With the default two hidden
#: classifier layers the depth counts weight layers as in the paper (5 + 3 = 8,
#: 8 + 3 = 11, 13 + 3 = 16).
VGG_PLANS: dict[int, tuple[int | str, ...]] = {
    8: (64, "M", 128, "M", 256, "M", 512, "M", 512, "M"),
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
}


def _check_choice(field: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ValueError(f"{field} must be one of {list(allowed)}, got {value!r}")


def _check_int(field: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_positive(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{field} must be a positive number, got {value!r}")
    return float(value)


class ModuleObjective(Objective):
    """A stateless ``nn.Sequential`` classifier evaluated on flat parameter vectors.

    ``module_factory()`` must return an ``nn.Sequential`` whose last layer is an
    ``nn.Linear`` (the head: :meth:`features` is its input, :meth:`outputs` its
    output) and which holds no buffers: BatchNorm's running statistics would make the
    loss depend on hidden state, so use no normalisation or ``nn.GroupNorm``.

    Flat layout: the module's parameters in ``named_parameters()`` order, each
    flattened row-major (for a ``Sequential`` this puts the head's weight ``[C, F]``
    and bias ``[C]`` last).  The template module is built on the ``meta`` device (no
    memory, no random draws); the forward pass is
    ``functional_call(module, {name: view of params}, inputs)``.

    Args:
        module_factory: builds the network (called on the meta device here and on the
            CPU by :meth:`init`).
        loss: ``"cross_entropy"`` or ``"softmax_nll"`` (the official code's ``-p_y``).
        input_shape: if given, inputs ``[b, ...]`` are reshaped to ``[b, *input_shape]``
            (so flattened images work too).
    """

    def __init__(
        self,
        module_factory: Callable[[], nn.Module],
        loss: ClassificationLoss = "cross_entropy",
        input_shape: Sequence[int] | None = None,
    ) -> None:
        _check_choice("loss", loss, CLASSIFICATION_LOSSES)
        with torch.device("meta"):
            module = module_factory()
        if not isinstance(module, nn.Sequential) or len(module) == 0 or not isinstance(module[-1], nn.Linear):
            raise ValueError("module_factory must return an nn.Sequential whose last layer is nn.Linear")
        buffers = [name for name, _ in module.named_buffers()]
        if buffers:
            raise ValueError(
                f"the module must be stateless (no buffers such as BatchNorm running statistics; "
                f"use GroupNorm or no normalisation); found buffers {buffers}"
            )
        self.module_factory = module_factory
        self.loss_kind: ClassificationLoss = loss
        self.input_shape = None if input_shape is None else tuple(int(s) for s in input_shape)
        self._body = module[:-1]  # keeps the original child names ("0", "1", ...)
        head = str(len(module) - 1)
        slots, offset = [], 0
        for name, parameter in module.named_parameters():
            slots.append((name, parameter.shape, offset))
            offset += parameter.numel()
        self._slots: tuple[tuple[str, torch.Size, int], ...] = tuple(slots)
        self._head_names = (f"{head}.weight", f"{head}.bias")
        self.dim = offset
        self.num_classes = module[-1].out_features
        self.feature_dim = module[-1].in_features

    def _unflatten(self, params: Tensor) -> dict[str, Tensor]:
        """Views of one flat ``params[d]`` shaped like the module's parameters."""
        return {
            name: params[offset : offset + shape.numel()].reshape(shape)
            for name, shape, offset in self._slots
        }

    def _features_and_outputs(self, params: Tensor, inputs: Tensor) -> tuple[Tensor, Tensor]:
        tensors = self._unflatten(params)
        weight = tensors.pop(self._head_names[0])
        bias = tensors.pop(self._head_names[1], None)
        if self.input_shape is not None:
            inputs = inputs.reshape(inputs.shape[0], *self.input_shape)
        features = functional_call(self._body, tensors, (inputs,))
        return features, nn.functional.linear(features, weight, bias)

    def outputs(self, params: Tensor, inputs: Tensor) -> Tensor:
        """Logits ``[b, C]`` of one flat ``params[d]`` on ``inputs[b, ...]``."""
        return self._features_and_outputs(params, inputs)[1]

    def features(self, params: Tensor, inputs: Tensor) -> Tensor:
        """The head's input ``[b, F]``."""
        return self._features_and_outputs(params, inputs)[0]

    def loss(self, params: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
        out = self.outputs(params, inputs)
        return loss_from_outputs(out, targets, self.loss_kind).mean()

    def init(self, count: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
        """``count`` draws of the module's own default initialisation.

        Row ``r`` is the flat parameters of ``module_factory()`` built on the CPU with
        the global RNG seeded by the ``r``-th of ``count`` seeds drawn from
        ``generator`` (inside ``torch.random.fork_rng``, so the global RNG is left
        untouched).  Deterministic for a given generator state; rows are independent.
        The draws are made in the factory's dtype (float32) and then cast to ``dtype``,
        so float32 and float64 inits agree up to rounding.
        """
        seeds = torch.randint(0, 2**62, (count,), generator=generator, device=generator.device).tolist()
        out = torch.empty(count, self.dim, dtype=dtype)
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            for row, seed in enumerate(seeds):
                torch.manual_seed(seed)
                module = self.module_factory()
                out[row] = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        return out


# -- convolutional networks --------------------------------------------------------------
def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    if height < 1 or width < 1:
        raise ValueError(f"image_size must be positive, got {size}")
    return int(height), int(width)


def _conv_layers(in_channels: int, plan: Plan, size: tuple[int, int]) -> tuple[list[nn.Module], int]:
    """3x3 convolutions (padding 1) + ReLU and 2x2 max-pools following ``plan``; returns
    the layers and the flattened output size.  A pool that would shrink a side below 1
    pixel is skipped, so small images (8x8 digits) pass through deep plans."""
    layers: list[nn.Module] = []
    channels, (height, width) = in_channels, size
    for item in plan:
        if item == "M":
            if min(height, width) >= 2:
                layers.append(nn.MaxPool2d(2))
                height, width = height // 2, width // 2
        else:
            layers += [nn.Conv2d(channels, int(item), kernel_size=3, padding=1), nn.ReLU()]
            channels = int(item)
    return layers, channels * height * width


def _classifier(in_features: int, hidden: Sequence[int], num_classes: int) -> list[nn.Module]:
    """Flatten, then ``Linear + ReLU`` per hidden width, then the linear head."""
    layers: list[nn.Module] = [nn.Flatten()]
    for width in hidden:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return layers + [nn.Linear(in_features, num_classes)]


def _plan_module(
    in_channels: int, plan: Plan, size: tuple[int, int], hidden: Sequence[int], num_classes: int
) -> nn.Sequential:
    """A plain (no normalisation, no dropout) convolutional classifier."""
    convs, flat = _conv_layers(in_channels, plan, size)
    return nn.Sequential(*convs, *_classifier(flat, hidden, num_classes))


def _scaled(channels: int, width: float) -> int:
    return max(1, round(channels * width))


def small_cnn(
    in_channels: int,
    num_classes: int,
    image_size: int | Sequence[int],
    width: int = 32,
    loss: ClassificationLoss = "cross_entropy",
) -> ModuleObjective:
    """LeNet-like CNN (LeCun et al. 1998): two blocks of 3x3 convolution (padding 1) +
    ReLU + 2x2 max-pool, with ``width`` and ``2 * width`` channels, then one linear
    layer to ``num_classes``.  8x8 digits -> 4x4 -> 2x2, 28x28 MNIST -> 7x7, 32x32
    CIFAR -> 8x8; features are the flattened last block, ``2 * width * (H/4) * (W/4)``.
    """
    _check_int("width", width, 1)
    size = _pair(image_size)
    plan = (width, "M", 2 * width, "M")
    factory = partial(_plan_module, in_channels, plan, size, (), num_classes)
    return ModuleObjective(factory, loss=loss, input_shape=(in_channels, *size))


def vgg(
    depth: int = 11,
    in_channels: int = 3,
    num_classes: int = 10,
    width: float = 1.0,
    image_size: int | Sequence[int] = 32,
    hidden_layers: int = 2,
    loss: ClassificationLoss = "cross_entropy",
) -> ModuleObjective:
    """VGG (Simonyan & Zisserman, ICLR 2015) for small images, without batch norm or
    dropout (the loss stays a deterministic function of the parameters).

    ``depth`` 11 and 16 are the paper's configurations A and D; 8 is the five-conv
    VGG-8 of federated-learning papers (see :data:`VGG_PLANS`).  Every channel count is
    multiplied by ``width`` (rounded, at least 1; e.g. 0.125 for CPU tests).  The
    classifier has ``hidden_layers`` ReLU layers of ``512 * width`` units (the paper's
    two 4096-unit layers, scaled down as is usual for CIFAR; the default 2 makes
    ``depth`` the number of weight layers), then the linear head.  On images smaller
    than 32x32 the pools that would shrink a side below 1 pixel are skipped (8x8: the
    last two of five).
    """
    _check_choice("depth", depth, sorted(VGG_PLANS))
    _check_positive("width", width)
    _check_int("hidden_layers", hidden_layers, 0)
    size = _pair(image_size)
    plan = tuple(item if item == "M" else _scaled(int(item), width) for item in VGG_PLANS[depth])
    hidden = (_scaled(512, width),) * hidden_layers
    factory = partial(_plan_module, in_channels, cast(Plan, plan), size, hidden, num_classes)
    return ModuleObjective(factory, loss=loss, input_shape=(in_channels, *size))


# -- dense networks ----------------------------------------------------------------------
def mlp_classifier(
    in_features: int,
    num_classes: int,
    hidden: Sequence[int] = (200,),
    loss: ClassificationLoss = "cross_entropy",
) -> DenseNetwork:
    """ReLU MLP on flattened inputs (hand-written batched backward pass).  784-200-10 is
    Werner et al.'s MNIST network; ``loss="softmax_nll"`` is the official code's quirk
    (softmax fed to an NLL loss, i.e. ``-p_y``)."""
    _check_choice("loss", loss, CLASSIFICATION_LOSSES)
    return DenseNetwork(in_features, num_classes, tuple(hidden), loss=loss)


def logistic(in_features: int, num_classes: int, loss: ClassificationLoss = "cross_entropy") -> DenseNetwork:
    """Multinomial logistic regression on flattened inputs; its features are the
    flattened inputs."""
    return mlp_classifier(in_features, num_classes, hidden=(), loss=loss)


# -- construction from a config mapping ---------------------------------------------------
_VGG_NAMES = {f"vgg{depth}": depth for depth in VGG_PLANS}
#: Options accepted by each model name (besides ``name``), with their defaults.
NETWORK_OPTIONS: dict[str, dict[str, Any]] = {
    "logistic": {"loss": "cross_entropy"},
    "mlp": {"hidden": (200,), "loss": "cross_entropy"},
    "cnn": {"width": 32, "loss": "cross_entropy"},
    **{name: {"width": 1.0, "hidden_layers": 2, "loss": "cross_entropy"} for name in _VGG_NAMES},
}


def make_network(spec: Mapping[str, Any], in_shape: tuple[int, int, int], num_classes: int) -> Objective:
    """Build a classifier from ``spec = {"name": ..., **options}`` for images of shape
    ``in_shape = (C, H, W)`` and ``num_classes`` classes.

    Names and options (defaults in :data:`NETWORK_OPTIONS`): ``logistic`` (``loss``),
    ``mlp`` (``hidden``: list of widths, ``loss``), ``cnn`` (:func:`small_cnn`;
    ``width``: channels of the first block, ``loss``), ``vgg8``/``vgg11``/``vgg16``
    (:func:`vgg`; ``width``: channel multiplier, ``hidden_layers``, ``loss``).

    Raises:
        ValueError: naming the field (``model.name``, ``model.width``, ...) and the
            allowed values.
    """
    name = spec.get("name")
    _check_choice("model.name", name, sorted(NETWORK_OPTIONS))
    allowed = NETWORK_OPTIONS[name]
    unknown = sorted(set(spec) - {"name"} - set(allowed))
    if unknown:
        raise ValueError(
            f"model.{unknown[0]} is not an option of {name!r}{did_you_mean(unknown[0], allowed)}; "
            f"allowed: {sorted(allowed)}"
        )
    if len(in_shape) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in in_shape):
        raise ValueError(f"in_shape must be (channels, height, width) positive integers, got {in_shape!r}")
    _check_int("num_classes", num_classes, 2)
    options = {**allowed, **{key: value for key, value in spec.items() if key != "name"}}
    loss = options["loss"]
    _check_choice("model.loss", loss, CLASSIFICATION_LOSSES)
    channels, height, width_px = in_shape
    if name == "logistic":
        return logistic(math.prod(in_shape), num_classes, loss=loss)
    if name == "mlp":
        hidden = options["hidden"]
        if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
            raise ValueError(f"model.hidden must be a list of positive integers, got {hidden!r}")
        widths = tuple(_check_int("model.hidden", h, 1) for h in hidden)
        return mlp_classifier(math.prod(in_shape), num_classes, hidden=widths, loss=loss)
    if name == "cnn":
        width = _check_int("model.width", options["width"], 1)
        return small_cnn(channels, num_classes, (height, width_px), width=width, loss=loss)
    width = _check_positive("model.width", options["width"])
    hidden_layers = _check_int("model.hidden_layers", options["hidden_layers"], 0)
    return vgg(
        _VGG_NAMES[name],
        in_channels=channels,
        num_classes=num_classes,
        width=width,
        image_size=(height, width_px),
        hidden_layers=hidden_layers,
        loss=loss,
    )
