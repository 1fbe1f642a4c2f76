"""Differentiable client objectives evaluated on flat parameter vectors.

Every client's model is one row of a stacked tensor ``X[N, d]`` (parameters are
tensors, clients a batch dimension: docs/design.md, "Layout").  An :class:`Objective`
knows how to turn one flat row plus one client's batch into a scalar loss, and offers
three batched evaluations that the algorithms need:

* ``paired_gradients(P[N, d], batch)``: ``g_i(x_i)`` for every client (Alg. 1, 4);
* ``cross_gradients(P[M, d], batch)``: ``g_j(x_m)`` for every model ``m`` and every
  client ``j`` (Federated-Clustering, Alg. 2 step 5);
* ``cross_losses(P[M, d], batch)``: ``f_j(x_m)`` (IFCA's cluster choice).

It also offers the prediction API that evaluation and model-based baselines (Ditto,
KNN-Per, accuracy metrics) code against: ``outputs`` / ``features`` of one model, and
their batched forms ``paired_outputs`` / ``paired_features`` / ``paired_accuracy``,
evaluated in chunks of samples so that a client's whole test split fits in memory.

The base class implements them with ``torch.func`` (``vmap`` over ``grad``), which is
exact for any loss written with torch operations.  :class:`DenseNetwork` overrides
them with a hand-written batched backward pass that turns the per-client work into a
few large matrix products (see ``benchmarks/``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch
from torch import Tensor
from torch.func import grad, vmap

from robust_pfl.engine.data import Batch
from robust_pfl.engine.devices import engine

LossKind = Literal["mse", "cross_entropy", "softmax_nll"]


class Objective:
    """A loss ``f(x; batch)`` on flat parameters, with batched gradient evaluations.

    Classification objectives also implement :meth:`outputs` and :meth:`features`
    (one model); the batched ``paired_*`` predictions then work unchanged.
    """

    dim: int
    #: Default bound on the (client, sample) rows evaluated at once by the batched
    #: predictions (``chunk=None``); subclasses with cheap rows raise it.
    eval_rows: int = 2048

    def loss(self, params: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
        """Mean loss of one flat parameter vector ``params[d]`` on one client's batch."""
        raise NotImplementedError

    def init(self, count: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
        """``count`` independent initial parameter vectors, shape ``[count, d]``."""
        raise NotImplementedError

    # -- batched evaluations (torch.func reference implementation) --------------------
    def paired_gradients(
        self, params: Tensor, batch: Batch, out: Tensor | None = None, blend: float | None = None
    ) -> Tensor:
        """``g_i(x_i)`` for all clients: ``params[N, d]`` -> ``[N, d]`` (written into
        ``out``, a reusable ``[N, d]`` buffer, if given).

        ``blend = alpha`` (with ``out``): ``out <- torch.lerp(out, g, alpha)``, i.e.
        ``alpha g + (1 - alpha) out`` (a momentum, Alg. 4 eq. 29), applied as the
        gradient is produced; no gradient tensor is kept."""
        result = vmap(grad(self.loss))(params, batch.inputs, batch.targets)
        return write_into(out, result, blend)

    def cross_gradients(self, params: Tensor, batch: Batch, out: Tensor | None = None) -> Tensor:
        """``g_j(x_m)`` for every model row ``m`` and client ``j``: ``[M, N, d]``.

        ``out``, if given, is a reusable ``[M, N, d]`` buffer that receives the result
        (large fresh allocations cost page faults: reuse one buffer across chunks).
        """
        per_client = vmap(grad(self.loss), in_dims=(None, 0, 0))
        result = vmap(per_client, in_dims=(0, None, None))(params, batch.inputs, batch.targets)
        return write_into(out, result)

    def cross_losses(self, params: Tensor, batch: Batch) -> Tensor:
        """``f_j(x_m)`` for every model row ``m`` and client ``j``: ``[M, N]``."""
        per_client = vmap(self.loss, in_dims=(None, 0, 0))
        return vmap(per_client, in_dims=(0, None, None))(params, batch.inputs, batch.targets)

    def paired_losses(self, params: Tensor, batch: Batch) -> Tensor:
        """``f_i(x_i)`` for all clients: ``[N]``."""
        return vmap(self.loss)(params, batch.inputs, batch.targets)

    # -- predictions ------------------------------------------------------------------
    def outputs(self, params: Tensor, inputs: Tensor) -> Tensor:
        """Network output (logits) ``[b, C]`` of one flat ``params[d]`` on ``inputs[b, ...]``."""
        raise NotImplementedError(f"{type(self).__name__} has no network outputs")

    def features(self, params: Tensor, inputs: Tensor) -> Tensor:
        """Penultimate representation ``[b, F]`` (the input of the last linear layer;
        the flattened input for a network without hidden layer)."""
        raise NotImplementedError(f"{type(self).__name__} has no features")

    def paired_outputs(self, params: Tensor, batch: Batch, chunk: int | None = None) -> Tensor:
        """Outputs of model ``i`` on client ``i``'s inputs: ``params[N, d]`` -> ``[N, b, C]``.

        ``chunk``: samples per client evaluated at once (``None``: at most
        :attr:`eval_rows` client-sample rows per pass, at least one sample per client).
        """
        return self._over_sample_chunks(self._paired_outputs, params, batch.inputs, chunk)

    def paired_features(self, params: Tensor, batch: Batch, chunk: int | None = None) -> Tensor:
        """Features of model ``i`` on client ``i``'s inputs: ``[N, b, F]`` (``chunk`` as in
        :meth:`paired_outputs`)."""
        return self._over_sample_chunks(self._paired_features, params, batch.inputs, chunk)

    def paired_accuracy(self, params: Tensor, batch: Batch, chunk: int | None = None) -> Tensor:
        """Fraction of client ``i``'s samples with ``argmax outputs == target`` under model
        ``i``: ``[N]`` in ``params.dtype`` (``chunk`` as in :meth:`paired_outputs`; only
        the predicted classes are kept between chunks)."""

        def predictions(rows: Tensor, inputs: Tensor) -> Tensor:
            return self._paired_outputs(rows, inputs).argmax(-1)

        predicted = self._over_sample_chunks(predictions, params, batch.inputs, chunk)
        targets = batch.targets.to(predicted.device).long()
        return (predicted == targets).to(params.dtype).mean(-1)

    def _paired_outputs(self, params: Tensor, inputs: Tensor) -> Tensor:
        """:meth:`outputs` of ``params[N, d]`` on ``inputs[N, c, ...]`` in one pass."""
        return vmap(self.outputs)(params, inputs)

    def _paired_features(self, params: Tensor, inputs: Tensor) -> Tensor:
        """:meth:`features` of ``params[N, d]`` on ``inputs[N, c, ...]`` in one pass."""
        return vmap(self.features)(params, inputs)

    def _over_sample_chunks(
        self,
        evaluate: Callable[[Tensor, Tensor], Tensor],
        params: Tensor,
        inputs: Tensor,
        chunk: int | None,
    ) -> Tensor:
        """``evaluate(params, inputs[:, s:s+chunk])`` over consecutive sample chunks,
        concatenated along the sample dimension (a loop over chunks, never clients)."""
        clients, samples = inputs.shape[:2]
        if chunk is None:
            chunk = max(1, self.eval_rows // max(clients, 1))
        elif chunk < 1:
            raise ValueError(f"chunk must be a positive number of samples, got {chunk}")
        if chunk >= samples:
            return evaluate(params, inputs)
        parts = [evaluate(params, inputs[:, start : start + chunk]) for start in range(0, samples, chunk)]
        return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class _Layer:
    out_features: int
    in_features: int
    offset: int
    bias: bool = True

    @property
    def weight_size(self) -> int:
        return self.out_features * self.in_features

    @property
    def size(self) -> int:
        return self.weight_size + (self.out_features if self.bias else 0)


class DenseNetwork(Objective):
    """Fully connected ReLU network on flat parameters.

    ``hidden=()`` gives linear regression (``loss="mse"``, one output) or multinomial
    logistic regression (``loss="cross_entropy"``).  ``hidden=(200,)`` with 784 inputs
    and 10 outputs is the MLP of Werner et al.'s MNIST experiments.
    ``loss="softmax_nll"`` reproduces the official code's quirk (softmax output fed to
    an NLL loss, so the loss is ``-p_y``).

    Layout of the flat vector: for each layer, the row-major weight ``[out, in]`` then
    the bias ``[out]``.  ``mse`` is ``0.5 * ||out - y||^2`` averaged over the batch.

    ``bias=False`` drops every bias (the paper's linear regression has none).
    ``engine="manual"`` (default) uses the hand-written batched backward pass;
    ``engine="func"`` uses the generic ``torch.func`` path (the reference).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden: Sequence[int] = (),
        loss: LossKind = "cross_entropy",
        engine: Literal["manual", "func"] = "manual",
        bias: bool = True,
    ) -> None:
        if min(in_features, out_features, *hidden) < 1:
            raise ValueError("every layer width must be >= 1")
        if engine not in ("manual", "func"):
            raise ValueError(f"engine must be 'manual' or 'func', got {engine!r}")
        sizes = [in_features, *hidden, out_features]
        layers, offset = [], 0
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layer = _Layer(fan_out, fan_in, offset, bias)
            layers.append(layer)
            offset += layer.size
        self.layers: tuple[_Layer, ...] = tuple(layers)
        self.dim = offset
        self.in_features = in_features
        self.out_features = out_features
        self.hidden = tuple(hidden)
        self.loss_kind: LossKind = loss
        self.engine = engine
        self._scratch: dict[tuple, Tensor] = {}

    # -- parameters -------------------------------------------------------------------
    def _unflatten(self, params: Tensor, layer: _Layer) -> tuple[Tensor, Tensor]:
        """Views of one layer's weight ``[..., out, in]`` and bias ``[..., out]``."""
        lead = params.shape[:-1]
        w = params[..., layer.offset : layer.offset + layer.weight_size]
        if layer.bias:
            b = params[..., layer.offset + layer.weight_size : layer.offset + layer.size]
        else:
            b = params.new_zeros(*lead, layer.out_features)
        return w.reshape(*lead, layer.out_features, layer.in_features), b

    def init(self, count: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
        """PyTorch's default ``nn.Linear`` init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        out = torch.empty(count, self.dim, dtype=dtype)
        for layer in self.layers:
            bound = 1.0 / math.sqrt(layer.in_features)
            block = out[:, layer.offset : layer.offset + layer.size]
            block.uniform_(-bound, bound, generator=generator)
        return out

    # -- reference (single model, single client) ---------------------------------------
    def _features_and_outputs(self, params: Tensor, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """Last layer's input ``[b, F]`` and the output ``[b, out]`` for one flat
        ``params[d]`` on ``inputs[b, ...]`` (every sample flattened)."""
        a = inputs.reshape(inputs.shape[0], -1)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers[:last]):
            w, b = self._unflatten(params, layer)
            a = torch.relu(a @ w.T + b)
        w, b = self._unflatten(params, self.layers[last])
        return a, a @ w.T + b

    def outputs(self, params: Tensor, inputs: Tensor) -> Tensor:
        """Network output for one flat ``params[d]`` on ``inputs[b, ...]``: ``[b, out]``."""
        return self._features_and_outputs(params, inputs)[1]

    def features(self, params: Tensor, inputs: Tensor) -> Tensor:
        """Last hidden layer's activation ``[b, hidden[-1]]`` (the flattened input
        ``[b, in]`` when ``hidden=()``)."""
        return self._features_and_outputs(params, inputs)[0]

    def forward(self, params: Tensor, inputs: Tensor) -> Tensor:
        """Alias of :meth:`outputs` (the original name)."""
        return self.outputs(params, inputs)

    def loss(self, params: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
        out = self.outputs(params, inputs)
        return loss_from_outputs(out, targets, self.loss_kind).mean()

    # -- batched fast path -------------------------------------------------------------
    def paired_gradients(
        self, params: Tensor, batch: Batch, out: Tensor | None = None, blend: float | None = None
    ) -> Tensor:
        if self.engine == "func":
            return super().paired_gradients(params, batch, out, blend)
        x = batch.inputs.reshape(batch.inputs.shape[0], batch.inputs.shape[1], -1)
        block = None if out is None else out.unsqueeze(1)
        grads = self._batched_gradients(params, x, batch.targets, clients_per_model=1, out=block, blend=blend)
        return grads[:, 0]

    def cross_gradients(self, params: Tensor, batch: Batch, out: Tensor | None = None) -> Tensor:
        if self.engine == "func":
            return super().cross_gradients(params, batch, out)
        n, b = batch.inputs.shape[:2]
        x = batch.inputs.reshape(1, n * b, -1)
        y = batch.targets.reshape(1, n * b, *batch.targets.shape[2:])
        return self._batched_gradients(params, x, y, clients_per_model=n, out=out)

    def cross_losses(self, params: Tensor, batch: Batch) -> Tensor:
        n, b = batch.inputs.shape[:2]
        x = batch.inputs.reshape(1, n * b, -1)
        out = self._forward_rows(params, x)[-1]
        y = batch.targets.reshape(1, n * b, *batch.targets.shape[2:]).expand(
            out.shape[0], *batch.targets.reshape(n * b, *batch.targets.shape[2:]).shape
        )
        per_sample = loss_from_outputs(out, y, self.loss_kind)
        return per_sample.reshape(out.shape[0], n, b).mean(-1)

    # A row costs a few activation vectors: evaluate many clients' samples per pass.
    eval_rows = 16384

    def _paired_outputs(self, params: Tensor, inputs: Tensor) -> Tensor:
        if self.engine == "func":
            return super()._paired_outputs(params, inputs)
        return self._forward_rows(params, inputs.reshape(*inputs.shape[:2], -1))[-1]

    def _paired_features(self, params: Tensor, inputs: Tensor) -> Tensor:
        if self.engine == "func":
            return super()._paired_features(params, inputs)
        return self._forward_rows(params, inputs.reshape(*inputs.shape[:2], -1))[-2]

    def _forward_rows(self, params: Tensor, x: Tensor) -> list[Tensor]:
        """Activations for ``params[M, d]`` on rows ``x[M or 1, R, in]``.

        Returns ``[a_0, a_1, ..., a_{L-1}, z_L]``: the input, every hidden layer's
        post-ReLU activation, and the output layer's logits.
        """
        acts = [x]
        for index, layer in enumerate(self.layers):
            w, b = self._unflatten(params, layer)
            models, rows = w.shape[0], acts[-1].shape[1]
            if acts[-1].shape[0] == 1 and models > 1:
                # Input shared by all models (a cross evaluation): one [R, in] x [in, M out]
                # GEMM instead of a batched product over an expanded (copied) input.
                # The result is a strided [M, R, out] view of an [R, M, out] tensor.
                stacked = w.reshape(models * layer.out_features, layer.in_features)
                z = torch.addmm(b.reshape(1, -1), acts[-1][0], stacked.T)
                z = z.view(rows, models, layer.out_features).transpose(0, 1)
            else:
                z = torch.baddbmm(b.unsqueeze(1), acts[-1].expand(models, -1, -1), w.transpose(1, 2))
            acts.append(z.relu_() if index < len(self.layers) - 1 else z)
        return acts

    def _batched_gradients(
        self,
        params: Tensor,
        x: Tensor,
        y: Tensor,
        clients_per_model: int,
        out: Tensor | None = None,
        blend: float | None = None,
    ) -> Tensor:
        """Per-(model, client) gradients by a hand-written backward pass.

        ``x[M or 1, R, in]`` holds ``R = clients_per_model * batch`` rows per model;
        the gradient of each client's mean loss is taken over its own ``batch`` rows.
        Returns ``[M, clients_per_model, d]``; with ``blend`` each block is blended
        into ``out`` as in :meth:`Objective.paired_gradients`.
        """
        models = params.shape[0]
        c = clients_per_model
        acts = self._forward_rows(params, x)
        logits = acts[-1]
        per_client = logits.shape[1] // c
        dz = _output_gradient(logits, y, self.loss_kind) / per_client  # [M, R, out]
        if blend is not None and out is None:
            raise ValueError("blend needs an out tensor to blend into")
        grads = params.new_empty(models, c, self.dim) if out is None else out
        for index in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[index]
            a_prev = acts[index]
            a_prev_c = a_prev.reshape(a_prev.shape[0], c, per_client, layer.in_features)
            dz_c = dz.reshape(models, c, per_client, layer.out_features)
            weight_block = grads[..., layer.offset : layer.offset + layer.weight_size]
            _weight_gradients(dz_c, a_prev_c, weight_block, self._scratch, blend)
            if layer.bias:
                bias_block = grads[..., layer.offset + layer.weight_size : layer.offset + layer.size]
                write_into(bias_block, dz_c.sum(2), blend)
            if index > 0:
                w, _ = self._unflatten(params, layer)
                dz = torch.bmm(dz, w).mul_(acts[index] > 0)  # ReLU'(z) = 1[a > 0]
        return grads


# Below this many weight-gradient entries per model, one broadcast matmul beats the
# per-model loop (Python overhead dominates); above it the loop avoids M input copies.
_LOOP_MIN_BLOCK = 1 << 16


def write_into(out: Tensor | None, value: Tensor, blend: float | None = None) -> Tensor:
    """``value`` written into ``out``: copied, or with ``blend = alpha`` blended as
    ``out <- torch.lerp(out, value, alpha)``; ``value`` itself when ``out`` is None."""
    if out is None:
        if blend is not None:
            raise ValueError("blend needs an out tensor to blend into")
        return value
    return out.copy_(value) if blend is None else out.lerp_(value, blend)


def _weight_gradients(
    dz: Tensor, a_prev: Tensor, out: Tensor, scratch: dict[tuple, Tensor], blend: float | None = None
) -> None:
    """Write per-(model, client) weight gradients ``dz^T a`` into ``out[M, c, out*in]``.

    ``dz[M, c, b, out]``; ``a_prev[M or 1, c, b, in]``.  When the layer input is shared
    by all models (the first layer of a cross evaluation), one ``bmm`` per model row,
    each batched over its clients, avoids materialising ``M`` copies of the input,
    which a broadcast ``matmul`` on CPU does at several times the cost.  Otherwise one
    ``bmm`` per block of (model, client) pairs.  Either way the products land in a
    reused scratch block of about ``_CACHE_BLOCK_BYTES`` and are copied from cache into
    the strided ``out``, cheaper than one product into a full-size scratch and one
    copy.  A fresh result per call page-faults; writing straight into the strided
    ``out`` (``bmm(out=...)``, in-place ``baddbmm_``) is slower too: it leaves MKL's
    batched path.  The loops are over cache-sized blocks, not over clients (the
    measurements: benchmarks/README.md, "Kernel choices").

    On an accelerator (the batched engine of :func:`robust_pfl.engine.devices.engine`) see
    :func:`_weight_gradients_batched`.
    """
    if engine(dz.device) == "batched" and blend is None:
        _weight_gradients_batched(dz, a_prev, out)
        return
    models, clients = dz.shape[:2]
    shape_out, shape_in = dz.shape[-1], a_prev.shape[-1]
    per_model = clients * shape_out * shape_in
    step = max(1, _CACHE_BLOCK_BYTES // (shape_out * shape_in * dz.element_size()))
    if engine(dz.device) == "batched":  # blended: whole blocks into the scratch, then lerp
        step = models * clients
    if a_prev.shape[0] == 1 and (models == 1 or per_model >= _LOOP_MIN_BLOCK):
        shared = a_prev[0]
        block = _scratch_block(scratch, (min(step, clients), shape_out, shape_in), dz)
        for m in range(models):
            for start in range(0, clients, step):
                part = block[: min(step, clients - start)]
                rows = slice(start, start + part.shape[0])
                torch.bmm(dz[m, rows].transpose(1, 2), shared[rows], out=part)
                write_into(out[m, rows], part.reshape(part.shape[0], -1), blend)
    elif a_prev.shape[0] == models:
        pairs = models * clients
        dz_pairs = dz.reshape(pairs, *dz.shape[2:]).transpose(1, 2)
        a_pairs = a_prev.reshape(pairs, *a_prev.shape[2:])
        if step >= pairs or out.stride(0) != clients * out.stride(1):
            # one block (also when the pairs' rows of ``out`` are not evenly spaced)
            block = _scratch_block(scratch, (pairs, shape_out, shape_in), dz)
            torch.bmm(dz_pairs, a_pairs, out=block)
            write_into(out, block.reshape(models, clients, -1), blend)
            return
        out_pairs = out.view(pairs, -1)
        block = _scratch_block(scratch, (step, shape_out, shape_in), dz)
        for start in range(0, pairs, step):
            part = block[: min(step, pairs - start)]
            rows = slice(start, start + part.shape[0])
            torch.bmm(dz_pairs[rows], a_pairs[rows], out=part)
            write_into(out_pairs[rows], part.reshape(part.shape[0], -1), blend)
    else:
        gw = torch.matmul(dz.transpose(-1, -2), a_prev)
        write_into(out, gw.reshape(models, clients, -1), blend)


def _weight_gradients_batched(dz: Tensor, a_prev: Tensor, out: Tensor) -> None:
    """:func:`_weight_gradients` on an accelerator: the products are written straight
    into the strided ``out`` (cuBLAS takes any batch stride), one product per model
    row when the input is shared by all models, else one for all pairs; no scratch
    copy.  The loop over model rows is over a chunk's receivers, each product batched
    over all clients."""
    models, clients = dz.shape[:2]
    shape_out, shape_in = dz.shape[-1], a_prev.shape[-1]
    target = out.view(models, clients, shape_out, shape_in)
    if a_prev.shape[0] == 1:
        shared = a_prev[0]
        for m in range(models):
            torch.bmm(dz[m].transpose(1, 2), shared, out=target[m])
        return
    if a_prev.shape[0] != models:
        target.copy_(torch.matmul(dz.transpose(-1, -2), a_prev))
        return
    pairs = models * clients
    left = dz.reshape(pairs, *dz.shape[2:]).transpose(1, 2)
    right = a_prev.reshape(pairs, *a_prev.shape[2:])
    if out.stride(0) == clients * out.stride(1):  # the pairs' rows evenly spaced: one strided batch
        torch.bmm(left, right, out=target.view(pairs, shape_out, shape_in))
    else:
        target.copy_(torch.bmm(left, right).view(models, clients, shape_out, shape_in))


# Scratch block of :func:`_weight_gradients`: products of this size stay in the
# last-level cache until they are copied out (the size chosen by measurement:
# benchmarks/README.md, "Kernel choices").
_CACHE_BLOCK_BYTES = 6 << 20


def _scratch_block(scratch: dict[tuple, Tensor], shape: tuple[int, ...], like: Tensor) -> Tensor:
    """A reused ``empty`` tensor of ``shape``: one per layer shape, at most four kept,
    least recently used dropped first."""
    key = (shape, like.dtype, like.device)
    block = scratch.pop(key, None)
    if block is None:
        while len(scratch) >= 4:
            scratch.pop(next(iter(scratch)))
        block = like.new_empty(shape)
    scratch[key] = block  # most recently used last
    return block


def _regression_targets(out: Tensor, targets: Tensor) -> Tensor:
    """Targets broadcastable against ``out[..., out_features]`` (scalar targets get a
    trailing output dimension)."""
    return targets if targets.dim() == out.dim() else targets.unsqueeze(-1)


def loss_from_outputs(out: Tensor, targets: Tensor, kind: LossKind) -> Tensor:
    """Per-sample loss (last dimension of ``out`` is the output layer)."""
    if kind == "mse":
        return 0.5 * (out - _regression_targets(out, targets)).pow(2).sum(-1)
    log_p = torch.log_softmax(out, dim=-1)
    picked = torch.gather(log_p, -1, targets.long().unsqueeze(-1)).squeeze(-1)
    if kind == "cross_entropy":
        return -picked
    return -picked.exp()


def _output_gradient(out: Tensor, targets: Tensor, kind: LossKind) -> Tensor:
    """d(per-sample loss)/d(out), matching :func:`loss_from_outputs`."""
    if kind == "mse":
        return out - _regression_targets(out, targets)
    p = torch.softmax(out, dim=-1)
    onehot = torch.zeros_like(p).scatter_(-1, targets.long().expand(p.shape[:-1]).unsqueeze(-1), 1.0)
    if kind == "cross_entropy":
        return p - onehot
    p_y = (p * onehot).sum(-1, keepdim=True)
    return -p_y * (onehot - p)


class ScalarFunctions(Objective):
    """One-dimensional per-client losses, for the papers' constructed examples.

    Client ``i``'s "data" is its index; ``functions[i](x)`` is its loss.  Used for the
    exact failure examples of Werner et al. Sec. 2.1.
    """

    def __init__(self, functions: Sequence[Callable[[Tensor], Tensor]]) -> None:
        self.functions = tuple(functions)
        self.dim = 1

    def loss(self, params: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
        x = params[0]
        index = inputs.reshape(-1)[0]
        value = torch.zeros_like(x)
        for i, f in enumerate(self.functions):
            value = torch.where(index == i, f(x), value)
        return value

    def init(self, count: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
        return torch.zeros(count, 1, dtype=dtype)


def linear_regression(in_features: int, bias: bool = False) -> DenseNetwork:
    """Least squares ``0.5 * mean (a^T x - y)^2`` (Werner et al. Sec. 4.1)."""
    return DenseNetwork(in_features, 1, hidden=(), loss="mse", bias=bias)


def logistic_regression(in_features: int, classes: int) -> DenseNetwork:
    """Multinomial logistic regression (softmax cross-entropy)."""
    return DenseNetwork(in_features, classes, hidden=(), loss="cross_entropy")


def mlp(
    in_features: int = 784,
    hidden: Sequence[int] = (200,),
    classes: int = 10,
    softmax_nll: bool = False,
) -> DenseNetwork:
    """ReLU MLP; the defaults are the 784-200-10 network of Werner et al.'s MNIST
    experiments.  ``softmax_nll=True`` reproduces the official code's loss ``-p_y``."""
    return DenseNetwork(in_features, classes, hidden, "softmax_nll" if softmax_nll else "cross_entropy")
