"""Kernels, host synchronisations and modelled bytes of one step of every method, counted
on the CPU on the accelerator's code paths (issue 45), without timing anything.

Run from the repository root::

    python benchmarks/count_launches.py                       # N = 64, 250, FC's N = 200 row
    python benchmarks/count_launches.py --scales large --scale-clients 2000 --methods global ifca mc
    python benchmarks/count_launches.py --methods fc --scales n250 n200 --memory-budget-mb 35000   # a GPU's budget

The configurations are ``bench_steps.py``'s (its workload, options and scale rows).
Each is built in this process, stepped twice (round 0 seeds MC's centres), and its
third step is counted by :class:`robust_pfl.engine.launches.LaunchCounter` under
``using_engine("batched")``.  ``kernels`` is an upper bound of the kernels a GPU
launches for that step (the CPU's memory budget decides the chunks unless
``--memory-budget-mb`` sets a GPU's), ``syncs`` the
device-to-host reads, ``GB`` the bytes its operators read and write if each touches
every element of its operands.  Writes ``benchmarks/launches.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_steps as steps  # noqa: E402
import defenses  # noqa: E402
from robust_pfl.engine.devices import using_engine  # noqa: E402
from robust_pfl.engine.launches import count_launches  # noqa: E402


def count_config(config: steps.Config, budget_mb: int | None = None) -> dict:
    """The third step of ``config`` counted on the batched engine; ``budget_mb``
    replaces the memory budget of a method that has one (a GPU's is a quarter of its
    free memory: about 35,000 MB on an H200)."""
    federation = steps.federation(config.scale, "cpu", config.clients)
    options = dict(config.options)
    if budget_mb is not None and "memory_budget_mb" in defenses.REGISTRY[config.method].Params.model_fields:
        options["memory_budget_mb"] = budget_mb
    algorithm = defenses.build(config.method, federation, options)
    algorithm.snapshot_records = False
    with using_engine("batched"):
        algorithm.step(0)
        algorithm.step(1)
        _, count = count_launches(lambda: algorithm.step(2))
    return {"label": config.label, "scale": steps.scale_name(config.scale, config.clients), **count.as_dict()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=sorted(defenses.REGISTRY), choices=sorted(defenses.REGISTRY))
    parser.add_argument("--scales", nargs="+", default=["n64", "n250", "n200"], choices=[*steps.SCALES, "large"])
    parser.add_argument("--scale-clients", type=int, default=None, help="N of the scale rows (default: theirs)")
    parser.add_argument("--skip-slow", action="store_true", help=f"skip {sorted(steps.SLOW)} at N = 250")
    parser.add_argument("--memory-budget-mb", type=int, default=None,
                        help="memory budget of the methods that chunk by one (default: the CPU's)")
    parser.add_argument("--out", type=Path, default=HERE / "launches.json")
    args = parser.parse_args(argv)
    rows = []
    print("| method | scale | kernels | syncs | GB moved (model) |\n|---|---|---:|---:|---:|")
    for config in steps.configs(args.methods, args.scales, args.skip_slow, args.scale_clients):
        row = {**count_config(config, args.memory_budget_mb), "memory_budget_mb": args.memory_budget_mb}
        rows.append(row)
        print(f"| {row['label']} | {row['scale']} | {row['kernels']} | {row['syncs']} | {row['bytes'] / 1e9:.2f} |",
              flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    args.out.write_text(json.dumps({"commit": commit, "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
