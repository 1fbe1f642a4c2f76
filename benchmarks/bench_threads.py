"""Wall time of the commands as a user runs them, by torch thread count: the quick
start (``robust-pfl run configs/quickstart.toml``), the quick start's methods as a grid
of two jobs (``benchmarks/threads_grid.toml``, ``--jobs 2``) and, with ``--fig3``,
``reproduce fig3 --quick``.  Each command runs in a fresh process, one after another.

Run from the repository root::

    python benchmarks/bench_threads.py                        # quick start and grid: 1, 2, default
    python benchmarks/bench_threads.py --fig3 --only fig3     # fig3 --quick too (minutes per setting)
    python benchmarks/bench_threads.py --settings 1 default --repeats 2 --out FILE

A setting is a thread count, passed as ``--threads N`` (before the subcommand, which
every version takes), or ``default``: no ``--threads``, the command's own default
(``auto``, the free cores; before that policy, torch's default, the core count).  Run
from another checkout, it times that checkout's code.  It prints every run's wall time
with the load average before and after (other jobs on the machine slow a run; the load
says how many were running) and writes ``benchmarks/threads.json``.  The quick start's
``history.csv`` of every setting is compared byte for byte: thread counts must not
change results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

COMMANDS = {
    "quickstart": ["run", "configs/quickstart.toml"],
    "grid2": ["grid", "benchmarks/threads_grid.toml", "--jobs", "2"],
    "fig3": ["reproduce", "fig3", "--quick"],
}


def run_once(name: str, setting: str, scratch: Path) -> dict[str, Any]:
    out = scratch / f"{name}-{setting}-{time.time_ns()}"
    threads = [] if setting == "default" else ["--threads", setting]  # before the subcommand: any version takes it
    argv = [sys.executable, "-m", "robust_pfl.cli", *threads, *COMMANDS[name], "--out", str(out)]
    load_before = os.getloadavg()
    start = time.perf_counter()
    finished = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    load_after = os.getloadavg()
    record: dict[str, Any] = {
        "command": name, "setting": setting, "seconds": round(seconds, 2), "returncode": finished.returncode,
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
        "argv": " ".join(argv[1:]),
    }
    if finished.returncode != 0:
        record["stderr_tail"] = finished.stderr[-2000:]
    history = out / "history.csv"
    if name == "quickstart" and history.exists():
        record["history_sha256"] = hashlib.sha256(history.read_bytes()).hexdigest()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=["1", "2", "default"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--fig3", action="store_true", help="also time reproduce fig3 --quick (minutes per setting)")
    parser.add_argument("--only", nargs="+", choices=list(COMMANDS), default=None, help="time only these commands")
    parser.add_argument("--out", default=str(HERE / "threads.json"))
    args = parser.parse_args()
    import torch

    names = args.only or ["quickstart", "grid2", *(["fig3"] if args.fig3 else [])]
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.repeats):
            for name in names:
                for setting in args.settings:
                    record = run_once(name, setting, Path(scratch))
                    runs.append(record)
                    print(f"{name:>10} threads={setting:<8} {record['seconds']:8.1f} s  rc={record['returncode']}  "
                          f"load {record['load_before'][0]:.2f} -> {record['load_after'][0]:.2f}", flush=True)
    hashes = {r["setting"]: r["history_sha256"] for r in runs if "history_sha256" in r}
    identical = len(set(hashes.values())) <= 1
    print(f"quick start history.csv identical across settings: {identical}")
    payload = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "torch_default_threads": torch.get_num_threads()},
        "runs": runs,
        "history_identical_across_settings": identical,
    }
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
