"""Row selection and honest-row statistics shared by the attacks.

Messages are ``[..., S, d]``: the last-but-one axis holds the ``S`` sender rows, the
leading axes ``...`` are batch blocks (Federated-Clustering's ``[M, S, d]``: one block
per receiver model).  Every statistic here is computed per leading block, vectorised;
``context.byzantine`` (``[S]``) selects rows along the sender axis.

*Reference rows.*  The statistics an omniscient attacker uses (mean, std, ...) are
over the honest rows.  When a call has no honest sender at all (a subgroup made only
of Byzantine clients), they fall back to all rows, i.e. the Byzantine clients' own
honest vectors, so that every attack stays well defined.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from robust_pfl.engine.devices import engine, same_device
from robust_pfl.engine.types import AttackContext


def byzantine_count(context: AttackContext) -> int:
    """``B``, the number of Byzantine rows in this call."""
    return int(context.byzantine.sum())


def byzantine_shape(messages: Tensor, context: AttackContext) -> tuple[int, ...]:
    """``(..., B, d)``: the shape every attack returns."""
    return (*messages.shape[:-2], byzantine_count(context), messages.shape[-1])


def own_rows(messages: Tensor, context: AttackContext) -> Tensor:
    """``[..., B, d]``: each Byzantine client's own honest vector (a new tensor)."""
    return messages[..., context.byzantine.to(messages.device), :]


def reference_mask(context: AttackContext) -> Tensor:
    """``[S]`` bool: the honest rows, or every row when no sender is honest."""
    honest = ~context.byzantine
    return honest if bool(honest.any()) else torch.ones_like(honest)


def honest_rows(messages: Tensor, context: AttackContext) -> Tensor:
    """``[..., H, d]``: the reference (honest) rows of every leading block (a new
    tensor)."""
    run = _reference_run(context)
    if run is None:
        return messages[..., reference_mask(context).to(messages.device), :]
    return messages.narrow(-2, *run).clone(memory_format=torch.contiguous_format)


def honest_block(messages: Tensor, context: AttackContext) -> Tensor:
    """:func:`honest_rows`, as a view of ``messages`` when the reference rows are one
    contiguous run (the engines put honest senders first): no copy of ``[..., H, d]``
    for a statistic read at once.  The caller reads it and keeps none of it (the
    engine overwrites ``messages``' rows in place)."""
    run = _reference_run(context)
    if run is None:
        return messages[..., reference_mask(context).to(messages.device), :]
    return messages.narrow(-2, *run)


def _reference_run(context: AttackContext) -> tuple[int, int] | None:
    """``(first, count)`` when the reference rows are one contiguous run of senders,
    else ``None``."""
    (rows,) = reference_mask(context).nonzero(as_tuple=True)
    if rows.numel() == 0:  # no sender at all
        return None
    first, last = (int(v) for v in torch.stack([rows[0], rows[-1]]).tolist())
    return (first, rows.numel()) if last - first + 1 == rows.numel() else None


def rows_at(rows: Tensor, index: Tensor) -> Tensor:
    """``[..., B, d]``: ``rows[..., index[..., b], :]`` for each ``b`` (``rows[..., K,
    d]``, ``index[..., B]``), read by one ``index_select`` of whole rows (not through
    the ``[..., B, d]`` index tensor ``torch.take_along_dim`` broadcasts to)."""
    lead = torch.broadcast_shapes(rows.shape[:-2], index.shape[:-1])
    k, dim = rows.shape[-2:]
    flat = rows.expand(*lead, k, dim).reshape(-1, dim)
    blocks = torch.arange(math.prod(lead), device=index.device).view(*lead, 1) * k
    picked = flat.index_select(0, (blocks + index.expand(*lead, index.shape[-1])).reshape(-1))
    return picked.view(*lead, index.shape[-1], dim)


def honest_mean(messages: Tensor, context: AttackContext) -> Tensor:
    """``[..., 1, d]``: the honest mean of every leading block."""
    return honest_block(messages, context).mean(dim=-2, keepdim=True)


def mean_and_std(rows: Tensor) -> tuple[Tensor, Tensor]:
    """``([..., 1, d], [..., 1, d])``: per-coordinate mean and standard deviation of
    ``rows[..., H, d]``, the latter with Bessel's correction (``/(H - 1)``, as
    ``torch.std`` in the ALIE authors' code) and 0 for a single row.  Two passes:
    the mean, then the squared deviations; on the CPU the second goes through the
    leading blocks a few at a time, so its temporary stays in cache (each column's
    sum is the same sequence of additions either way, so the values are equal bit
    for bit); an accelerator takes all blocks in one launch."""
    mean = rows.mean(dim=-2, keepdim=True)
    dof = max(rows.shape[-2] - 1, 1)
    if engine(rows.device) == "batched" or rows.dim() < 3:
        return mean, ((rows - mean).square_().sum(dim=-2, keepdim=True) / dof).sqrt()
    blocks = rows.reshape(-1, *rows.shape[-2:])
    means = mean.reshape(-1, 1, rows.shape[-1])
    squares = torch.empty_like(means)
    step = max(1, _DEVIATION_BLOCK_BYTES // max(1, blocks[0].numel() * rows.element_size()))
    for start in range(0, blocks.shape[0], step):  # blocks of receivers, not clients
        part = slice(start, start + step)
        torch.sum(torch.sub(blocks[part], means[part]).square_(), dim=-2, keepdim=True, out=squares[part])
    return mean, (squares.view_as(mean) / dof).sqrt()


# Bytes of squared deviations :func:`mean_and_std` forms at once on the CPU (a few
# leading blocks, within a core's cache).
_DEVIATION_BLOCK_BYTES = 8 << 20


def client_row(messages: Tensor, context: AttackContext, client: int | None) -> Tensor:
    """``[..., 1, d]``: the row of global client ``client`` if it is an honest sender
    of this call; otherwise (``None``, absent from ``context.senders``, or Byzantine)
    the row of the honest sender with the lowest global index.  Chosen on the device
    by one ``argmin`` (no loop over senders)."""
    reference = reference_mask(context)
    senders = context.senders
    if senders is None:
        senders = torch.arange(reference.shape[0], device=reference.device)
    senders = senders.to(reference.device).long()
    # rank: -1 for the requested client, its global index for other reference rows,
    # and past every index for the rows that may not be copied
    rank = torch.where(reference, senders, torch.full_like(senders, torch.iinfo(torch.long).max))
    if client is not None:
        rank = torch.where(reference & (senders == client), torch.full_like(rank, -1), rank)
    row = rank.argmin().reshape(1).to(messages.device)
    return messages.index_select(-2, row)


def expand_rows(rows: Tensor, messages: Tensor, context: AttackContext) -> Tensor:
    """Broadcast ``rows`` (``[..., 1, d]`` or ``[..., B, d]``) to a fresh contiguous
    ``[..., B, d]`` tensor in ``messages``' dtype (never a view of ``messages``)."""
    shape = byzantine_shape(messages, context)
    return rows.to(messages.dtype).expand(shape).clone(memory_format=torch.contiguous_format)


def norm(vectors: Tensor, keepdim: bool = True) -> Tensor:
    """Euclidean norm over the last axis."""
    return torch.linalg.vector_norm(vectors, dim=-1, keepdim=keepdim)


def unit(vectors: Tensor) -> Tensor:
    """``v / ||v||`` over the last axis; a zero vector stays zero."""
    length = norm(vectors)
    return vectors / torch.where(length > 0, length, torch.ones_like(length))


def normal_rows(
    messages: Tensor, context: AttackContext, mean: float, std: float
) -> Tensor:
    """``[..., B, d]`` i.i.d. ``N(mean, std^2)`` drawn from ``context.generator`` (on
    its device, then moved to ``messages``'), in the order of :func:`fill_normal`."""
    rows = torch.empty(
        byzantine_shape(messages, context), device=context.generator.device, dtype=messages.dtype
    )
    fill_normal(rows, context.generator, mean, std)
    return rows.to(messages.device)


def fill_normal(rows: Tensor, generator: torch.Generator, mean: float, std: float) -> None:
    """Fill ``rows[..., B, d]`` in place with i.i.d. ``N(mean, std^2)``, one draw per
    leading ``[B, d]`` block in order, so a contiguous tensor and a strided view into a
    workspace (each block contiguous) receive the same values.  ``normal_`` on a
    strided tensor takes a serial path, far slower than per-block draws
    (benchmarks/README.md, "Kernel choices").

    A block of more than ``_PART_VALUES`` values is drawn in parts of that size, each
    from its own generator seeded by the attack stream (see :func:`_part_seeds`); the
    parts of all blocks are drawn together on a thread pool."""
    blocks = [rows] if rows.dim() <= 2 else list(rows.flatten(0, -3))
    parts: list[tuple[Tensor, int]] = []
    for block in blocks:
        seeds = _part_seeds(block, generator)
        if seeds is None:
            _fill_direct(block, generator, mean, std)
            continue
        flat = block.view(-1)
        parts.extend((flat[i * _PART_VALUES : (i + 1) * _PART_VALUES], seed) for i, seed in enumerate(seeds))
    if parts:
        _draw_parts(parts, mean, std)


# A block of more than this many values is drawn in parts of this size, each from its
# own generator seeded by the attack stream, on a thread pool: ``normal_`` runs on one
# core, so parts drawn on several cores finish sooner
# (benchmarks/README.md, "Kernel choices").  The parts are fixed by size, so the
# values never depend on the number of threads.
_PART_VALUES = 1 << 19
_POOL: dict[int, ThreadPoolExecutor] = {}  # by process id: a forked child makes its own


def _part_seeds(block: Tensor, generator: torch.Generator) -> list[int] | None:
    """The seeds of ``block``'s parts, drawn from ``generator``; ``None`` when the block
    is drawn from ``generator`` itself (small, not contiguous, or not on the CPU)."""
    values = block.numel()
    on_cpu = block.device.type == "cpu" and same_device(block.device, generator.device)
    if values <= _PART_VALUES or not on_cpu or not block.is_contiguous():
        return None
    return torch.randint(0, 2**62, (math.ceil(values / _PART_VALUES),), generator=generator).tolist()


def _fill_direct(block: Tensor, generator: torch.Generator, mean: float, std: float) -> None:
    if not same_device(block.device, generator.device):
        drawn = torch.empty(block.shape, dtype=block.dtype, device=generator.device)
        fill_normal(drawn, generator, mean, std)
        block.copy_(drawn)
        return
    block.normal_(mean, std, generator=generator)  # in place: no temporaries


def _draw_parts(parts: list[tuple[Tensor, int]], mean: float, std: float) -> None:
    def draw(part: tuple[Tensor, int]) -> None:
        values, seed = part
        values.normal_(mean, std, generator=torch.Generator().manual_seed(seed))

    if torch.get_num_threads() == 1 or len(parts) == 1:
        for part in parts:
            draw(part)
        return
    pid = os.getpid()
    if pid not in _POOL:
        _POOL.clear()
        _POOL[pid] = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))
    list(_POOL[pid].map(draw, parts))
