"""Seeded random streams.  One seed in the config determines everything; each consumer
(data, initialisation, batches, attack, algorithm) gets its own stream so that adding
an attack never changes the data sampling."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Iterator

import torch

from robust_pfl.engine.devices import resolve_device


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed derived from ``(seed, stream)`` (stable across runs and hosts)."""
    digest = hashlib.sha256(f"{seed}/{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, stream: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded from ``(seed, stream)``."""
    g = torch.Generator(device=device)
    g.manual_seed(stream_seed(seed, stream))
    return g


def deterministic_kernels(device: torch.device | str) -> None:
    """Ask torch for deterministic kernels where a device has non-deterministic ones
    (CUDA's atomics-based reductions and scatters).  On the CPU every kernel
    robust-pfl uses is deterministic at a fixed thread count, and the flag would cost
    start-up time (it imports torch's compiler stack;
    benchmarks/README.md, "Kernel choices") and a NaN fill of every fresh tensor, so
    it is left as it is there (and the fill is turned off on CUDA).

    On CUDA (``CUBLAS_WORKSPACE_CONFIG`` is set when :mod:`robust_pfl.engine.devices` is
    imported): ``warn_only``, so an op without a deterministic CUDA kernel warns
    instead of failing a long run (the package uses none: the ``cuda`` tests fail on
    such a warning); and cuDNN's TF32 convolutions off, so a CNN's float32 results
    differ across devices by the order of sums alone."""
    if (device if isinstance(device, torch.device) else resolve_device(device)).type != "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
        # no code here reads memory it did not write, so the NaN fill of every fresh
        # tensor that the flag adds would only cost a pass over it
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.allow_tf32 = False


@contextmanager
def deterministic_kernels_within(device: torch.device | str) -> Iterator[None]:
    """:func:`deterministic_kernels` for the block, then torch's settings as they were
    (an in-process grid cell leaves its caller's settings)."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.backends.cudnn.allow_tf32,
    )
    deterministic_kernels(device)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.utils.deterministic.fill_uninitialized_memory = saved[2]
        torch.backends.cudnn.allow_tf32 = saved[3]
