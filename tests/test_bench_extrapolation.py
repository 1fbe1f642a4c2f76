"""The FC benchmark's extrapolation from a sample of receivers (benchmarks/bench_rounds.py):
hand-computed rounds, so that a sampled round is charged as a full one would cost."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_rounds  # noqa: E402  (benchmarks/ is not a package)


def meter(starts, rows, grad, step_start):
    return SimpleNamespace(
        chunk_rows=rows, starts=starts, call_seconds=grad, step_start=step_start,
        flops_per_pair=1, pairs=sum(rows) * 10, receivers=sum(rows), flops=sum(rows) * 10, seconds=sum(grad),
    )


def test_later_chunks_set_the_rate_and_the_step_is_charged_once():
    """Chunks of 13 receivers start at t = 0.1 and 1.1; the step starts at 1.7 and the
    round ends at 1.9; 52 receivers in all.  First chunk 1.0 s, later ones 0.6 s per 13
    receivers, so the full round is 0.1 + 1.0 + 39 * 0.6 / 13 + 0.2 = 3.1 s."""
    estimate = bench_rounds._extrapolate_fc(meter([0.1, 1.1], [13, 13], [0.5, 0.3], 1.7), 0.0, 1.9, 52)
    assert estimate["seconds_per_round"] == pytest.approx(3.1)
    assert estimate["first_chunk_seconds"] == pytest.approx(1.0)
    assert estimate["gradient_seconds_per_round"] == pytest.approx(0.5 + 39 * 0.3 / 13)


def test_a_full_round_is_measured_as_it_ran():
    """All 52 receivers timed (four chunks): the estimate is the measured round."""
    estimate = bench_rounds._extrapolate_fc(meter([0.0, 1.0, 1.5, 2.0], [13] * 4, [0.4] * 4, 2.5), 0.0, 2.7, 52)
    assert estimate["seconds_per_round"] == pytest.approx(2.7)
