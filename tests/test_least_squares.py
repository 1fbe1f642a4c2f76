"""theory_checks.least_squares: the fit, and its bits independent of where the input
buffers lie in memory (the reason it exists: LAPACK gelsy's are not, on MKL)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from theory_checks.least_squares import least_squares

OFFSETS = range(8)  # float64 elements: every 8-byte shift within a 64-byte cache line


def at_offset(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of ``tensor`` whose storage starts ``offset`` elements into a fresh buffer."""
    buffer = torch.empty(tensor.numel() + len(OFFSETS), dtype=tensor.dtype)
    view = buffer[offset:offset + tensor.numel()].view(tensor.shape)
    view.copy_(tensor)
    return view


def data(seed: int, batch: tuple[int, ...] = (), points: int = 400, dim: int = 6):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(*batch, points, dim, generator=generator, dtype=torch.float64)
    targets = torch.randn(*batch, points, generator=generator, dtype=torch.float64)
    return inputs, targets


def test_hand_case_two_points_on_a_line():
    # y = 2 x through (1, 2) and (2, 4); with an intercept column the fit is exact
    inputs = torch.tensor([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]], dtype=torch.float64)
    targets = torch.tensor([1.0, 3.0, 5.0], dtype=torch.float64)  # y = -1 + 2 x
    torch.testing.assert_close(least_squares(inputs, targets), torch.tensor([-1.0, 2.0], dtype=torch.float64))
    # three points not on a line: the normal equations' solution, by hand
    targets = torch.tensor([0.0, 2.0, 1.0], dtype=torch.float64)  # mean 1, slope 1/2, intercept 0
    torch.testing.assert_close(least_squares(inputs, targets), torch.tensor([0.0, 0.5], dtype=torch.float64))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), points=st.integers(8, 60), dim=st.integers(1, 6))
def test_the_fit_solves_the_normal_equations(seed, points, dim):
    inputs, targets = data(seed, (2,), points, dim)
    fit = least_squares(inputs, targets)
    assert fit.shape == (2, dim)
    residual = targets - (inputs @ fit.unsqueeze(-1)).squeeze(-1)
    gradient = inputs.mT @ residual.unsqueeze(-1)  # zero at the minimiser
    assert float(gradient.abs().max()) <= 1e-9 * float(inputs.abs().max() * targets.abs().max() * points)


def same_bits_at_every_offset(fit, inputs: torch.Tensor, targets: torch.Tensor) -> bool:
    fits = [fit(at_offset(inputs, k), at_offset(targets, k)) for k in OFFSETS]
    return all(torch.equal(fits[0], other) for other in fits)


@pytest.mark.parametrize("batch", [(), (3,)])
def test_the_same_bits_at_every_buffer_offset(batch):
    assert same_bits_at_every_offset(least_squares, *data(0, batch))


def test_the_offset_check_catches_a_fit_whose_bits_follow_the_buffer():
    """The check above can fail: a fit whose last bit moves with the buffer's address
    (as MKL's default driver, gelsy, was seen to do in a run of the FedSPD check) is
    caught at some offset."""
    def by_address(inputs, targets):
        fit = least_squares(inputs, targets)
        return torch.nextafter(fit, torch.full_like(fit, math.inf)) if inputs.data_ptr() % 64 else fit

    assert not same_bits_at_every_offset(by_address, *data(0, (3,)))
