"""Reproduce Werner et al. Fig. 3 (Sec. 4.1): synthetic clustered linear regression.

FC, Local, IFCA, Global (FedAvg) and GT (oracle clusters) at
``(K, n_i) in {(4, 4), (4, 16), (16, 4)}`` with the official code's data settings
(docs/official_code.md): feature mean = cluster index, ``x_k*`` in ``{0, 1}^d`` scaled by
100, no label noise, full-batch gradients, heavy-ball momentum 0.9 on every method's
update, FC with 10 clustering rounds and a quantile radius recomputed every round
(strict inclusion).

Hyper-parameters are chosen per (setting, method) from a small grid, as the paper
did, by the **validation** loss (fresh samples from each client's distribution) of the
first seed, averaged in log scale over the evaluated rounds (see
:func:`selection_score`); the chosen setting is then run on every seed and
the reported numbers are the **test** metrics of those runs:
``param_error = mean_i ||x_i - x_{k_i}*||^2`` over clients, and the test loss.
At ``K = 16`` FC's grid includes the quantile ``1/K`` (the radius must follow the
cluster fraction).

The full run checks the figure's claims (:func:`acceptance_checks`) and :func:`main`
returns 1 when one fails.  Quick mode (fewer rounds, grid points and seeds) shows the
recipe end to end but its budget cannot decide the claims: it checks none, and says so
in its output, ``fig3.md`` and ``summary.json`` (``"checked": false``).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robust_pfl.config import ExperimentConfig, MethodConfig, parse_config
from robust_pfl.engine.progress import progress_bar
from robust_pfl.experiments import build_task, run_method
from robust_pfl.recipes import QUICK_SENTENCE
from robust_pfl.engine.results import ResultTable, close_figure, history_text, png_writer, write_outputs

SETTINGS: tuple[tuple[int, int], ...] = ((4, 4), (4, 16), (16, 4))
METHODS = ("fc", "local", "ifca", "global", "ground_truth")
LABELS = {"fc": "FC", "local": "Local", "ifca": "IFCA", "global": "Global", "ground_truth": "GT"}


@dataclass(frozen=True)
class Mode:
    rounds: int
    learning_rates: tuple[float, ...]
    seeds: int
    eval_every: int


FULL = Mode(rounds=800, learning_rates=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2), seeds=3, eval_every=20)
QUICK = Mode(rounds=300, learning_rates=(1e-3, 3e-3, 1e-2), seeds=1, eval_every=25)


def radius_grid(clusters: int) -> list[dict[str, Any]]:
    """FC's radius candidates: the official quantile 0.25, the paper's MNIST value 0.2,
    and ``1/K``.  With ``K = 4`` equal clusters, 0.25 puts the radius exactly at the
    cluster boundary (between the 16th and 17th of 64 distances), and an early
    mis-clustering can strand a client; 0.2 leaves a margin."""
    quantiles = sorted({0.25, 0.2, round(1.0 / clusters, 6)}, reverse=True)
    return [{"policy": "quantile", "q": q, "strict": True} for q in quantiles]


def candidates(method: str, clusters: int, mode: Mode) -> list[dict[str, Any]]:
    """Hyper-parameter candidates for one method (learning rate x radius for FC)."""
    base = {"heavy_ball": 0.9}
    radii = radius_grid(clusters) if method == "fc" else [None]
    out = []
    for lr, radius in itertools.product(mode.learning_rates, radii):
        options = {**base, "lr": lr}
        if radius is not None:
            options["radius"] = radius
        out.append(options)
    return out


def setting_config(clusters: int, per_cluster: int, mode: Mode, seeds: list[int]) -> ExperimentConfig:
    return parse_config(
        {
            "seeds": seeds,
            "rounds": mode.rounds,
            "eval_every": mode.eval_every,
            "dtype": "float64",
            "task": {"clusters": clusters, "clients_per_cluster": per_cluster},
            "methods": [{"name": m} for m in METHODS],
        },
        source=f"fig3 K={clusters} n={per_cluster}",
    )


TARGET_ERROR = 1e-6
CONVERGED = 1e-12


def _mean_rounds(values: list[int | None]) -> float:
    return math.inf if any(v is None for v in values) else sum(values) / len(values)


def rounds_to_reach(table: ResultTable, target: float = TARGET_ERROR) -> int | None:
    """First evaluated round whose honest-mean ``param_error`` is <= ``target``
    (``None`` if never): a convergence-speed comparison that stays meaningful when
    two methods both end at float64 round-off."""
    hits = [r["round"] for r in table.rows if r["metric"] == "param_error" and r["value"] <= target]
    return min(hits) if hits else None


def selection_score(table: ResultTable) -> float:
    """Mean of log10(validation loss) over the evaluated rounds (area under the log
    curve).  Unlike the last value alone it is not decided by float64 round-off
    when several candidates converge, and it rewards converging sooner."""
    values = [r["value"] for r in table.rows if r["metric"] == "validation_loss"]
    if not values or not all(math.isfinite(v) for v in values):
        return math.inf
    return sum(math.log10(max(v, 1e-300)) for v in values) / len(values)


def _final(table: ResultTable, metric: str) -> float:
    last = max((r for r in table.rows if r["metric"] == metric), key=lambda r: r["round"])
    value = last["value"]
    return value if math.isfinite(value) else math.inf


def run(
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    progress: bool | None = None,
    mode: Mode | None = None,
) -> dict[str, Any]:
    """Run the grid, select on validation loss, write results and the plot.
    ``mode`` overrides the full/quick presets (rounds, grid, seeds)."""
    mode = mode or (QUICK if quick else FULL)
    seed_list = list(range(seeds if seeds is not None else mode.seeds))
    history = ResultTable()
    summary: dict[str, Any] = {"mode": "quick" if quick else "full", "rounds": mode.rounds, "seeds": seed_list, "settings": {}}
    total = sum(len(candidates(m, k, mode)) * mode.rounds for k, _ in SETTINGS for m in METHODS)
    total += len(SETTINGS) * len(METHODS) * (len(seed_list) - 1) * mode.rounds
    started = time.perf_counter()
    with progress_bar(total, "fig3", progress) as bar:
        tick = lambda: bar.update(1)  # noqa: E731
        for clusters, per_cluster in SETTINGS:
            config = setting_config(clusters, per_cluster, mode, seed_list)
            tasks = {seed: build_task(config, seed) for seed in seed_list}
            key = f"K={clusters},n={per_cluster}"
            summary["settings"][key] = {}
            for method in METHODS:
                first = seed_list[0]
                best: tuple[float, dict[str, Any], ResultTable] | None = None
                for options in candidates(method, clusters, mode):
                    spec = MethodConfig(name=method, label=LABELS[method], **options)
                    table = run_method(spec, config, first, on_round=tick, task=tasks[first])
                    score = selection_score(table)
                    if best is None or score < best[0]:
                        best = (score, options, table)
                assert best is not None
                score, options, first_table = best
                spec = MethodConfig(name=method, label=LABELS[method], **options)
                tables = [first_table] + [
                    run_method(spec, config, seed, on_round=tick, task=tasks[seed]) for seed in seed_list[1:]
                ]
                for table in tables:
                    for row in table.rows:
                        history.rows.append({"setting": key, **row})
                per_seed = [_final(t, "param_error") for t in tables]
                summary["settings"][key][LABELS[method]] = {
                    "chosen": options,
                    "selection_score_seed0": score,
                    "param_error": sum(per_seed) / len(per_seed),
                    "param_error_per_seed": per_seed,
                    "test_loss": sum(_final(t, "test_loss") for t in tables) / len(tables),
                    "rounds_to_1e-6_per_seed": [rounds_to_reach(t) for t in tables],
                }
                bar.item_done(f"{key} {LABELS[method]} done: {len(candidates(method, clusters, mode))} candidate(s), "
                              f"{len(seed_list)} seed(s)")
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["checks"] = acceptance_checks(summary["settings"])
    summary["checked"] = not quick  # quick mode's budget is too small to decide the claims
    figure = plot(history.rows)
    try:
        write_outputs(out, summary, {
            "history.csv": history_text(history.rows),
            "fig3.png": png_writer(figure, dpi=120, bbox_inches="tight"),
            "fig3.md": markdown_table(summary),
        })
    finally:
        close_figure(figure)
    return summary


def markdown_table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table (what docs/results/README.md shows, "Werner et al. Fig. 3")."""
    names = list(LABELS.values())
    lines = [
        "| (K, n_i) | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for clusters, per_cluster in SETTINGS:
        key = f"K={clusters},n={per_cluster}"
        methods = summary["settings"][key]
        cells = []
        for name in names:
            result = methods[name]
            rounds = result["rounds_to_1e-6_per_seed"]
            reached = "" if any(r is None for r in rounds) else f" ({sum(rounds) / len(rounds):.0f} r)"
            cells.append(f"{result['param_error']:.2g}{reached}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Mean over {len(summary['seeds'])} seeds of the final honest-mean ||x_i - x*||^2 after "
        f"{summary['rounds']} rounds; (r) = mean rounds to reach 1e-6 where every seed did."
    )
    if summary.get("checked", True):
        checks = [f"- [{'x' if ok else ' '}] {claim}" for claim, ok in summary["checks"].items()]
    else:
        checks = [QUICK_NOTE] + [f"- [not checked] {claim}" for claim in summary["checks"]]
    return "\n".join(lines + [""] + checks) + "\n"


def acceptance_checks(settings: dict[str, Any]) -> dict[str, bool]:
    """The claims of Fig. 3 that the issue asks us to verify."""
    checks = {}
    for key in ("K=4,n=4", "K=4,n=16"):
        result = settings[key]
        checks[f"{key}: FC below Local"] = result["FC"]["param_error"] < result["Local"]["param_error"]
        checks[f"{key}: FC below Global"] = result["FC"]["param_error"] < result["Global"]["param_error"]
    n16 = settings["K=4,n=16"]
    fc, gt = n16["FC"]["param_error"], n16["GT"]["param_error"]
    # Both can end at float64 round-off (~1e-27 for ||x*||^2 ~ 5e4), where a ratio is
    # noise: below CONVERGED the two count as equal.
    checks["K=4,n=16: FC within 25% of GT (final error)"] = fc <= 1.25 * gt or max(fc, gt) <= CONVERGED
    fc_rounds = _mean_rounds(n16["FC"]["rounds_to_1e-6_per_seed"])
    gt_rounds = _mean_rounds(n16["GT"]["rounds_to_1e-6_per_seed"])
    checks["K=4,n=16: FC within 25% of GT (rounds to 1e-6)"] = fc_rounds <= 1.25 * gt_rounds
    return checks


def plot(rows: list[dict[str, Any]]) -> Any:
    """Honest-mean parameter error vs round, one panel per setting (seaborn); the
    matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame(rows)
    frame = frame[frame["metric"] == "param_error"]
    grid = sns.relplot(
        data=frame, x="round", y="value", hue="method", col="setting", kind="line",
        errorbar=("pi", 100), height=3.2, aspect=1.1, facet_kws={"sharey": False},
    )
    grid.set(yscale="log", ylabel="mean ||x_i - x*||^2")
    grid.figure.suptitle("Werner et al. Fig. 3 (synthetic linear regression), robust-pfl", y=1.03)
    return grid.figure


QUICK_NOTE = (
    f"{QUICK_SENTENCE} ({FULL.rounds} rounds, {FULL.seeds} seeds; quick: {QUICK.rounds} rounds, "
    f"{QUICK.seeds} seed, a smaller grid)."
)


def main(out: Path, quick: bool = False, seeds: int | None = None) -> int:
    """Run and write the files; exit status 1 if a checked claim fails (quick mode
    checks none)."""
    summary = run(out, quick=quick, seeds=seeds)
    print(f"wrote {out}/summary.json, history.csv, fig3.png, fig3.md ({summary['seconds']} s)")
    for key, methods in summary["settings"].items():
        row = "  ".join(f"{name}={v['param_error']:.3g}" for name, v in methods.items())
        print(f"  {key}: {row}")
    if not summary["checked"]:
        print(f"  {QUICK_NOTE}")
        return 0
    for claim, ok in summary["checks"].items():
        print(f"  [{'ok' if ok else 'FAILED'}] {claim}")
    return 0 if all(summary["checks"].values()) else 1
