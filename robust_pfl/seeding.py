"""Seeded random streams.  One seed in the config determines everything; each consumer
(data, initialisation, batches, attack, algorithm) gets its own stream so that adding
an attack never changes the data sampling."""

from __future__ import annotations

import hashlib

import torch


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed derived from ``(seed, stream)`` (stable across runs and hosts)."""
    digest = hashlib.sha256(f"{seed}/{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, stream: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded from ``(seed, stream)``."""
    g = torch.Generator(device=device)
    g.manual_seed(stream_seed(seed, stream))
    return g
