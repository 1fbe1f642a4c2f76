"""Public conformance checks for robust aggregators: :func:`check_aggregator` runs on
an aggregator of your own what the project's suite runs on every registered one.

A robust aggregator (a subclass of :class:`defenses.robust_aggregators.Aggregator`,
registered with ``defenses.register_aggregator``) maps messages ``[..., N, d]`` (and
optionally the previous aggregate and a generator) to ``[..., d]`` and must:

* keep the messages' dtype, aggregate every leading block as it would alone, and be
  finite whatever up to ``f < N/2`` rows hold (NaN, Inf, 1e38, large gradients);
* give the same output for the same generator seed and write into no input;
* treat NaN, Inf and overflowing rows as absent, and return the previous aggregate
  (if finite) or zeros where no row is admissible.

Each failed property raises :class:`robust_pfl.conformance.ConformanceError` naming it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from defenses.robust_aggregators import Aggregator, make_aggregator
from robust_pfl.conformance import ConformanceError

F64 = torch.float64
HOSTILE_ROWS = ("nan", "inf", "-inf", "1e38", "large_gradient", "mixed")


def _require(condition: bool, aggregator: Aggregator, message: str) -> None:
    if not condition:
        raise ConformanceError(f"{type(aggregator).__name__}: {message}")


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def honest_cloud(seed: int, n: int, d: int, dtype: torch.dtype = F64) -> Tensor:
    """``n`` seeded rows around a random centre."""
    generator = _seeded(seed)
    centre = torch.randn(d, generator=generator, dtype=F64)
    return (centre + torch.randn(n, d, generator=generator, dtype=F64)).to(dtype)


def check_aggregator(aggregator: Aggregator | type[Aggregator] | str) -> None:
    """Check an aggregator (an instance, a class built with its defaults, or a
    registered name) against the contract of the module docstring.

    Raises:
        ConformanceError: the first property that fails, named.
    """
    agg = aggregator() if isinstance(aggregator, type) else make_aggregator(aggregator)
    check_shapes_and_batching(agg)
    check_determinism_and_no_mutation(agg)
    for hostile in HOSTILE_ROWS:
        for dtype in (torch.float32, F64):
            check_hostile_rows(agg, hostile, dtype)
    check_no_admissible_row(agg)
    check_inadmissible_rows_are_absent(agg)


def check_shapes_and_batching(agg: Aggregator) -> None:
    """``[N, d]``, ``[B, N, d]`` and ``[A, B, N, d]`` give ``[d]``, ``[B, d]``, ``[A, B,
    d]`` of the messages' dtype, finite, each block as it aggregates alone."""
    n, d = 9, 4
    for dtype in (torch.float32, F64):
        x = torch.randn(3, 2, n, d, generator=_seeded(1), dtype=dtype)
        x[0, 1, 2] = math.nan  # blocks with different admissible counts
        x[2, 0, :3] = 1e38 if dtype == torch.float32 else math.inf
        _require(agg(x[0, 0]).shape == (d,) and agg(x[0]).shape == (2, d), agg, "wrong output shape")
        out = agg(x)  # no generator: an order-dependent rule keeps the given order
        _require(out.shape == (3, 2, d) and out.dtype == dtype, agg, f"returned {out.dtype} {tuple(out.shape)}")
        _require(bool(torch.isfinite(out).all()), agg, "non-finite output with NaN / Inf / 1e38 rows")
        for i in range(3):
            for j in range(2):
                _require(torch.allclose(out[i, j], agg(x[i, j]), rtol=1e-5, atol=1e-6), agg,
                         "a batched block differs from the same block aggregated alone")


def check_determinism_and_no_mutation(agg: Aggregator) -> None:
    x = torch.randn(4, 9, 5, generator=_seeded(2), dtype=F64)
    x[1, 3] = math.inf
    previous = torch.randn(4, 5, generator=_seeded(3), dtype=F64)
    x_before, previous_before = x.clone(), previous.clone()
    first = agg(x, previous, _seeded(7))
    _require(torch.equal(first, agg(x, previous, _seeded(7))), agg, "the same seed gave another aggregate")
    _require(torch.equal(x, x_before) and torch.equal(previous, previous_before), agg,
             "wrote into the messages or the previous aggregate")


def check_hostile_rows(agg: Aggregator, hostile: str, dtype: torch.dtype) -> None:
    """``f = 4`` of 9 rows hostile (``hostile`` of :data:`HOSTILE_ROWS`): a finite
    aggregate, with and without a previous one."""
    n, d, f = 9, 6, 4
    x = honest_cloud(0, n, d, dtype)
    if hostile == "large_gradient":
        x[:f] = 1e6 + 200 * torch.randn(f, d, generator=_seeded(1), dtype=F64).to(dtype)
    elif hostile == "mixed":
        x[0], x[1], x[2], x[3] = math.nan, math.inf, -math.inf, 1e38
        x[3, 0] = -1e38
    else:
        x[:f] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "1e38": 1e38}[hostile]
    batched = torch.stack([x, x.flip(0)])
    for previous in (None, torch.ones(d, dtype=dtype)):
        _require(bool(torch.isfinite(agg(batched, previous, _seeded(0))).all()), agg,
                 f"non-finite aggregate with {f} of {n} rows {hostile} ({dtype})")


def check_no_admissible_row(agg: Aggregator) -> None:
    """No admissible row: the previous aggregate if it is finite, else zeros."""
    x = torch.full((2, 7, 3), math.nan, dtype=F64)
    x[1, :, 0] = math.inf
    _require(torch.equal(agg(x), torch.zeros(2, 3, dtype=F64)), agg, "no admissible row and no previous: not zeros")
    previous = torch.tensor([1.0, -2.0, 3.0], dtype=F64)
    _require(torch.equal(agg(x, previous, _seeded(0)), previous.expand(2, 3)), agg,
             "no admissible row: not the previous aggregate")
    _require(torch.equal(agg(x, torch.full((3,), math.nan, dtype=F64)), torch.zeros(2, 3, dtype=F64)), agg,
             "returned a non-finite previous aggregate")


def check_inadmissible_rows_are_absent(agg: Aggregator) -> None:
    """With the rows' order kept (no generator), NaN / Inf / overflowing rows change
    nothing: the aggregate of the admissible rows alone."""
    x = honest_cloud(4, 10, 3, torch.float32)
    x[1], x[4, 2], x[7] = math.nan, -math.inf, 1e38
    kept = torch.ones(10, dtype=torch.bool)
    kept[[1, 4, 7]] = False
    _require(torch.allclose(agg(x), agg(x[kept]), rtol=1.3e-6, atol=1e-5), agg,
             "an inadmissible row changed the aggregate")
