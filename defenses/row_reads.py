"""Kernels that read only some rows of a large ``z[B, N, d]`` (the points of
Threshold-Clustering, Werner et al. Alg. 3): products of chosen rows with a few vectors,
sparse weighted sums of rows, and per-thread scratch buffers that spare fresh multi-MB
tensors their page faults.  Shared by the inner-product evaluations of
:mod:`defenses.threshold_clustering` and :mod:`defenses.pairwise_clustering`."""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from torch import Tensor

from robust_pfl.engine.devices import engine

# Scratch tensors reused between calls, per thread, role, dtype and device: a fresh
# multi-MB tensor page-faults on every call, which costs several times the work done
# in it (benchmarks/README.md, "Kernel choices").  Only tensors that never leave a
# call live here, and no call runs inside another in the same thread (radius policies
# never cluster).
_SCRATCH = threading.local()


def scratch(role: str, shape: tuple[int, ...] | torch.Size, like: Tensor) -> Tensor:
    """An uninitialised ``shape`` tensor of ``like``'s dtype and device, the same
    memory on every call with this ``role`` in this thread."""
    buffers = _SCRATCH.__dict__.setdefault("buffers", {})
    key = (role, like.dtype, like.device)
    size = math.prod(shape)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < size:
        buffer = like.new_empty(size)
        buffers[key] = buffer
    return buffer[:size].view(shape)


def _selected_rows(mask: Tensor, width: int, problems: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """For ``mask[B, ..., N]``: the positions of its set entries first (in order), then
    unset ones as padding, ``width`` per row (``order``); and the same positions as row
    indices into ``z.reshape(B * N, d)`` (``index``), or, when ``mask`` holds the
    problems ``problems[B]`` of a larger ``z``, into that ``z``'s rows."""
    order = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True)[..., :width]
    chosen = torch.arange(mask.shape[0], device=mask.device) if problems is None else problems
    offsets = chosen * mask.shape[-1]
    return order, order + offsets.view(-1, *([1] * (order.dim() - 1)))


def row_products(z: Tensor, rows: Tensor, vectors: Tensor) -> Tensor:
    """``<z_{b,j}, vectors_{b,k}>`` as ``[B, K, N]`` for the rows with ``rows[b, j]``
    (other entries are zero).  Only the chosen rows are read: they are gathered, in
    problem order, in blocks of about ``_BLOCK_BYTES`` into one reused buffer, and each
    block is multiplied while in cache by the vectors of the problems it spans (one
    slice of consecutive columns).  The loop is over row blocks, not clients; no
    problem reads another's rows as padding."""
    batch, n, dim = z.shape
    k = vectors.shape[1]
    out = z.new_zeros(batch, k, n)
    pairs = rows.nonzero()  # [P, 2]: (problem, row), grouped by problem
    if pairs.shape[0] == 0:
        return out
    problem, row = pairs[:, 0], pairs[:, 1]
    count = pairs.shape[0]
    flat = z.reshape(batch * n, dim)
    flat_index = problem * n + row
    columns = vectors.reshape(batch * k, dim).transpose(0, 1)  # [d, B K]
    block = _block_rows(z)
    buffer = scratch("gather", (min(block, count), dim), z)
    picked = z.new_empty(count, k)  # <z_j, vectors_k> of every chosen row
    if batch > 1:
        local = problem.unsqueeze(1) * k + torch.arange(k, device=z.device)  # its columns
        bounds = problem.tolist()
    for start in range(0, count, block):
        stop = min(start + block, count)
        gathered = torch.index_select(flat, 0, flat_index[start:stop], out=buffer[: stop - start])
        if batch == 1:
            torch.mm(gathered, columns, out=picked[start:stop])
            continue
        first, last = bounds[start], bounds[stop - 1]
        products = gathered @ columns[:, first * k : (last + 1) * k]  # [p, K x problems spanned]
        torch.gather(products, 1, local[start:stop] - first * k, out=picked[start:stop])
    out[problem, :, row] = picked
    return out


# Rows of ``z`` per block in :func:`_blocked_product` and :func:`row_products`: about
# 8 MB, so a block stays in cache while it is used (the blocked engine).  An
# accelerator's batched engine takes blocks of up to 256 MB instead: its kernels need
# work of that size to amortise their launch, and its memory holds them.
_BLOCK_BYTES = 8 << 20
_BATCHED_BLOCK_BYTES = 256 << 20


def _block_rows(z: Tensor) -> int:
    """Rows of ``z[..., d]`` per block on ``z``'s engine (see ``_BLOCK_BYTES``)."""
    size = _BLOCK_BYTES if engine(z.device) == "blocked" else _BATCHED_BLOCK_BYTES
    return max(1, size // (max(z.shape[-1], 1) * z.element_size()))


def _blocked_product(weights: Tensor, z: Tensor) -> Tensor:
    """``weights[B, K, N] @ z[B, N, d]`` accumulated over blocks of rows of ``z``.

    With few centres ``K`` the single product is slower (MKL streams ``z`` poorly for
    a ``[K, N] x [N, d]`` shape with tiny ``K``); blocks of ~8 MB of rows run near
    memory bandwidth (benchmarks/README.md, "Kernel choices").  The loop is over row
    blocks, not clients."""
    n = z.shape[1]
    rows = n if engine(z.device) == "batched" else _block_rows(z)
    if rows >= n:
        return torch.bmm(weights, z)
    out = torch.bmm(weights[..., :rows], z[:, :rows])
    for start in range(rows, n, rows):
        out.baddbmm_(weights[..., start : start + rows], z[:, start : start + rows])
    return out


def weighted_rows(weights: Tensor, z: Tensor, problems: Tensor | None = None) -> Tensor:
    """``weights[B, K, N] @ z[B, N, d]``; with ``problems[P]``, ``weights[P, K, N]``
    are those problems' weights and the result is ``weights @ z[problems]``, without
    copying those problems' rows when few weights are non-zero.  When few weights are
    non-zero, only those rows are read, in place, by ``embedding_bag`` (a weighted
    sum of rows per bag, without copying them); otherwise one product streams all of
    ``z``.

    Reading a few rows in place beats gathering them and beats the blocked product,
    but a single bag of most of the rows is slower than one product over all of them:
    hence the switch on the share of non-zero weights
    (benchmarks/README.md, "Kernel choices")."""
    _, n, dim = z.shape
    batch, k = weights.shape[:2]
    nonzero = weights != 0
    width = int(nonzero.sum(-1).amax()) if nonzero.numel() else 0
    if width == 0:
        return z.new_zeros(batch, k, dim)
    if k * width > n * (0.66 if k == 1 else 1.6):
        return _blocked_product(weights, z if problems is None else z[problems])
    # Rows with a non-zero weight first; the tail of a short bag repeats rows whose
    # weight is zero, so it adds nothing.
    order, index = _selected_rows(nonzero, width, problems)  # [B, K, w] each
    coefficients = torch.gather(weights, -1, order)
    sums = F.embedding_bag(
        index.reshape(batch * k, width),
        z.reshape(-1, dim),
        mode="sum",
        per_sample_weights=coefficients.reshape(batch * k, width),
    )
    return sums.view(batch, k, dim)
