"""What the pairwise evaluation's Gram product costs by its number of columns, and what
taking the columns past the last multiple of 16 apart gains
(``defenses.pairwise_clustering._gram_and_leading_rows``).

Run from the repository root::

    python benchmarks/bench_gram_columns.py            # about 1 minute
    python benchmarks/bench_gram_columns.py --dim 20000 --out FILE

Part 1 times a batched float32 product of ``R`` rows with ``m`` of them as columns
(``[B, R, d] x [B, d, m]``, B = 4 distinct problems) for a grid of ``R`` and ``m``, in
milliseconds per problem.
Part 2 times the Gram product as the library takes it (split) against one product
(``_unaligned_columns`` forced to 0), alternating the two (and which goes first) in the
same process, for the
shapes the library meets: FC at N = 64 (13 problems of 52 rows), MC at N = 64 (4 centres
ahead of 52 rows), FC's MNIST subgroups (13 problems of 19 rows) and a few more.  Every
figure is a median over ``--repeats`` calls; the machine's other tenants move single
figures by up to 2x, so read the ratios.  It writes every measurement as JSON
(``benchmarks/gram_columns.json`` by default).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from defenses import pairwise_clustering  # noqa: E402

GRID_ROWS = (52, 56, 64)
GRID_COLUMNS = (32, 40, 44, 48, 52, 56, 64)
GRID_PROBLEMS = 4
# (problems B, leading rows, Gram rows n): the shapes FC and MC meet, and a few more
SPLIT_CASES = ((13, 0, 52), (1, 4, 52), (13, 0, 19), (4, 0, 36), (4, 0, 60), (2, 0, 100))


def seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def column_grid(dim: int, repeats: int) -> list[dict[str, float]]:
    """Milliseconds per problem of ``[B, R, d] x [B, d, m]`` for the grid, the cells
    taken in turn ``repeats`` times so that load drifts reach all of them alike."""
    rows = torch.randn(GRID_PROBLEMS, max(GRID_ROWS) + max(GRID_COLUMNS), dim)  # distinct problems
    samples: dict[tuple[int, int], list[float]] = {}
    for _ in range(repeats):
        for r in GRID_ROWS:
            for m in GRID_COLUMNS:
                left = rows[:, :r]
                right = rows[:, -m:].transpose(1, 2)
                torch.bmm(left, right)  # warm
                samples.setdefault((r, m), []).append(seconds(lambda: torch.bmm(left, right)) / GRID_PROBLEMS)
    return [
        {"rows": r, "columns": m, "ms_per_problem": 1e3 * statistics.median(samples[(r, m)]),
         "gflops": 2 * r * m * dim / statistics.median(samples[(r, m)]) / 1e9}
        for r in GRID_ROWS for m in GRID_COLUMNS
    ]


def split_against_one_product(dim: int, repeats: int) -> list[dict[str, float]]:
    """The library's Gram product (split) against one product, alternating."""
    module = pairwise_clustering
    aligned = module._unaligned_columns
    results = []
    for problems, lead, n in SPLIT_CASES:
        rows = torch.randn(problems, lead + n, dim)
        split, single = [], []
        def timed(columns_apart: Callable[[int, torch.device], int]) -> float:
            module._unaligned_columns = columns_apart
            return seconds(lambda: module._gram_and_leading_rows(rows, n))

        try:
            for repeat in range(repeats):  # the two in turn, which one first alternating
                if repeat % 2:
                    single.append(timed(lambda count, device: 0))
                    split.append(timed(aligned))
                else:
                    split.append(timed(aligned))
                    single.append(timed(lambda count, device: 0))
        finally:
            module._unaligned_columns = aligned
        results.append({
            "problems": problems, "leading_rows": lead, "rows": n,
            "columns_apart": aligned(n, rows.device),
            "split_ms_per_problem": 1e3 * statistics.median(split) / problems,
            "one_product_ms_per_problem": 1e3 * statistics.median(single) / problems,
            "median_pair_ratio": statistics.median(b / a for a, b in zip(split, single)),
        })
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=159_010, help="d (default: the MLP 784-200-10's)")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "gram_columns.json")
    args = parser.parse_args(argv)
    grid = column_grid(args.dim, args.repeats)
    print(f"ms per problem of [{GRID_PROBLEMS}, R, {args.dim}] x [{GRID_PROBLEMS}, {args.dim}, m]")
    print("R \\ m " + "".join(f"{m:>7}" for m in GRID_COLUMNS))
    for r in GRID_ROWS:
        cells = [cell["ms_per_problem"] for cell in grid if cell["rows"] == r]
        print(f"{r:<6}" + "".join(f"{value:7.2f}" for value in cells))
    split = split_against_one_product(args.dim, args.repeats)
    print("\nGram product (ms per problem): split against one product")
    print(f"{'B':>3} {'lead':>4} {'n':>4} {'apart':>5} {'split':>7} {'one':>7} {'ratio':>6}")
    for case in split:
        print(f"{case['problems']:>3} {case['leading_rows']:>4} {case['rows']:>4} {case['columns_apart']:>5} "
              f"{case['split_ms_per_problem']:7.2f} {case['one_product_ms_per_problem']:7.2f} "
              f"{case['median_pair_ratio']:6.2f}")
    report = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "dim": args.dim, "repeats": args.repeats, "grid": grid, "split": split,
    }
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
