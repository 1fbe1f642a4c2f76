"""Where each method's step goes: the cProfile of ``bench_steps.py``'s configurations.

For every configuration of ``bench_steps.py`` (the same federation, options and
attack), a fresh process builds the method, runs warm-up steps, and profiles further
steps; it reports the operations with the largest own time per step and their share
of the step.  The companion of ``bench_steps.py``'s floor ratios: where a step is far
from its floor, this says which kernels or copies make up the difference.

    python benchmarks/profile_steps.py --scales n250 --methods global ifca --top 6
    python benchmarks/profile_steps.py --skip-slow --out benchmarks/profiles.md
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_steps as steps  # noqa: E402
import defenses  # noqa: E402


def profile_config(config: steps.Config, profiled: int, top: int) -> dict[str, Any]:
    """Warm-up steps (one when a step takes over 5 s), then ``profiled`` steps under
    cProfile; the ``top`` functions by own time, per step."""
    fed = steps.federation(config.scale)
    algorithm = defenses.build(config.method, fed, config.options)
    algorithm.snapshot_records = False  # as the experiment runner does
    index = 0
    for _ in range(2):
        start = time.perf_counter()
        algorithm.step(index)
        index += 1
        if time.perf_counter() - start > 5:
            break
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(profiled):
        algorithm.step(index)
        index += 1
    profiler.disable()
    per_step = (time.perf_counter() - start) / profiled
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    ranked = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    entries = [
        {"function": _name(key), "calls": value[1] / profiled, "seconds": value[2] / profiled}
        for key, value in ranked
    ]
    return {**asdict(config), "seconds": per_step, "top": entries, "load": steps.rounds.load_average()}


def _name(key: tuple[str, int, str]) -> str:
    """``torch.bmm``, ``Tensor.copy_``, ``ndarray.sort`` for built-ins; ``file:line(function)``
    for Python functions."""
    file, line, name = key
    if file != "~":
        return f"{Path(file).name}:{line}({name})"
    method = re.fullmatch(r"<method '(\w+)' of '(?:[\w.]+\.)?(\w+)' objects>", name)
    if method:
        owner = "Tensor" if method.group(2) == "TensorBase" else method.group(2)
        return f"{owner}.{method.group(1)}"
    builtin = re.fullmatch(r"<built-in method ([\w.]+)>", name)
    return builtin.group(1).replace("torch._C._linalg.", "torch.linalg.") if builtin else name


def format_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | scale | s/step (profiled) | largest own times per step (share of the step) |", "|---|---|---:|---|"]
    for row in rows:
        parts = "; ".join(
            f"`{entry['function']}` {entry['seconds']:.3g} s ({100 * entry['seconds'] / row['seconds']:.0f}%)"
            for entry in row["top"]
        )
        lines.append(f"| {row['label']} | {row['scale']} | {row['seconds']:.4g} | {parts} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=None, choices=sorted(defenses.REGISTRY))
    parser.add_argument("--scales", nargs="+", default=["n250"], choices=list(steps.SCALES))
    parser.add_argument("--skip-slow", action="store_true", help=f"skip {sorted(steps.SLOW)} at N = 250")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps per configuration")
    parser.add_argument("--top", type=int, default=5, help="functions listed per configuration")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        if spec["threads"]:
            torch.set_num_threads(spec["threads"])
        result = profile_config(steps.Config(**spec["config"]), spec["steps"], spec["top"])
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    rows = []
    for config in steps.configs(args.methods or sorted(defenses.REGISTRY), args.scales, args.skip_slow):
        spec = {"config": asdict(config), "steps": args.steps, "top": args.top, "threads": args.threads}
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=steps.rounds.ROOT)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if not found:
            raise RuntimeError(f"worker failed ({proc.returncode}) for {config}:\n{proc.stdout}\n{proc.stderr}")
        rows.append(json.loads(found[-1][len("RESULT ") :]))
        print(f"{config.label} @ {config.scale}: {rows[-1]['seconds']:.4g} s/step", flush=True)
    table = format_markdown(rows)
    print()
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
