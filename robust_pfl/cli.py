"""Command line: ``robust-pfl run CONFIG.toml``, ``robust-pfl reproduce fig3``,
``robust-pfl grid GRID.toml``, ``robust-pfl attack-table``, ``robust-pfl theory report``, the tables of
``robust-pfl results STORE_OR_RUN``, and the listings ``robust-pfl attacks`` / ``robust-pfl defenses``."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import warnings
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Callable

from robust_pfl.config import ConfigError
from robust_pfl.costs import CostWarning


def _run(args: argparse.Namespace) -> int:
    from robust_pfl.experiments import load_and_validate, run_experiment

    if args.resume and args.overwrite:
        raise ConfigError("--resume continues the run in OUT, --overwrite starts it afresh: give one of them")
    config = load_and_validate(args.config, device=args.device)
    out = Path(args.out) if args.out else Path("results") / Path(args.config).stem
    held = _run_outputs(out)
    if held and not (args.resume or args.overwrite):
        raise ConfigError(
            f"{out} already holds a run's outputs ({', '.join(held)}); rerun with --resume to continue it from "
            f"its checkpoints, or --overwrite to replace it (or choose another --out)"
        )
    summary = run_experiment(config, out, resume=args.resume, validated=True)
    print(f"wrote {out / 'summary.json'} and {out / 'history.csv'}")
    final = summary["final"]
    for method in [m.display for m in config.methods if m.display in final]:  # config order
        shown = ", ".join(f"{k}={v['mean']:.4g}" for k, v in sorted(final[method].items()))
        print(f"  {method:>14}: {shown}")
    return 0


def _flower(args: argparse.Namespace) -> int:
    """``robust-pfl flower CONFIG.toml``: the run config as a Flower simulation
    (:mod:`robust_pfl.flower`; flwr is imported only here, so every other command works
    without it).  Exits 1 when a node failed a request (an honest node's failure drops
    an honest message, a Byzantine node's replaces the attack by silence: either way
    the results are not the config's) or could not start (:class:`NodeError`); the
    outputs of a run that finished are written first."""
    from robust_pfl.flower import INSTALL_HINT, load_flower_config, require_flwr

    try:
        require_flwr()
    except ImportError:
        print(f"error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    from robust_pfl.flower import NodeError, attack_report, failure_report, run_flower

    run = load_flower_config(args.config)
    out = Path(args.out) if args.out else Path("results") / Path(args.config).stem
    held = _run_outputs(out)
    if held and not args.overwrite:
        raise ConfigError(f"{out} already holds a run's outputs ({', '.join(held)}); rerun with --overwrite to "
                          f"replace it (or choose another --out)")
    try:
        summary = run_flower(run, out, verbose=args.verbose)
    except NodeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {out / 'summary.json'} and {out / 'history.csv'}")
    final = summary["final"]
    for method in [m.display for m in run.config.methods if m.display in final]:  # config order
        shown = ", ".join(f"{k}={v['mean']:.4g}" for k, v in sorted(final[method].items()))
        print(f"  {method:>14}: {shown}")
    for line in attack_report(summary["attack_runs"]):  # where each run's attack ran
        print(line)
    report = failure_report(summary["node_failures"], run.config.attack.name)
    for line in report:
        print(line, file=sys.stderr)
    return 1 if report else 0


def _run_outputs(out: Path) -> list[str]:
    """What of a run's outputs ``out`` holds: summary.json, history.csv, checkpoints/."""
    held = [name for name in ("summary.json", "history.csv") if (out / name).exists()]
    checkpoints = out / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        held.append("checkpoints/")
    return held


def _reproduce(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path("results") / args.figure
    if args.device is not None and args.figure not in ("table1", "fig6"):
        print(f"error: --device applies to table1 and fig6; {args.figure} runs small float64 problems on the CPU",
              file=sys.stderr)
        return 2
    if args.figure == "table1":
        from robust_pfl.recipes import table1

        with _backend(args, _recipe_resources(args)) as backend:
            summary = table1.main(
                out, quick=args.quick, data_dir=args.data_dir, seeds=args.seeds, partition=args.partition,
                backend=backend, device=args.device,
            )
        _publish(args, out, "table1.md")
        # the full run checks the paper's orderings; a quick run only smoke-tests the recipe (1: a cell errored)
        if args.quick:
            return 1 if summary.get("errored") else 0
        return 0 if all(check["holds"] for check in summary["orderings"]) else 1
    if args.figure == "fig6":
        from robust_pfl.recipes import fig6

        if args.seeds is not None:
            print("error: --seeds does not apply to fig6 (one seed, as the official run)", file=sys.stderr)
            return 2

        panels = fig6.PANELS if args.panel == "both" else (args.panel,)
        with _backend(args, _recipe_resources(args)) as backend:
            status = fig6.main(out, quick=args.quick, data_dir=args.data_dir, panels=panels, backend=backend,
                               device=args.device)
        _publish(args, out, "fig6.md", {"fig6.png": ".png"})
        return status
    if args.data_dir is not None:
        print(f"error: --data-dir applies to table1 and fig6 only ({args.figure} uses synthetic data)", file=sys.stderr)
        return 2
    if args.jobs is not None or args.backend != "local" or args.address is not None:
        print(f"error: --jobs, --backend and --address apply to the grids of table1 and fig6, not {args.figure}",
              file=sys.stderr)
        return 2
    if args.figure == "mc-regimes":
        from robust_pfl.recipes import mc_regimes

        return mc_regimes.main(out, quick=args.quick, seeds=args.seeds,
                               page_path=Path(args.page) if args.page else None)
    if args.figure == "fig2":
        from robust_pfl.recipes import fig2 as recipe
    elif args.figure == "fig7":
        from robust_pfl.recipes import fig7 as recipe
    else:
        from robust_pfl.recipes import fig3 as recipe
    status = recipe.main(out, quick=args.quick, seeds=args.seeds)
    _publish(args, out, f"{args.figure}.md", {f"{args.figure}.png": ".png"})
    return status if isinstance(status, int) else 0  # recipes that check the paper's shape return 1 on a miss


def _theory_report(args: argparse.Namespace) -> int:
    from robust_pfl.backends import in_worker_processes
    from robust_pfl.engine import threads
    from theory_checks.report import in_this_process, write_report

    out = Path(args.out) if args.out else Path("results") / "theory"
    for option, value in (("--seeds", args.seeds), ("--jobs", args.jobs)):
        if value < 1:
            print(f"error: {option} must be >= 1", file=sys.stderr)
            return 2
    runner = in_this_process if args.jobs == 1 else in_worker_processes(args.jobs, threads.adopt, threads.in_force())
    try:
        summary = write_report(out, budget="quick" if args.quick else "full", names=args.only, seeds=args.seeds,
                               runner=runner)
    except ValueError as error:  # an unknown --only name, named with the registered ones
        print(f"error: {error}", file=sys.stderr)
        return 2
    _head_with_provenance(Path(summary["paths"]["report"]), args, summary["seconds"])
    width = max((len(name) for name in summary["statuses"]), default=0)
    for name, status in summary["statuses"].items():
        flag = "  <- contradicts its kind" if name in summary["contradictions"] else ""
        print(f"  {name:<{width}}  {summary['kinds'][name]:<16}  {status}{flag}")
    print(f"wrote {summary['paths']['report']} ({summary['seconds']:.1f} s)")
    return 1 if summary["contradictions"] else 0


def _grid(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from robust_pfl.grid import run_grid
    from robust_pfl.grid_file import load_grid

    grid = load_grid(args.grid, device=args.device)
    resources = grid.cell_resources()
    if args.threads is not None:  # --threads sets each cell's CPUs
        resources = replace(resources, cpus=float(args.threads))
        grid = replace(grid, resources=replace(grid.resources, cpus=float(args.threads)))
    out = Path(args.out) if args.out else Path("results") / Path(args.grid).stem
    with _backend(args, resources) as backend:
        summary = run_grid(grid, out, backend)
    print(
        f"{summary['cells']} cells: {summary['ran']} ran, {summary['skipped']} skipped (finished before), "
        f"{summary['errors']} errored; results in {summary['results']}"
    )
    described = {cell.cell: cell.describe() for cell in grid.cells}
    for cell, error in summary["errored"].items():
        print(f"  error in cell {cell} ({described[cell]}): {error}")
    return 1 if summary["errors"] else 0


def _benchmark(args: argparse.Namespace) -> int:
    from robust_pfl.worst_case.runner import run_benchmark

    from robust_pfl.grid_file import Resources

    out = Path(args.out) if args.out else Path("results") / Path(args.benchmark).stem
    cells = None if args.threads is None else Resources(cpus=float(args.threads))
    recipe = _recipe_resources(args)
    with ExitStack() as stack:  # the backend starts only once the file is checked and planned
        result = run_benchmark(args.benchmark, out, quick=args.quick, subset=args.subset,
                               tune=False if args.no_tune else None, device=args.device,
                               data_dir=args.data_dir,
                               page=args.page, command=_benchmark_command(args), resources=cells,
                               workers=args.jobs or 1,
                               make_backend=lambda: stack.enter_context(_backend(args, recipe)))
    summary = result.summary
    print(f"{summary['cells']} runs in {summary['stages']} stages ({summary['full_factorial']} in the full "
          f"factorial): {summary['ran']} ran, {summary['skipped']} skipped (finished before), {summary['errors']} "
          f"errored; {summary['not_applicable']} combinations not applicable")
    print(f"cost: {summary['per_cell']} Measured wall time {summary['seconds']:.0f} s; {summary['estimate']}.")
    for path in result.files:
        print(f"  wrote {path}")
    for cell, error in summary["errored"].items():
        print(f"  error in cell {cell}: {error}")
    return 1 if summary["errors"] else 0


def _benchmark_command(args: argparse.Namespace) -> str:
    """The ``robust-pfl benchmark`` command line that reproduces this call's results
    (the options that change them, and where they go); a data directory is written
    ``DIR``: this machine's path is not the reader's."""
    words = ["robust-pfl", "benchmark", args.benchmark]
    words += ["--quick"] if args.quick else []
    words += ["--subset", args.subset] if args.subset else []
    words += ["--no-tune"] if args.no_tune else []
    words += ["--device", args.device] if args.device else []
    words += ["--data-dir", "DIR"] if args.data_dir else []
    words += ["--out", args.out] if args.out else []
    words += ["--page", args.page] if args.page else []
    return " ".join(shlex.quote(word) for word in words)


def _recipe_resources(args: argparse.Namespace):
    """Per-cell resources of a recipe's grid: one GPU per cell on CUDA (Ray), else the
    backend's default."""
    from robust_pfl.engine.devices import resolve_device
    from robust_pfl.grid_file import Resources

    if args.device is None:
        return None
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        raise ConfigError(f"--device: {error}") from None
    return Resources().on_cuda(device.type == "cuda")


@contextmanager
def _backend(args: argparse.Namespace, resources):
    """The backend ``--backend``/``--jobs``/``--address`` ask for, closed on exit."""
    from robust_pfl.backends import make_backend

    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    extra = {} if resources is None else {"resources": resources}
    backend = make_backend(args.backend, jobs=args.jobs, address=args.address, **extra)
    try:
        yield backend
    finally:
        backend.close()


def _add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", default=None,
        help="cpu | cuda | cuda:N | mps | auto (CUDA when present): replaces the config's device",
    )


def _add_backend_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=None, help="grid cells at once (local default 1)")
    parser.add_argument("--backend", choices=["local", "ray"], default="local",
                        help="local processes (default) or Ray (pip install 'robust-pfl[ray]')")
    parser.add_argument("--address", default=None, help="ray: an existing cluster's address (default: a local one)")


def _head_with_provenance(report: Path, args: argparse.Namespace, seconds: float) -> None:
    """Put the command, commit and machine that produced ``report`` under its title."""
    from robust_pfl.pages import provenance_line

    threads = None if args.threads in (None, DEFAULT_THREADS) else args.threads
    title, _, rest = report.read_text(encoding="utf-8").partition("\n")
    line = provenance_line(args.command_line, seconds, threads)
    report.write_text(f"{title}\n\n{line}\n{rest}", encoding="utf-8")


def _table_names(text: str) -> str:
    """``--table``: ``all`` or a comma-separated list of the recipe's tables."""
    from robust_pfl.recipes.attack_table import TABLES

    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in TABLES]
    if text != "all" and (unknown or not names):
        raise argparse.ArgumentTypeError(f"unknown table(s) {', '.join(unknown)}; allowed: "
                                         f"{', '.join(TABLES)}, all, or a comma-separated list")
    return text


def _publish(args: argparse.Namespace, out: Path, markdown: str, figures: dict[str, str] | None = None) -> None:
    """``--page PATH``: the recipe's page, headed by the command, commit and machine that
    produced it, written to PATH (figures beside it; :mod:`robust_pfl.pages`)."""
    if args.page is None:
        return
    from robust_pfl.pages import publish

    threads = None if args.threads in (None, DEFAULT_THREADS) else args.threads
    page = publish(out, markdown, Path(args.page), args.command_line, threads, figures)
    print(f"wrote {page}")


def _attack_table(args: argparse.Namespace) -> int:
    from robust_pfl.recipes import attack_table

    out = Path(args.out) if args.out else Path("results") / "attack_table"
    with _backend(args, _recipe_resources(args)) as backend:
        summary = attack_table.main(out, quick=args.quick, seeds=args.seeds, tables=args.table, backend=backend,
                                    device=args.device)
    _publish(args, out, "attack_table.md")
    return 1 if args.quick and summary.get("errored") else 0  # quick: a smoke run, 0 when every cell ran


def _list_attacks(args: argparse.Namespace) -> int:
    import attacks
    from robust_pfl.catalog import attack_entries, render

    print(render("Attacks (attack = {name = ..., <parameter> = ...}):", attack_entries(attacks.REGISTRY), not args.brief))
    return 0


def _list_defenses(args: argparse.Namespace) -> int:
    import defenses
    from robust_pfl.catalog import aggregator_entries, algorithm_entries, render

    print(render("Algorithms ([[methods]] name = ...):", algorithm_entries(defenses.REGISTRY), not args.brief))
    title = ("Robust aggregators (for 'global': aggregator = NAME or {name = ..., ...};\n"
             "an unset Byzantine budget f follows the run's Byzantine count):")
    print(render(title, aggregator_entries(defenses.AGGREGATORS), not args.brief))
    title = ("Pre-aggregators (rows to rows before a robust aggregator, in order:\n"
             "aggregator = {name = ..., pre = [NAME or {name = ..., ...}, ...]}):")
    print(render(title, aggregator_entries(defenses.PRE_AGGREGATORS), not args.brief))
    return 0


def _download(args: argparse.Namespace) -> int:
    from robust_pfl.engine.datasets import DATA_ENV_VAR, DatasetError
    from robust_pfl.engine.datasets.download import SOURCES, download_dataset

    try:
        path = download_dataset(args.dataset, args.dest, allow=True)
    except DatasetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    # $ROBUST_PFL_DATA also finds a data set in its <root>/<name> subdirectory
    root = path.parent if path.name == args.dataset else path
    print(f"{SOURCES[args.dataset].title} verified in {path}; name it with data_dir = \"{path}\" in the "
          f"config's [task] table, or set {DATA_ENV_VAR}={root}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from robust_pfl.plotting import COMPANION_METRICS, plot_results, recorded_metrics

    metrics = [args.metric]
    if args.metric is None:  # a backdoor run's success rate is plotted beside the main metric
        metrics += [m for m in COMPANION_METRICS if m in recorded_metrics(args.results)]
    for metric in metrics:
        report = plot_results(args.results, args.out, metric)
        print(f"plotted {report.metric}; wrote:")
        for path in report.files:
            print(f"  {path}")
        for note in report.notes:
            print(f"  {note}")
    return 0


def _results(args: argparse.Namespace) -> int:
    from robust_pfl.summaries import compare_tables, render, summary_table
    from robust_pfl.worst_case.results import is_benchmark, worst_case_text

    if args.compare is None and (args.match is not None or args.across is not None):
        raise ConfigError("--match and --across choose how --compare OTHER matches rows: give --compare")
    if args.compare is None and is_benchmark(args.results):
        print(worst_case_text(args.results, args.format), end="")
        return 0
    if args.compare is None:
        table = summary_table(args.results, args.metric)
    else:
        table = compare_tables(args.results, args.compare, args.metric, match=args.match, across=args.across)
    print(render(table, args.format), end="")
    return 0


def _label_list(text: str) -> list[str]:
    """``method,seed`` as ``["method", "seed"]`` (a label name holds no comma)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated label names, got {text!r}")
    return names


class _Version(argparse.Action):
    """``--version``: the package version and the git commit, looked up only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from robust_pfl.provenance import version_text

        print(version_text())
        parser.exit()


def plain(text: str) -> str:
    """A docstring as ``--help`` shows it: reST literals (double backquotes) unmarked."""
    return re.sub(r"``(.+?)``", r"\1", text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="robust-pfl", description=plain(__doc__))
    _add_global_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one experiment from a TOML config")
    run.add_argument("config", help="path to the TOML config")
    run.add_argument("--out", help="output directory (default results/<config name>)")
    run.add_argument(
        "--resume", action="store_true",
        help="continue from the checkpoints in OUT/checkpoints (needs checkpoint_every in the config)",
    )
    run.add_argument(
        "--overwrite", action="store_true",
        help="replace the outputs of an earlier run in OUT (without it, or --resume, such an OUT is refused)",
    )
    _add_device_option(run)
    run.set_defaults(handler=_run)
    flower = commands.add_parser(
        "flower", help="run a config as a Flower simulation, one ClientApp node per client (needs robust-pfl[flower])"
    )
    flower.add_argument("config", help="path to the TOML config (a run config with an optional [flower] table)")
    flower.add_argument("--out", help="output directory (default results/<config name>)")
    flower.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier run in OUT")
    flower.add_argument("--verbose", action="store_true", help="Flower's and Ray's debug logging")
    flower.set_defaults(handler=_flower)
    reproduce = commands.add_parser(
        "reproduce", help="reproduce a figure of Werner et al., or MC's regime suite (mc-regimes, docs/mc.md)")
    reproduce.add_argument("figure", choices=["fig2", "fig3", "fig6", "fig7", "table1", "mc-regimes"])
    reproduce.add_argument(
        "--data-dir", default=None,
        help="table1, fig6: directory of the MNIST IDX files (default: the embedded digits, no download)",
    )
    reproduce.add_argument(
        "--panel", choices=["large_gradient", "bit_flip", "both"], default="both",
        help="fig6: which attack panel (default both)",
    )
    reproduce.add_argument(
        "--partition", choices=["official", "fixed"], default="official",
        help="table1: the official dealing, re-dealt every epoch (default), or fixed seeded shards",
    )
    reproduce.add_argument("--out", help="output directory (default results/<figure>)")
    reproduce.add_argument("--page", default=None, metavar="PATH",
                           help="also write the page there, headed by the command, commit and machine that produced it "
                           "(figures beside it); mc-regimes: replace the marked results block of PATH (docs/mc.md)")
    reproduce.add_argument("--quick", action="store_true", help="fewer rounds, grid points and seeds")
    reproduce.add_argument(
        "--seeds", type=int, default=None,
        help="number of seeds (fig3: default 3, quick 1; fig7: repeats, default 10, quick 3; table1: 1)",
    )
    _add_backend_options(reproduce)
    _add_device_option(reproduce)
    reproduce.set_defaults(handler=_reproduce)
    grid = commands.add_parser("grid", help="run every cell of a grid file into a resumable results store")
    grid.add_argument("grid", help="path to the grid TOML (a run config with [grid] lists)")
    grid.add_argument("--out", help="output directory (default results/<grid name>)")
    _add_backend_options(grid)
    _add_device_option(grid)
    grid.set_defaults(handler=_grid)
    bench = commands.add_parser(
        "benchmark", help="worst case over the attack catalogue across Byzantine fractions and heterogeneity, "
        "tuned on validation data (resumable)")
    bench.add_argument("benchmark", help="path to the benchmark TOML ([[defenses]], [benchmark])")
    bench.add_argument("--out", help="output directory (default results/<benchmark name>)")
    bench.add_argument("--quick", action="store_true", help="the file's quick profile: a smoke run of minutes")
    bench.add_argument("--subset", metavar="NAME", default=None, help="the file's [benchmark.subsets.NAME] profile")
    bench.add_argument("--no-tune", action="store_true", help="run the file's values, no tuning grid")
    bench.add_argument("--data-dir", metavar="DIR", default=None,
                       help="the data set's directory (sets task.data_dir; default: the file's, else $ROBUST_PFL_DATA)")
    bench.add_argument("--page", metavar="PATH", default=None,
                       help="also write the results page there (figures beside it)")
    _add_backend_options(bench)
    _add_device_option(bench)
    bench.set_defaults(handler=_benchmark)
    table = commands.add_parser(
        "attack-table", help="attack x defense tables: the synthetic, digits and systems grid files in configs/ (resumable)"
    )
    table.add_argument("--out", help="output directory (default results/attack_table)")
    table.add_argument("--page", default=None, metavar="PATH",
                       help="also write attack_table.md there, headed by the command, commit and machine that produced it")
    table.add_argument("--quick", action="store_true", help="fewer rounds, 1 seed: a smoke run")
    table.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3, quick 1)")
    table.add_argument(
        "--table", type=_table_names, default="all",
        help="which tables, comma-separated: synthetic, digits, systems, backdoor, or all (default; backdoor: "
        "accuracy and attack success rate per defense)"
    )
    _add_backend_options(table)
    _add_device_option(table)
    table.set_defaults(handler=_attack_table)
    theory = commands.add_parser("theory", help="machine checks of the seed papers' statements (Werner et al., its workshop version, CGPFL, FedSPD)")
    theory_commands = theory.add_subparsers(dest="theory_command", required=True)
    report = theory_commands.add_parser(
        "report", help="run every registered statement check; write theory_report.md, .json and figures"
    )
    report.add_argument("--quick", action="store_true", help="the quick budget (default: full)")
    report.add_argument("--out", help="output directory (default results/theory)")
    report.add_argument("--only", nargs="+", metavar="NAME", default=None,
                        help="run only these statements (names as in the report's table)")
    report.add_argument("--seeds", type=int, default=1,
                        help="run every check on the instances of seeds 0..N-1; the report adds each seed's status")
    report.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run N checks at once, each in its own process with --threads threads (the "
                             "results do not depend on N); default 1")
    report.set_defaults(handler=_theory_report)
    download = commands.add_parser(
        "download", help="fetch a data set from the network (explicit only; checksum-verified, never in tests)"
    )
    download.add_argument("dataset", choices=["mnist", "fashion_mnist", "cifar10", "cifar100"])
    download.add_argument("dest", help="directory to write the files into (a CIFAR archive is unpacked there)")
    download.set_defaults(handler=_download)
    plot = commands.add_parser(
        "plot", help="curves, heatmap and Byzantine-fraction figures (PNG, PDF) of a grid's or run's results"
    )
    plot.add_argument("results", help="results.csv or history.csv, or the directory holding it")
    plot.add_argument("--out", help="output directory (default: RESULTS's directory/plots)")
    plot.add_argument(
        "--metric", default=None,
        help="metric to plot (default: test_accuracy, else accuracy, else param_error, else the first one; "
        "and the attack success rate where a backdoor run recorded it)",
    )
    plot.set_defaults(handler=_plot)
    results = commands.add_parser(
        "results", help="the table a paper shows: final metrics per method x attack (x varying axes), mean ± sd over seeds"
    )
    results.add_argument("results", metavar="STORE_OR_RUN",
                         help="a grid's store (directory with results.csv), a run's output directory, or a "
                         "benchmark's (its worst-case table)")
    results.add_argument("--compare", metavar="OTHER", default=None,
                         help="another store or run: each cell's difference (STORE_OR_RUN - OTHER), cells only in one listed")
    matching = results.add_mutually_exclusive_group()
    matching.add_argument("--match", metavar="LABELS", type=_label_list, default=None,
                          help="with --compare: match rows on these labels only (comma-separated, e.g. method or "
                          "method,seed); every other label is compared across, each side's value shown")
    matching.add_argument("--across", metavar="LABELS", type=_label_list, default=None,
                          help="with --compare: match rows on every label but these (e.g. attack: two runs under "
                          "different attacks, method by method); naming seed in either gives rows per seed, not averaged")
    results.add_argument("--format", choices=["md", "latex", "csv"], default="md",
                         help="md: a Markdown table (default); latex: a booktabs tabular; csv: every number, unrounded")
    results.add_argument("--metric", nargs="+", action="extend", metavar="NAME", default=None,
                         help="metrics to show (default: test_accuracy, else accuracy, else param_error)")
    results.set_defaults(handler=_results)
    for name, handler, text in (
        ("attacks", _list_attacks, "list registered attacks with their parameters"),
        ("defenses", _list_defenses, "list registered algorithms, robust aggregators and pre-aggregators"),
    ):
        listing = commands.add_parser(name, help=text)
        listing.add_argument("--brief", action="store_true", help="one line each, no parameters")
        listing.set_defaults(handler=handler)
    parser.add_argument("--version", action=_Version, help="print the version (and git commit) and exit")
    _add_global_options_everywhere(parser)
    return parser


#: torch CPU threads of a command without --threads: the cores other processes leave free,
#: checked while it runs (robust_pfl.engine.threads; benchmarks/README.md, "Thread defaults").
DEFAULT_THREADS = "auto"


def _thread_count(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'auto', got {text!r}") from None


def _add_global_options(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """``--threads``, ``--quiet`` and ``--verbose``, taken before or after the subcommand
    (a subcommand's copy sets them only when given, so it never undoes the one before it)."""
    unset = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument(
        "--threads", type=_thread_count, metavar="N", **({"default": None} | unset),
        help="torch CPU threads of run, reproduce fig2|fig3|fig7 and theory report, and of each cell of grid; "
             "before or after the subcommand. Default 'auto' for every command: the cores other processes leave "
             "free, checked as the work goes (the fastest on a shared machine); a grid cell: its grid's "
             "[resources] cpus (default 1)",
    )
    parser.add_argument("--quiet", action="store_true", **({"default": False} | unset),
                        help="no progress bar or progress lines on stderr")
    if "--verbose" not in parser._option_string_actions:  # flower's own --verbose sets it too
        parser.add_argument("--verbose", action="store_true", **({"default": False} | unset),
                            help="also a line on stderr at every checkpoint a run or grid cell saves, and when "
                            "one resumes")


def _add_global_options_everywhere(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                if "--threads" not in sub._option_string_actions:
                    _add_global_options(sub)
                _add_global_options_everywhere(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["robust-pfl", *(sys.argv[1:] if argv is None else argv)])
    if args.threads == DEFAULT_THREADS:
        args.threads = None  # a grid's cells keep their [resources] cpus
    threads = DEFAULT_THREADS if args.threads is None else args.threads
    if threads != DEFAULT_THREADS and threads < 1:
        print("error: --threads must be >= 1", file=sys.stderr)
        return 2
    try:
        with _process_settings(threads, args.quiet, args.verbose):
            return args.handler(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


@contextmanager
def _process_settings(threads: int | str, quiet: bool, verbose: bool = False):
    """torch's thread count (a number, or ``auto``: :class:`robust_pfl.engine.threads.AutoThreads`,
    one thread until the work's first progress update decides), ``--quiet`` and
    ``--verbose`` (environment variables, so a grid's workers see them too) for one
    command, restored afterwards (so a caller of :func:`main` keeps its own)."""
    import os

    import torch

    from robust_pfl.engine import threads as policy

    flags = [name for name, on in (("ROBUST_PFL_QUIET", quiet), ("ROBUST_PFL_VERBOSE", verbose)) if on]
    before, saved = torch.get_num_threads(), {name: os.environ.get(name) for name in flags}
    formatter = warnings.formatwarning
    warnings.formatwarning = partial(_format_warning, formatter)
    torch.set_num_threads(1 if threads == DEFAULT_THREADS else threads)
    previous = policy.use(policy.AutoThreads() if threads == DEFAULT_THREADS else None)
    os.environ.update(dict.fromkeys(flags, "1"))
    try:
        yield
    finally:
        warnings.formatwarning = formatter
        policy.use(previous)
        torch.set_num_threads(before)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _format_warning(default: Callable[..., str], message: Warning | str, category: type[Warning],
                    *args: object, **kwargs: object) -> str:
    """A config's cost warning as the one line a user reads, without the source line
    Python adds; every other warning as Python formats it."""
    if issubclass(category, CostWarning):
        return f"warning: {message}\n"
    return default(message, category, *args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
