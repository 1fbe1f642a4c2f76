"""The benchmark page on a local Ray cluster gives the local page's table.

Copies a finished benchmark store, removes a seeded share of its runs (their blocks
in results.csv), reruns the benchmark's command into the copy with ``--backend ray
--address ADDR`` (the removed runs are made again on the cluster's workers), and
compares: every rerun run's final metrics bit for bit with the removed ones, and the
tables (worst_case.csv, breakdown.csv, tuning.csv, best_defense.csv) with the local
ones.  Start the cluster first, e.g. ``ray start --head --num-cpus 1`` and
``ray start --address HEAD:6379 --num-cpus 1`` (a worker beside it).

    python benchmarks/ray_benchmark_check.py --store results/benchmark_digits --address 127.0.0.1:6379 \\
        --share 0.05 -- configs/benchmark_digits.toml --subset page_k2
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from robust_pfl.grid import STORE, _scan, _store_text, _table_text  # noqa: E402

TABLES = ("worst_case.csv", "breakdown.csv", "tuning.csv", "best_defense.csv", "theorem.csv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="a finished benchmark's --out directory")
    parser.add_argument("--address", required=True, help="the Ray cluster's address")
    parser.add_argument("--share", type=float, default=0.05, help="share of the runs removed and made again")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--copy", default=None, help="where the copy goes (default: <store>_ray)")
    parser.add_argument("benchmark", nargs=argparse.REMAINDER, help="-- BENCH.toml [--subset NAME ...]")
    args = parser.parse_args()
    store = Path(args.store)
    copy = Path(args.copy or f"{store}_ray")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store, copy, ignore=shutil.ignore_patterns(".lock", "checkpoints"))
    header, blocks, _ = _scan(_store_text(copy / STORE), copy / STORE)
    finished = [block for block in blocks if block[-1]["status"] == "ok"]
    removed = random.Random(args.seed).sample(range(len(finished)), max(1, int(args.share * len(finished))))
    gone = {finished[i][-1]["cell"] for i in removed}
    kept = [block for block in blocks if block[-1]["cell"] not in gone]
    (copy / STORE).write_text(_table_text(header, kept), encoding="utf-8")
    words = [w for w in args.benchmark if w != "--"]
    command = [sys.executable, "-m", "robust_pfl.cli", "benchmark", *words, "--out", str(copy),
               "--backend", "ray", "--address", args.address]
    print("removed", len(gone), "of", len(finished), "runs; running:", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
    ours = pd.read_csv(store / STORE, dtype=str)
    theirs = pd.read_csv(copy / STORE, dtype=str)
    columns = ["cell", "metric", "round", "value"]
    before = ours[ours["cell"].isin(gone) & (ours["metric"] != "cell_seconds")][columns]
    after = theirs[theirs["cell"].isin(gone) & (theirs["metric"] != "cell_seconds")][columns]
    merged = before.merge(after, on=["cell", "metric", "round"], how="outer", suffixes=("_local", "_ray"),
                          indicator=True)
    # a store kept across profiles holds runs the current plan no longer asks for
    # (another subset's fractions): removed, they are not made again, and are listed
    rerun = set(theirs["cell"]) & gone
    both = merged[merged["_merge"] == "both"]
    same_runs = bool(rerun) and bool((both["value_local"] == both["value_ray"]).all())
    tables = {name: (store / name).read_text() == (copy / name).read_text() for name in TABLES
              if (store / name).exists()}
    result = {"removed": len(gone), "of": len(finished), "rerun_on_ray": len(rerun),
              "not_in_this_plan": sorted(gone - rerun), "rows_compared": int(len(both)),
              "runs_bit_identical": same_runs, "tables_equal": tables}
    print(json.dumps(result, indent=1))
    sys.exit(0 if same_runs and all(tables.values()) else 1)


if __name__ == "__main__":
    main()
