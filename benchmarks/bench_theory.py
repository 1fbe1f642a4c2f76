"""The ``[theory]`` table's overhead on the quick start: ``configs/quickstart.toml`` run
with and without ``[theory] estimate = ["A", "Delta", "sigma", "L"]`` (``every = 10``,
the table's other settings at their defaults), alternately in one process, each pair of
runs on the same thread count.

Run from the repository root::

    python benchmarks/bench_theory.py                 # 3 pairs, 1 thread
    python benchmarks/bench_theory.py --pairs 5 --threads 2

It prints the wall time of every run, the seconds spent in the tracker's measurements
and the median overhead, and writes ``benchmarks/theory.json``.  Two overheads: the
runs' wall times (with / without - 1), which other jobs on the machine blur, and the
tracker's own seconds over the run without it (timed around every measurement), which
they blur less.
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
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from robust_pfl.config import load_config, parse_config  # noqa: E402
from robust_pfl.experiments import run_experiment  # noqa: E402
from theory_checks.tracking import TheoryTracker  # noqa: E402

ESTIMATES = ["A", "Delta", "sigma", "L"]
TARGET_OVERHEAD = 0.10


def configs(rounds: int | None) -> tuple[Any, Any]:
    """The quick start without and with the ``[theory]`` table (``rounds`` shortens both)."""
    data = load_config(ROOT / "configs" / "quickstart.toml").model_dump()
    if rounds is not None:
        data.update(rounds=rounds, eval_every=min(rounds, data["eval_every"]))
    plain = parse_config(data)
    tracked = parse_config({**data, "theory": {"estimate": ESTIMATES, "every": 10}})
    return plain, tracked


class MeasureClock:
    """Seconds spent in :meth:`TheoryTracker.measure` while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._measure = TheoryTracker.measure

    def __enter__(self) -> "MeasureClock":
        clock, measure = self, self._measure

        def timed_measure(tracker: TheoryTracker, *args: Any, **kwargs: Any) -> dict[str, float]:
            start = time.perf_counter()
            try:
                return measure(tracker, *args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - start
                clock.calls += 1

        TheoryTracker.measure = timed_measure  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        TheoryTracker.measure = self._measure  # type: ignore[method-assign]


def timed(config: Any) -> tuple[float, float, int]:
    """Wall seconds of a run, and the seconds and count of its measurements."""
    with MeasureClock() as clock:
        start = time.perf_counter()
        run_experiment(config, progress=False)
        return time.perf_counter() - start, clock.seconds, clock.calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="runs with and without the table, alternately")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--rounds", type=int, default=None, help="shorter runs (a smoke test); default the config's")
    parser.add_argument("--out", type=Path, default=HERE / "theory.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    plain, tracked = configs(args.rounds)
    timed(plain)  # warm-up: imports, first-call costs of both paths
    timed(tracked)
    rows = []
    for pair in range(args.pairs):
        without, _, _ = timed(plain)
        with_table, tracking, calls = timed(tracked)
        rows.append({"pair": pair, "without_s": without, "with_s": with_table, "tracking_s": tracking,
                     "measurements": calls, "overhead": with_table / without - 1, "tracking_share": tracking / without})
        print(f"pair {pair}: without {without:.2f} s, with [theory] {with_table:.2f} s "
              f"(overhead {100 * rows[-1]['overhead']:+.1f}%); {calls} measurements took {tracking:.2f} s "
              f"({100 * rows[-1]['tracking_share']:.1f}% of the run without)", flush=True)
    median = statistics.median(row["overhead"] for row in rows)
    share = statistics.median(row["tracking_share"] for row in rows)
    print(f"median overhead {100 * median:+.1f}% of wall time, median tracking share {100 * share:.1f}% "
          f"(target <= {100 * TARGET_OVERHEAD:.0f}%)")
    result = {
        "estimates": ESTIMATES, "every": 10, "threads": args.threads, "rounds": tracked.rounds,
        "theory_defaults": tracked.theory.model_dump(mode="json"), "pairs": rows, "median_overhead": median,
        "median_tracking_share": share, "target_overhead": TARGET_OVERHEAD,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "load_after": os.getloadavg()},
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
