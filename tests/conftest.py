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


@pytest.fixture(scope="session")
def separated_mc_study():
    """MC on the one-sided separated family (theory_checks.scaling_separated), four
    horizons and two repeats: measured once, read by the family's tests and the
    mutation tests."""
    from theory_checks.scaling_separated import separated_rate_study
    from theory_checks.separated_instance import SeparatedSizes

    return separated_rate_study("mc", sizes=SeparatedSizes(horizons=(64, 128, 256, 512), repeats=2))
