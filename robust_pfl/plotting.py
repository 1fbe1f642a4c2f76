"""Figures of a results store: ``robust-pfl plot RESULTS``.

RESULTS is a grid's tidy store (``results.csv``: one row per cell, round and metric,
with the grid's axes as columns) or a run's ``history.csv`` (``method, seed, round,
metric, value`` plus optional leading columns), or the directory holding either.
Only ``status == "ok"`` rows are plotted; the ``cell_seconds`` bookkeeping rows never.

Every value is an honest-client mean (what the stores hold).  Columns take roles:

- **defense**: the ``method`` column, with any ``method.*`` option axis appended
  (``fc, method.lr=0.1``);
- **attack**: the ``attack`` column with any ``attack.*`` option axis appended; without
  one, the attack that ``grid.json`` / ``summary.json`` beside the store names;
- **Byzantine fraction**: ``n_byzantine / n_clients``; it summarises the axes that
  only set the count (``byzantine.total``, ``.per_cluster``, ``.fraction``,
  ``.fraction_per_cluster``, an unlabelled ``byzantine`` table); a run's history
  has none;
- **seed**: ``seed``; seeds are the spread of the error bands;
- **setting**: every other column (``task.kind``, a labelled ``byzantine`` placement,
  a recipe's ``setting`` ...), as ``column=value``; each setting gets its own row of
  panels (its own heatmap).

Figures (PNG at 300 dpi and PDF each, all staged before any is moved into place), each
file named after the figure and the metric, ``curves-test_accuracy.png``, so figures of
several metrics sit side by side in one directory:

1. ``curves-METRIC``: the metric against the round, one panel per attack, one line per
   defense, the band one standard deviation over seeds either side of the mean;
2. ``heatmap-METRIC``: the final metric (each run's last recorded round), attack x
   defense, mean over seeds, annotated; skipped with a note when the data hold one
   attack (a run's history always does): one row says no more than the curves;
3. ``byzantine_fraction-METRIC``: the final metric against the Byzantine fraction, one
   panel per attack, one line per defense, the same band; skipped with a note when the
   data hold one fraction.

Each defense's line has its own colour, dash pattern and marker, and a marker at every
evaluation (every recorded round), so lines that coincide (FC under GT) still show; the
legend names every line.  Defenses and attacks come in the order the grid or config
lists them (as ``robust-pfl results``' rows; the no-attack baseline first), by readable
names (:mod:`robust_pfl.display_names`: ``ground_truth`` -> ``GT (oracle clusters)``,
``global+median`` -> ``Global + median``; a label the config wrote stays as written).
Axes carry readable names (:func:`metric_label`: ``Test accuracy (%)`` for
``test_accuracy`` held as fractions), and a metric in percent runs from 0 to 100 (the
heatmap's colour scale too).  Each figure's title sits above its panels, outside them.

Curves and heatmap show each attack at its most common Byzantine fraction (the
largest on a tie: where attacks bite); the fraction figure shows them all.  The
default metric is ``test_accuracy``, else ``accuracy``, else ``param_error``, else the
first one in the data; accuracies (and a backdoor's attack success rate) stored as
fractions are shown in percent.  Any other
positive metric spanning more than three decades (a diverged loss) gets a log axis
and a log colour scale; the heatmap's colormap is the sequential viridis, and a
non-finite mean (a diverged run) is written as ``inf`` / ``nan`` on a blank cell.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from robust_pfl.config import ConfigError
from robust_pfl.display_names import attack_name, display_names, method_name
from robust_pfl.engine.results import BASE_COLUMNS, Content, close_figure, png_writer, write_files
from robust_pfl.summaries import config_methods, recorded_grid

GRID_STORE = "results.csv"
RUN_HISTORY = "history.csv"
#: Columns of the grid store that are not axes.
STORE_COLUMNS = ("cell", "n_clients", "n_byzantine", "status", "error", "round", "metric", "value", "final")
BOOKKEEPING_METRICS = ("cell_seconds",)
PREFERRED_METRICS = ("test_accuracy", "accuracy", "param_error")
BAND = "sd"  # seaborn errorbar: mean +- one standard deviation over seeds
NO_ATTACK_RECORDED = "attack not recorded"
FIGURES = ("curves", "heatmap", "byzantine_fraction")
PANEL_HEIGHT = 2.6
#: Resolution of the PNGs: what a journal asks of line art (the PDFs are vector).
PNG_DPI = 300
#: The baseline attack, first in every figure.
NO_ATTACK = "none"
#: Readable axis names of the metrics the tasks record; any other metric reads as its
#: name with underscores as spaces (:func:`metric_label`).
METRIC_LABELS = {
    "test_accuracy": "Test accuracy",
    "validation_accuracy": "Validation accuracy",
    "train_accuracy": "Train accuracy",
    "accuracy": "Accuracy",
    "test_loss": "Test loss",
    "validation_loss": "Validation loss",
    "train_loss": "Train loss",
    "loss": "Loss",
    "param_error": "Parameter error ||x_i - x*||²",
    "nonfinite_models": "Non-finite honest models (fraction)",
    "ari": "Adjusted Rand index",
    "attack_success_rate": "Attack success rate",
}
#: Plotted beside the main metric whenever the data record it (a backdoor's success).
COMPANION_METRICS = ("attack_success_rate",)
#: Above this many evaluations on a line, markers shrink so they do not merge.
DENSE_MARKERS = 30


def metric_label(metric: str, percent: bool = False) -> str:
    """The axis name of ``metric``: :data:`METRIC_LABELS`, else the name with
    underscores as spaces, its first letter capitalised; `` (%)`` when shown in percent."""
    label = METRIC_LABELS.get(metric)
    if label is None:
        spaced = metric.replace("_", " ").strip() or metric
        label = spaced[:1].upper() + spaced[1:]
    return f"{label} (%)" if percent else label


def figure_file(figure: str, metric: str, kind: str) -> str:
    """The file name of ``figure`` for ``metric``: ``curves-test_accuracy.png``
    (characters other than letters, digits, ``_ . -`` in the metric become ``_``)."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in metric)
    return f"{figure}-{safe}.{kind}"


@dataclass(frozen=True)
class Results:
    """A store in canonical columns: ``run`` (a grid's cell; a history's setting,
    method and seed), ``setting, attack, defense, seed, fraction, round, metric,
    value`` (``fraction`` NaN where the source has none), rows in config order;
    ``order``: each of ``setting``, ``attack`` and ``defense``'s values in the order
    the grid or config lists them (the figures' order, as ``robust-pfl results``')."""

    frame: pd.DataFrame
    source: Path
    kind: str  # "grid" or "run"
    order: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricView:
    """One metric's rows, ``value`` as displayed (percent when ``percent``), and the
    :attr:`Results.order` of their labels."""

    frame: pd.DataFrame
    metric: str
    percent: bool
    order: dict[str, list[str]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return metric_label(self.metric, self.percent)

    @property
    def seeds(self) -> int:
        return int(self.frame["seed"].nunique())

    @property
    def last_round(self) -> int:
        return int(self.frame["round"].max())


@dataclass(frozen=True)
class PlotReport:
    """What :func:`plot_results` wrote, and the figures it skipped with why."""

    metric: str
    files: list[Path]
    notes: list[str]


# -- loading ---------------------------------------------------------------------------------
def results_file(path: str | Path) -> Path:
    """The store a RESULTS argument names: the file itself, or the directory's
    ``results.csv`` (else its ``history.csv``)."""
    path = Path(path)
    if path.is_dir():
        for name in (GRID_STORE, RUN_HISTORY):
            if (path / name).is_file():
                return path / name
        raise ConfigError(f"RESULTS {path}: directory holds neither {GRID_STORE} nor {RUN_HISTORY}")
    if not path.is_file():
        raise ConfigError(f"RESULTS {path}: no such file or directory")
    return path


def load_results(path: str | Path) -> Results:
    """Read a grid store or a run history into :class:`Results` (ok rows only)."""
    from robust_pfl.grid import read_results

    source = results_file(path)
    options: dict[str, Any] = {"dtype": str, "keep_default_na": False}
    try:
        raw = pd.read_csv(source, nrows=0)
        grid = {"cell", "status", "n_clients", "n_byzantine"} <= set(raw.columns)
        # a grid store's complete cell blocks only: what a kill cut is no run's result
        raw = read_results(source, **options) if grid else pd.read_csv(source, **options)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ConfigError(f"RESULTS {source}: not a readable CSV ({error})") from error
    if grid:
        frame, kind = _grid_frame(raw, source), "grid"
    elif set(BASE_COLUMNS) <= set(raw.columns):
        frame, kind = _history_frame(raw, source), "run"
    else:
        raise ConfigError(
            f"RESULTS {source}: neither a grid store (columns cell, <axes>, n_clients, n_byzantine, status, "
            f"round, metric, value) nor a run history (columns {', '.join(BASE_COLUMNS)}); "
            f"found {', '.join(raw.columns) or 'no columns'}"
        )
    if frame.empty:
        raise ConfigError(f"RESULTS {source}: no rows to plot (a grid store plots its status 'ok' rows)")
    frame = frame.sort_values("_rank", kind="stable").drop(columns="_rank").reset_index(drop=True)
    order = {column: list(dict.fromkeys(frame[column])) for column in ("setting", "attack", "defense")}
    return Results(frame, source, kind, order)


def _label(raw: pd.DataFrame, columns: list[str], lead: str | None = None) -> pd.Series:
    """One label per row: ``lead``'s value, then ``column=value`` for the other columns
    (an empty value, a row from before the column existed, reads ``(unset)``)."""
    parts = []
    for column in columns:
        value = raw[column].replace("", "(unset)")
        parts.append(value if column == lead else column + "=" + value)
    if not parts:
        return pd.Series("", index=raw.index)
    label = parts[0]
    for part in parts[1:]:
        label = label + ", " + part
    return label


def _numeric(raw: pd.DataFrame, column: str, source: Path, allow_nan: bool = False) -> pd.Series:
    """``column`` as numbers (``allow_nan``: "nan" and empty cells are NaN, a diverged
    metric); anything else that is not a number is an error naming the column."""
    text = raw[column].str.strip()
    values = pd.to_numeric(text, errors="coerce")
    bad = values.isna() & ~(allow_nan & text.str.lower().isin(["nan", ""]))
    if bad.any():
        raise ConfigError(f"RESULTS {source}: column {column!r} holds {raw.loc[bad, column].iloc[0]!r}, not a number")
    return values


def _canonical(raw: pd.DataFrame, source: Path, run: pd.Series, attack: pd.Series, defense: pd.Series,
               setting: pd.Series, fraction: pd.Series, rank: pd.Series) -> pd.DataFrame:
    """The canonical columns, and ``_rank``: each row's run's place in the config's order."""
    seed = _numeric(raw, "seed", source).astype(int) if "seed" in raw else pd.Series(0, index=raw.index)
    return pd.DataFrame({
        "run": run, "setting": setting, "attack": attack, "defense": defense, "seed": seed, "fraction": fraction,
        "round": _numeric(raw, "round", source).astype(int), "metric": raw["metric"],
        "value": _numeric(raw, "value", source, allow_nan=True).astype(float), "_rank": rank,
    })


def _ranks(keys: pd.Series, order: list[str]) -> pd.Series:
    """Each key's place in ``order``; keys it does not list follow, as they first
    appear."""
    rank = {key: index for index, key in enumerate(dict.fromkeys([*order, *keys]))}
    return keys.map(rank)


def _grid_frame(raw: pd.DataFrame, source: Path) -> pd.DataFrame:
    raw = raw[raw["status"] == "ok"]
    raw = raw[~raw["metric"].isin(BOOKKEEPING_METRICS)]
    axes = [c for c in raw.columns if c not in STORE_COLUMNS]
    raw = _latest_cells(raw, axes)
    attack_axes = [c for c in axes if c == "attack" or c.startswith("attack.")]
    method_axes = [c for c in axes if c == "method" or c.startswith(("method.", "methods."))]
    counts = [c for c in axes if _byzantine_count_axis(c, raw[c])]
    settings = [c for c in axes if c not in [*attack_axes, *method_axes, *counts, "seed"]]
    if attack_axes:
        attack = _label(raw, attack_axes, lead="attack")
    else:
        attack = pd.Series(_recorded_attack(source.parent / "grid.json", grid=True), index=raw.index)
    defense = _label(raw, method_axes, lead="method") if method_axes else pd.Series("method", index=raw.index)
    fraction = _numeric(raw, "n_byzantine", source) / _numeric(raw, "n_clients", source)
    rank = _ranks(raw["cell"], recorded_grid(source.parent / "grid.json")[1])  # grid order: methods in config order
    return _canonical(raw, source, raw["cell"], attack, defense, _label(raw, settings), fraction, rank)


def _latest_cells(raw: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """``raw`` without the cells that a later cell with the same axis values (labels and
    seed) replaced: a store outlives edits of its grid file (a method's options changed
    under the same label give a new cell), and the cell appended last is the one the
    edited file ran.  Averaging both would mix two configurations under one label."""
    cells = raw.drop_duplicates("cell")  # in the order the cells were appended
    latest = cells.drop_duplicates(axes, keep="last")["cell"] if axes else cells["cell"]
    return raw[raw["cell"].isin(set(latest))]


BYZANTINE_COUNTS = tuple(f"byzantine.{field}" for field in ("total", "per_cluster", "fraction", "fraction_per_cluster"))


def _byzantine_count_axis(column: str, values: pd.Series) -> bool:
    """Whether an axis only sets how many clients are Byzantine, which the fraction
    ``n_byzantine / n_clients`` summarises: a count or fraction field, or a
    ``byzantine`` table without a label (its column holds the table's JSON).  A
    labelled ``byzantine`` table (a named placement) is a setting of its own."""
    if column in BYZANTINE_COUNTS:
        return True
    return column == "byzantine" and bool(values.str.startswith("{").all())


def _history_frame(raw: pd.DataFrame, source: Path) -> pd.DataFrame:
    settings = [c for c in raw.columns if c not in BASE_COLUMNS]
    attack = pd.Series(_recorded_attack(source.parent / "summary.json", grid=False), index=raw.index)
    fraction = pd.Series(math.nan, index=raw.index)
    run = _label(raw, [*settings, "method", "seed"])
    rank = _ranks(raw["method"], config_methods(_recorded_config(source.parent / "summary.json")))
    return _canonical(raw, source, run, attack, raw["method"], _label(raw, settings), fraction, rank)


def _recorded_config(path: Path) -> Any:
    """The config a run's ``summary.json`` records (``None`` where it has none)."""
    try:
        return json.loads(path.read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        return None


def _recorded_attack(path: Path, grid: bool) -> str:
    """The attack's label (else name) in the config recorded beside a store: a run's
    ``summary.json`` or (same attack in every cell) a grid's ``grid.json``."""
    try:
        data = json.loads(path.read_text())
        configs = [cell["config"] for cell in data["cells"].values()] if grid else [data["config"]]
        attack = configs[0].get("attack") or {"name": "none"}
        return str(attack.get("label") or attack["name"])
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return NO_ATTACK_RECORDED


# -- what is plotted ---------------------------------------------------------------------------
def choose_metric(results: Results, metric: str | None = None) -> str:
    """``metric`` if the data hold it, else the default (see the module docstring)."""
    available = list(dict.fromkeys(results.frame["metric"]))
    if metric is not None:
        if metric not in available:
            raise ConfigError(f"--metric {metric!r}: not in {results.source}; available: {', '.join(available)}")
        return metric
    return next((m for m in PREFERRED_METRICS if m in available), available[0])


def metric_view(results: Results, metric: str) -> MetricView:
    """The metric's rows; accuracies held as fractions in [0, 1] become percent."""
    frame = results.frame[results.frame["metric"] == metric].copy()
    finite = frame["value"][np.isfinite(frame["value"])]
    percent = ("accuracy" in metric or metric in COMPANION_METRICS) and finite.between(0.0, 1.0).all()
    if percent:
        frame["value"] = frame["value"] * 100.0
    return MetricView(frame, metric, bool(percent), results.order)


def final_values(view: MetricView) -> pd.DataFrame:
    """Each run's (grid cell's) value at its last recorded round."""
    frame = view.frame.sort_values("round", kind="stable")
    return frame.groupby("run", sort=False).tail(1).reset_index(drop=True)


def shown_fractions(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns ``setting, attack, fraction``: the fraction that curves and heatmap show
    for each (setting, attack), the one with the most runs, the largest on a tie (NaN
    where the data have none)."""
    runs = frame.drop_duplicates("run")
    counts = runs.groupby(["setting", "attack", "fraction"], dropna=False).size().reset_index(name="runs")
    counts = counts.sort_values(["runs", "fraction"], na_position="first", kind="stable")
    return counts.groupby(["setting", "attack"], sort=False).tail(1)[["setting", "attack", "fraction"]]


def at_shown_fraction(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows at :func:`shown_fractions`' fraction of their (setting, attack)."""
    return frame.merge(shown_fractions(frame), on=["setting", "attack", "fraction"])


def _order(values: pd.Series, order: list[str] | None = None, first: str | None = None) -> list[str]:
    """The labels in ``values``, in ``order`` (the config's), those it lacks sorted
    after; ``first`` (the no-attack baseline) leading."""
    present = set(values)
    ordered = [value for value in order or [] if value in present]
    ordered += sorted(present - set(ordered))
    if first in ordered:
        ordered.remove(first)
        ordered.insert(0, first)
    return ordered


@dataclass(frozen=True)
class Heatmap:
    """One setting's final metric: ``mean`` over seeds (non-finite where a run
    diverged) and ``runs`` (seeds that ran; 0 where the combination did not),
    attacks as rows and defenses as columns."""

    setting: str
    mean: pd.DataFrame
    runs: pd.DataFrame


def heatmap_tables(view: MetricView) -> list[Heatmap]:
    """A :class:`Heatmap` per setting, each attack at its shown fraction."""
    final = at_shown_fraction(final_values(view))
    tables = []
    for setting in _order(final["setting"], view.order.get("setting")):
        group = final[final["setting"] == setting]
        cells = group.groupby(["attack", "defense"])["value"]
        rows = _order(group["attack"], view.order.get("attack"), NO_ATTACK)
        columns = _order(group["defense"], view.order.get("defense"))
        mean = cells.agg(lambda v: v.mean(skipna=False)).unstack("defense").reindex(index=rows, columns=columns)
        runs = cells.size().unstack("defense").reindex(index=rows, columns=columns).fillna(0).astype(int)
        tables.append(Heatmap(setting, mean, runs))
    return tables


# -- figures ---------------------------------------------------------------------------------
def _fraction_text(frame: pd.DataFrame) -> str:
    """Which Byzantine fraction curves and heatmap show, for their titles."""
    known = sorted(shown_fractions(frame)["fraction"].dropna().unique())
    if not known:
        return ""
    if len(known) == 1:
        return f"at Byzantine fraction {known[0]:.2g}"
    return "each attack at its most common Byzantine fraction"


def _log_scale(values: pd.Series) -> bool:
    """Log axis for positive metrics spanning over three orders of magnitude."""
    finite = values[np.isfinite(values)]
    return bool(len(finite)) and (finite > 0).all() and finite.max() > 1e3 * finite.min()


def _seed_text(view: MetricView) -> str:
    return f"band: mean ± 1 sd over {view.seeds} seeds" if view.seeds > 1 else "one seed, no band"


def shown_names(view: MetricView) -> dict[str, dict[str, str]]:
    """What the figures call each defense and attack label
    (:mod:`robust_pfl.display_names`: ``ground_truth`` -> ``GT (oracle clusters)``)."""
    return {"defense": display_names(view.frame["defense"], method_name),
            "attack": display_names(view.frame["attack"], attack_name)}


def _named(frame: pd.DataFrame, view: MetricView) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """``frame`` with defenses and attacks by their shown names, and each column's
    shown names in figure order (the config's, the baseline attack first)."""
    names = shown_names(view)
    orders = {"defense": _order(frame["defense"], view.order.get("defense")),
              "attack": _order(frame["attack"], view.order.get("attack"), NO_ATTACK),
              "setting": _order(frame["setting"], view.order.get("setting"))}
    for column, mapping in names.items():
        frame = frame.assign(**{column: frame[column].map(mapping)})
        orders[column] = [mapping[value] for value in orders[column]]
    return frame, orders


def _relplot(frame: pd.DataFrame, x: str, view: MetricView) -> Any:
    """One line per defense with its own colour, dashes and marker (a marker at every
    x the data hold: each evaluation), the legend naming each in config order; an
    accuracy in percent on a 0-100 axis, so panels and figures compare at a glance."""
    import seaborn as sns

    frame = frame.assign(value=frame["value"].where(np.isfinite(frame["value"])))
    frame, orders = _named(frame, view)
    rows = frame["setting"].nunique() > 1
    defenses = orders["defense"]
    points = frame.groupby(["run"])[x].nunique().max() if len(frame) else 0
    grid = sns.relplot(
        data=frame, x=x, y="value", kind="line", hue="defense", hue_order=defenses,
        style="defense", style_order=defenses, markers=True, dashes=True,
        col="attack", col_order=orders["attack"],
        row="setting" if rows else None, row_order=orders["setting"] if rows else None,
        errorbar=BAND, linewidth=1.6, markersize=4 if points > DENSE_MARKERS else 7,
        # hollow markers in the line's colour (seaborn's default edge is white): a marker
        # under another of another shape still shows
        markerfacecolor="none", markeredgecolor=None, markeredgewidth=1.2,
        height=PANEL_HEIGHT, aspect=1.25, facet_kws={"sharey": "row", "margin_titles": rows},
    )
    grid.set_titles(row_template="{row_name}", col_template="attack: {col_name}")
    if grid.legend is not None:
        grid.legend.set_title("defense")
        for handle in grid.legend.legend_handles:  # hollow like the lines' markers
            if hasattr(handle, "set_markerfacecolor"):
                handle.set_markeredgecolor(handle.get_color())
                handle.set_markerfacecolor("none")
    grid.set_ylabels(view.label)
    if view.percent:
        grid.set(ylim=(0, 100))
    elif _log_scale(frame["value"]):
        grid.set(yscale="log")
    return grid


def curves_figure(view: MetricView) -> Any:
    """Metric against round (see the module docstring); the matplotlib figure."""
    frame = at_shown_fraction(view.frame)
    grid = _relplot(frame, "round", view)
    grid.set_xlabels("Round")
    where = _fraction_text(view.frame)
    grid.figure.suptitle(
        f"{view.label} over {view.last_round} rounds" + (f", {where}" if where else "") + f"\n{_seed_text(view)}",
        y=1.0, va="bottom",
    )
    return grid.figure


def fraction_figure(view: MetricView) -> Any:
    """Final metric against Byzantine fraction; the matplotlib figure."""
    grid = _relplot(final_values(view), "fraction", view)
    grid.set_xlabels("Byzantine fraction")
    grid.figure.suptitle(
        f"{view.label} at the last round ({view.last_round}) against the Byzantine fraction "
        f"(n_byzantine / n_clients)\n{_seed_text(view)}",
        y=1.0, va="bottom",
    )
    return grid.figure


def heatmap_figure(view: MetricView, tables: list[Heatmap]) -> Any:
    """Annotated heatmaps of :func:`heatmap_tables`, one panel per setting, one
    sequential colormap shared by the panels; the matplotlib figure."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.colors import LogNorm, Normalize

    values = pd.Series(np.concatenate([t.mean.to_numpy(dtype=float).ravel() for t in tables]))
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    if view.percent:  # the accuracy scale, as the curves' axes
        norm = Normalize(0.0, 100.0)
    else:
        norm = LogNorm(low, high) if _log_scale(values) else Normalize(low, high)
    names = shown_names(view)
    columns = max(t.mean.shape[1] for t in tables)
    rows = max(t.mean.shape[0] for t in tables)
    size = (2.0 + 0.85 * columns, 1.9 + 0.45 * rows)
    figure, axes = plt.subplots(1, len(tables), figsize=(size[0] * len(tables), size[1]), squeeze=False)
    for ax, table in zip(axes[0], tables):
        mean = table.mean.rename(index=names["attack"], columns=names["defense"])
        sns.heatmap(
            mean.where(np.isfinite(mean)), ax=ax, cmap="viridis", norm=norm,
            linewidths=0.5, linecolor="white", cbar_kws={"label": view.label},
        )
        _annotate(ax, table, view.percent, norm)
        ax.set(xlabel="Defense", ylabel="Attack", title=table.setting)
        if max(len(str(c)) for c in mean.columns) > 6:
            plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
        plt.setp(ax.get_yticklabels(), rotation=0)
    where = _fraction_text(view.frame)
    plural = "s" if view.seeds > 1 else ""
    figure.tight_layout()
    # above the figure's top edge (bbox_inches="tight" keeps it), clear of every panel
    figure.suptitle(
        f"{view.label} at the last round ({view.last_round})\nmean over {view.seeds} seed{plural}"
        + (f", {where}" if where else ""),
        fontsize="medium", y=1.0, va="bottom",
    )
    return figure


def _cell_text(value: float, percent: bool) -> str:
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return f"{value:.1f}" if percent else f"{value:.3g}"


def _annotate(ax: Any, table: Heatmap, percent: bool, norm: Any) -> None:
    """Write each cell's mean; nothing where the combination did not run.  Light text
    on viridis' dark (low) half, dark text on its light half and on the blank cells of
    non-finite means."""
    means = table.mean.to_numpy(dtype=float)
    for (row, column), runs in np.ndenumerate(table.runs.to_numpy()):
        if runs == 0:
            continue
        value = means[row, column]
        colour = "white" if math.isfinite(value) and norm(value) <= 0.5 else "black"
        ax.text(column + 0.5, row + 0.5, _cell_text(value, percent), ha="center", va="center",
                color=colour, fontsize="small")


# -- writing ---------------------------------------------------------------------------------
def pdf_writer(figure: Any) -> Callable[[Path], None]:
    """The :data:`Content` of a figure saved as PDF (no creation date: same data, same
    bytes)."""
    return lambda path: figure.savefig(path, format="pdf", bbox_inches="tight", metadata={"CreationDate": None})


def default_out(path: str | Path) -> Path:
    """RESULTS's directory / "plots"."""
    path = Path(path)
    return (path if path.is_dir() else path.parent) / "plots"


def recorded_metrics(path: str | Path) -> list[str]:
    """The metrics the store or run at ``path`` records."""
    return list(load_results(path).frame["metric"].unique())


def plot_results(path: str | Path, out: str | Path | None = None, metric: str | None = None) -> PlotReport:
    """Write the figures of the store at ``path`` into ``out`` (default
    :func:`default_out`); see the module docstring."""
    import matplotlib

    matplotlib.use("Agg")
    results = load_results(path)
    chosen = choose_metric(results, metric)
    view = metric_view(results, chosen)
    out = Path(out) if out is not None else default_out(path)
    fractions = view.frame["fraction"].dropna().unique()
    attacks = view.frame["attack"].unique()
    notes = []
    if len(attacks) == 1:
        notes.append(f"heatmap: skipped (one attack in the data: {attacks[0]}; the curves show it)")
    if results.kind == "run":
        notes.append(f"byzantine_fraction: skipped ({RUN_HISTORY} records no Byzantine fraction)")
    elif len(fractions) == 1:
        notes.append(f"byzantine_fraction: skipped (one Byzantine fraction in the data: {fractions[0]:.3g})")
    figures: dict[str, Any] = {}
    try:
        figures["curves"] = curves_figure(view)
        if len(attacks) > 1:  # one attack: a single row, what the curves' last points show
            figures["heatmap"] = heatmap_figure(view, heatmap_tables(view))
        if len(fractions) > 1:
            figures["byzantine_fraction"] = fraction_figure(view)
        files: dict[str, Content] = {}
        for name, figure in figures.items():
            files[figure_file(name, chosen, "png")] = png_writer(figure, dpi=PNG_DPI, bbox_inches="tight")
            files[figure_file(name, chosen, "pdf")] = pdf_writer(figure)
        write_files(out, files)
        for stale in set(FIGURES) - figures.keys():  # a skipped figure's files from an earlier call
            for kind in ("png", "pdf"):
                (out / figure_file(stale, chosen, kind)).unlink(missing_ok=True)
    finally:
        for figure in figures.values():
            close_figure(figure)
    return PlotReport(chosen, [out / name for name in files], notes)
