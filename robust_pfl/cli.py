"""Command line: ``robust-pfl run CONFIG.toml`` and ``robust-pfl reproduce fig3``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from robust_pfl.config import ConfigError, load_config


def _run(args: argparse.Namespace) -> int:
    from robust_pfl.experiments import run_experiment, validate

    config = validate(load_config(args.config))
    out = Path(args.out) if args.out else Path("results") / Path(args.config).stem
    summary = run_experiment(config, out)
    print(f"wrote {out / 'summary.json'} and {out / 'history.csv'}")
    for method, metrics in summary["final"].items():
        shown = ", ".join(f"{k}={v['mean']:.4g}" for k, v in sorted(metrics.items()))
        print(f"  {method:>14}: {shown}")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from robust_pfl.recipes import fig3

    out = Path(args.out) if args.out else Path("results") / args.figure
    fig3.main(out, quick=args.quick, seeds=args.seeds)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="robust-pfl", description=__doc__)
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch CPU threads (default: torch's choice; 1 is fastest for small models)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one experiment from a TOML config")
    run.add_argument("config", help="path to the TOML config")
    run.add_argument("--out", help="output directory (default results/<config name>)")
    run.set_defaults(handler=_run)
    reproduce = commands.add_parser("reproduce", help="reproduce a figure of Werner et al.")
    reproduce.add_argument("figure", choices=["fig3"])
    reproduce.add_argument("--out", help="output directory (default results/<figure>)")
    reproduce.add_argument("--quick", action="store_true", help="fewer rounds, grid points and seeds")
    reproduce.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3, quick 1)")
    reproduce.set_defaults(handler=_reproduce)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        import torch

        if args.threads < 1:
            print("error: --threads must be >= 1", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    try:
        return args.handler(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
