"""The honest-row statistics of the attacks on Federated-Clustering's workspace, each
against the formula it replaced, in one process, one thread, side by side: the
reference rows read by a boolean mask against attacks._stats.honest_rows (one
contiguous copy) and honest_block (a view); ALIE's mean and standard deviation in one
pass over all receivers against attacks._stats.mean_and_std (the deviations in
cache-sized blocks of receivers); ball_edge's gather of each Byzantine row's centre by
torch.take_along_dim against attacks._stats.rows_at.  Each pair must agree bit for
bit (checked before timing).

Shapes: FC on the MNIST benchmark at K = 2, f = 0.2 (configs/benchmark_mnist.toml):
20 honest receivers, 25 senders (5 Byzantine, honest first), the MLP 784-64-10
(d = 50,890), float32.

    python benchmarks/bench_attack_statistics.py [--repeats 20] [--out benchmarks/attack_statistics.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attacks._stats import honest_block, honest_rows, mean_and_std, rows_at  # noqa: E402
from robust_pfl.engine.types import AttackContext  # noqa: E402
from robust_pfl.provenance import machine_text  # noqa: E402

RECEIVERS, HONEST, BYZANTINE, D = 20, 20, 5, 784 * 64 + 64 + 64 * 10 + 10


def reference_mean_and_std(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The replaced formula: all receivers at once, a fresh temporary per step."""
    mean = rows.mean(dim=-2, keepdim=True)
    return mean, ((rows - mean).square().sum(dim=-2, keepdim=True) / max(rows.shape[-2] - 1, 1)).sqrt()


def timed(function: Callable[[], object], repeats: int) -> float:
    """The median seconds of ``repeats`` calls."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "attack_statistics.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    messages = torch.randn(RECEIVERS, HONEST + BYZANTINE, D, generator=generator)
    byzantine = torch.tensor([False] * HONEST + [True] * BYZANTINE)
    context = AttackContext(round_index=0, kind="cross_gradient", byzantine=byzantine,
                            cluster_ids=torch.zeros(HONEST + BYZANTINE, dtype=torch.long), generator=generator)
    centres = messages[:, :1].clone()  # FC: one centre per receiver, its own gradient
    target = torch.zeros(RECEIVERS, BYZANTINE, dtype=torch.long)
    pairs = {
        "honest rows": (lambda: messages[..., ~byzantine, :], lambda: honest_rows(messages, context),
                        lambda: honest_block(messages, context)),
        "ALIE mean and std": (lambda: reference_mean_and_std(honest_block(messages, context)),
                              lambda: mean_and_std(honest_block(messages, context))),
        "ball_edge centre per Byzantine row": (lambda: torch.take_along_dim(centres, target.unsqueeze(-1), dim=-2),
                                               lambda: rows_at(centres, target)),
    }
    rows = []
    for name, (reference, *ours) in pairs.items():
        expected = reference()
        for function in ours:
            got = function()
            same = all(torch.equal(a, b) for a, b in zip(expected, got)) if isinstance(got, tuple) \
                else torch.equal(expected, got)
            if not same:
                raise AssertionError(f"{name}: the new evaluation differs from the reference")
        before = timed(reference, args.repeats)
        after = [timed(function, args.repeats) for function in ours]
        rows.append({"what": name, "reference_ms": 1000 * before, "ours_ms": [1000 * a for a in after],
                     "ratio": [a / before for a in after]})
        shown = ", ".join(f"{1000 * a:.1f} ms ({a / before:.2f}x)" for a in after)
        print(f"{name:36s} reference {1000 * before:7.1f} ms; ours {shown}", flush=True)
    Path(args.out).write_text(json.dumps({"machine": machine_text(), "threads": 1, "shape": [RECEIVERS, HONEST +
                                          BYZANTINE, D], "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
