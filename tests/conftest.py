"""Shared fixtures for the test suite (kept small)."""

from __future__ import annotations

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
