"""Devices: the one place that compares devices, resolves ``"auto"``, sizes memory
budgets and picks the engine a device runs.

* :func:`same_device` is the only device comparison in the package: ``"cuda"``
  (the current CUDA device) and ``"cuda:0"`` are the same device when device 0 is
  current, which ``torch.device.__eq__`` does not see.
* :func:`resolve_device` turns a config's ``device`` into a concrete one
  (``"auto"``: CUDA when present, else the CPU).
* :func:`memory_budget_mb` is the default working-set bound of the engines that
  chunk their work (FC's cross gradients, PDL-TC, FedSPD, the theory estimates): the
  CPU's fixed value, or a share of the free memory of a CUDA device.
* :func:`engine` says which of the two fast paths a device takes: ``"blocked"``
  (cache-sized blocks of matrix-vector and small matrix products, tuned for a few
  CPU cores and their caches) or ``"batched"`` (one large batched product where the
  blocked path makes many small ones: an accelerator is launch-bound on small
  kernels).  Code that differs by device asks this function and nothing else; see
  ``docs/design.md`` ("Devices").
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from typing import Iterator, Literal

import torch

# cuBLAS builds older than torch's per-stream workspaces need this for deterministic
# products, read once per process at its first product: set before any can run, unless
# the environment sets it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

DeviceLike = torch.device | str
Engine = Literal["blocked", "batched"]

#: The config values :func:`resolve_device` accepts, as a pattern (``cuda:N``, ``mps``).
DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?|mps"
#: Share of a CUDA device's free memory that a chunked engine may use by default.
#: The rest is left to the model, the data, the algorithm's own ``[N, d]`` tensors and
#: the products that follow a chunk (e.g. Threshold-Clustering's Gram matrices).
CUDA_BUDGET_SHARE = 0.25

_ENGINE_OVERRIDE: list[Engine] = []


def _index(device: torch.device) -> int:
    """The device's index, ``None`` read as the current device of its type."""
    if device.index is not None:
        return device.index
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def same_device(a: DeviceLike, b: DeviceLike) -> bool:
    """Whether ``a`` and ``b`` name the same device (``"cuda"`` is the current CUDA
    device, so it equals ``"cuda:0"`` while device 0 is current; ``"cpu"`` equals
    ``"cpu:0"``)."""
    first, second = torch.device(a), torch.device(b)
    return first.type == second.type and _index(first) == _index(second)


def resolve_device(spec: str) -> torch.device:
    """The device a config's ``device`` names: ``"auto"`` is CUDA when CUDA is
    available, else ``cpu``; a CUDA device always with its index (``"cuda"`` is the
    current one), so one card has one name.  Raises ``ValueError`` naming the devices
    present when the requested one is absent (CUDA not available, ``cuda:N`` beyond the
    count, MPS not available)."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{spec!r} requested but CUDA is not available (use 'cpu' or 'auto')")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{spec!r} requested but this machine has {count} CUDA device(s): cuda:0..cuda:{count - 1}")
        return torch.device("cuda", _index(device))
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{spec!r} requested but MPS is not available (use 'cpu' or 'auto')")
    return device


def memory_budget_mb(device: DeviceLike, cpu_default: int) -> int:
    """Default working-set bound in MiB on ``device``: ``cpu_default`` on the CPU (and
    MPS, whose memory is the host's); on CUDA, :data:`CUDA_BUDGET_SHARE` of the card's
    available memory as this process first saw it (:func:`available_cuda_bytes`), at
    least ``cpu_default``.  Cheap to call every round; nothing to checkpoint."""
    device = torch.device(device)
    if device.type != "cuda":
        return cpu_default
    return max(cpu_default, int(available_cuda_bytes(_index(device)) * CUDA_BUDGET_SHARE) >> 20)


@functools.lru_cache(maxsize=None)
def available_cuda_bytes(index: int) -> int:
    """Memory of CUDA card ``index`` free to the driver or held unused by torch's
    allocator, read once per process: a run's chunking then stays the same from round
    to round (its own workspaces would shrink a later reading), and a resumed run sizes
    it afresh on the machine it resumes on."""
    free, _ = torch.cuda.mem_get_info(index)
    return free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)


#: Device types that run the batched engine (the CPU, and shape-only "meta" tensors,
#: take the blocked one).
ACCELERATORS = ("cuda", "mps", "xpu")


def engine(device: DeviceLike) -> Engine:
    """The fast path ``device`` takes: ``"batched"`` on an accelerator
    (:data:`ACCELERATORS`), else ``"blocked"`` (see the module docstring);
    :func:`using_engine` overrides it."""
    if _ENGINE_OVERRIDE:
        return _ENGINE_OVERRIDE[-1]
    return "batched" if torch.device(device).type in ACCELERATORS else "blocked"


@contextmanager
def using_engine(kind: Engine) -> Iterator[None]:
    """Run the ``kind`` engine on every device inside the block: the tests run the
    accelerator's batched path on the CPU this way, against the blocked one."""
    if kind not in ("blocked", "batched"):
        raise ValueError(f"engine must be 'blocked' or 'batched', got {kind!r}")
    _ENGINE_OVERRIDE.append(kind)
    try:
        yield
    finally:
        _ENGINE_OVERRIDE.pop()


def describe_device(device: DeviceLike) -> str:
    """``"cpu"``, or a CUDA device with its card's name (``"cuda:0 (NVIDIA H200)"``),
    for results pages that name the machine."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    index = _index(device)
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
