"""Per-round cost of Momentum-Clustering's server clustering (Alg. 4's step without
the clients' gradients) as N grows: whether it stays O(N d).

Messages are ``[N, d]`` rows in K = 4 clusters (unit-norm means 1 apart, noise of norm
about 0.5), the same rows every round; the algorithm's clustering step (``_cluster``:
Alg. 3 from the warm-started centres, the assignment and the re-seed rule) is timed
over ``--rounds`` warm-started rounds after the first (seeding) one, best of
``--repeats``.  Run it under another checkout's code to compare versions::

    PYTHONPATH=/path/to/old/checkout python benchmarks/bench_mc_clustering.py --label old

Each call adds its rows (label, the measured code's commit, N, d, seconds per round,
nanoseconds per row coordinate) to ``--out`` (default ``benchmarks/mc_clustering.json``); see
``benchmarks/README.md``, "MC's clustering cost".
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

import defenses
from robust_pfl.config import parse_config
from robust_pfl.experiments import RunParts

HERE = Path(__file__).resolve().parent


def clustering_algorithm() -> defenses.Algorithm:
    """MC with its defaults (of the code on the path) on a small federation; only its
    clustering step is timed."""
    raw = {"seeds": [0], "rounds": 1, "batch_size": 16,
           "task": {"name": "image", "dataset": "digits", "kind": "private_label", "clusters": 4,
                    "clients_per_cluster": 2, "model": {"name": "mlp", "hidden": [8]}},
           "methods": [{"name": "mc"}]}
    config = parse_config(raw)
    return defenses.build("mc", RunParts.build(config, 0).federation, config.methods[0].options())


def messages(clients: int, dim: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn(4, dim, generator=generator)
    means /= torch.linalg.vector_norm(means, dim=1, keepdim=True) * 2 ** 0.5  # 1 apart
    rows = means[torch.arange(clients) % 4]
    return rows + 0.5 * torch.randn(clients, dim, generator=generator) / dim ** 0.5


def seconds_per_round(clients: int, dim: int, rounds: int, repeats: int) -> float:
    points = messages(clients, dim)
    best = float("inf")
    for _ in range(repeats):
        algorithm = clustering_algorithm()
        generator = torch.Generator().manual_seed(1)
        step = algorithm._cluster(points, generator)
        algorithm.centres, algorithm.assignment = step[0], step[1]
        start = time.perf_counter()
        for _ in range(rounds):
            step = algorithm._cluster(points, generator)
            algorithm.centres, algorithm.assignment = step[0], step[1]
        best = min(best, (time.perf_counter() - start) / rounds)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="name of the code version measured")
    parser.add_argument("--clients", type=int, nargs="+", default=[250, 500, 1000, 2000])
    parser.add_argument("--dim", type=int, default=15_010, help="d (default: the digits MLP's 64-200-10)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE / "mc_clustering.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = json.loads(args.out.read_text()) if args.out.exists() else []
    for clients in args.clients:
        seconds = seconds_per_round(clients, args.dim, args.rounds, args.repeats)
        code = Path(defenses.__file__).resolve().parent
        commit = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(code), "status", "--porcelain", "--", "defenses", "robust_pfl"],
                               capture_output=True, text=True, check=False).stdout.strip()
        row = {"label": args.label, "commit": commit + (" (modified)" if dirty else ""), "clients": clients,
               "dim": args.dim, "seconds_per_round": seconds, "ns_per_row_coordinate": 1e9 * seconds / (clients * args.dim),
               "threads": args.threads, "machine": platform.processor() or platform.machine()}
        print(json.dumps(row), flush=True)
        rows.append(row)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
