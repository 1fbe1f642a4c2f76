"""Round times of a run that re-deals its train split every epoch (the official code
re-deals MNIST; ``task.reshuffle_every_epoch``): is a re-deal round a spike?

Run from the repository root, with the MNIST IDX files in DIR::

    python benchmarks/bench_redeal.py --data-dir DIR            # Fig. 6's Global cell, 90 rounds
    python benchmarks/bench_redeal.py --data-dir DIR --rounds 60 --threads 1

The configuration is ``reproduce fig6 --quick``'s Global (mean) cell under bit flip with
the official placement: 200 honest + 50 Byzantine clients on MNIST, batch 32, a re-deal
every 7 rounds.  A round is timed from its re-deal hook (``EpochRedealer.before_round``)
to the end of its step, as ``run_method`` runs them; evaluation and checkpoints, which
happen every 30 rounds, are left out.  Prints the median and largest round, their
ratio, and the re-deal rounds; writes ``benchmarks/redeal.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import defenses  # noqa: E402
from robust_pfl.experiments import RunParts, method_params, parse_and_validate  # noqa: E402
from robust_pfl.recipes import fig6  # noqa: E402


def cell_config(data_dir: str, rounds: int) -> dict:
    """The Global (mean) cell of ``reproduce fig6 --quick``'s bit-flip panel, official
    placement, cut to ``rounds`` rounds."""
    for grid in fig6.grids(fig6.MNIST, data_dir, True, ("bit_flip",)):
        for cell in grid.cells:
            method, byzantine = cell.config["methods"][0], cell.config["byzantine"]
            if method["name"] == "global" and method.get("aggregator") == "mean" and byzantine["total"] == 50:
                return {**cell.config, "rounds": rounds}
    raise LookupError("no Global (mean) cell in fig6's bit-flip grids")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="directory of the MNIST IDX files")
    parser.add_argument("--rounds", type=int, default=90)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "redeal.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = parse_and_validate(cell_config(args.data_dir, args.rounds), "bench_redeal")
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    parts = RunParts.build(config, 0, None)
    setup = time.perf_counter() - start
    method = config.methods[0]
    algorithm = defenses.build(method.name, parts.federation, params=method_params(config, method))
    algorithm.snapshot_records = False
    redealer = parts.redealer
    times = []
    for round_index in range(args.rounds):
        start = time.perf_counter()
        if redealer is not None:
            redealer.before_round(parts.federation, round_index)
        algorithm.step(round_index)
        times.append(time.perf_counter() - start)
    per_epoch = redealer.per_epoch if redealer is not None else None
    redeals = [i for i in range(1, args.rounds) if per_epoch and i % per_epoch == 0]
    median = statistics.median(times)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    report = {
        "command": "python benchmarks/bench_redeal.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit, "machine": cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "load_before": load_before, "load_after": os.getloadavg()[0], "setup_seconds": setup,
        "round_seconds": times, "redeal_rounds": redeals, "median": median, "max": max(times),
        "max_over_median": max(times) / median, "slowest_round": times.index(max(times)),
        "max_after_round_0_over_median": max(times[1:], default=median) / median,
        "redeal_max_over_median": max((times[i] for i in redeals), default=median) / median,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads, load {load_before:.2f}")
    print(f"setup {setup:.2f} s; {args.rounds} rounds: median {median * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms "
          f"(x{max(times) / median:.2f}, round {report['slowest_round']}; after round 0 "
          f"x{report['max_after_round_0_over_median']:.2f}); re-deal rounds {[round(times[i] * 1e3, 1) for i in redeals]} ms "
          f"(max x{report['redeal_max_over_median']:.2f})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
