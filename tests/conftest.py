"""Shared fixtures for the test suite (kept small)."""

from __future__ import annotations

from robust_pfl.engine.types import AttackBase

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tiny-tensor tests on one intra-op thread, then restore.

    On a loaded 2-core machine, reductions that return indices (``Tensor.min(dim)``,
    ``Tensor.max(dim)``) on tiny tensors take ~10 ms each with 2 threads versus ~10 us
    with one; the property tests call them thousands of times.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class CallPathAttack(AttackBase):
    """Wraps an attack so that engines take the plain call path: no ``write_rows``,
    and ``reads_messages`` as given (``True`` makes engines compute every row)."""

    def __init__(self, inner, reads_messages: bool) -> None:
        self.inner = inner
        self.reads_messages = reads_messages

    def __call__(self, messages, context):
        return self.inner(messages, context)


@pytest.fixture
def call_path_attack():
    """The :class:`CallPathAttack` wrapper, for tests comparing engine shortcuts with
    the plain path."""
    return CallPathAttack
