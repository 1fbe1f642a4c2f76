"""The table a paper shows: ``robust-pfl results STORE_OR_RUN``.

STORE_OR_RUN is a grid's store (a directory with ``results.csv``) or a run's output
directory (``history.csv`` and ``summary.json``), or either file.  Every run (a grid
cell; a run's method and seed) contributes its final value of each metric (the last
recorded round); runs are grouped by their labels and the seeds averaged:

- **labels**: ``method`` and ``attack`` (a grid's axis columns, else the attack that
  ``grid.json`` / ``summary.json`` records), then every other axis of the grid
  (``byzantine.total``, ``method.lr``, ...; a history's leading columns) that takes
  more than one value; ``seed`` is what is averaged over;
- **order**: as the config and grid list them (a grid's cells in ``grid.json``'s
  order, a run's methods in its config's), not alphabetical;
- **statistics**: per metric, the mean, the standard deviation (``ddof=1``; NaN for
  one seed) and the count of runs;
- only a grid's finished cells with status ``ok`` count; a cell that a later cell
  with the same labels and seed replaced (an edited grid file) does not.

:func:`summary_table` returns the table as a DataFrame (values in the stored units),
:func:`compare_tables` two of them cell by cell (matched on every label, or with
``across`` / ``match`` on chosen ones: two runs under different attacks, method by
method), :func:`render` either as Markdown,
a booktabs LaTeX tabular or CSV: Markdown and LaTeX show accuracies stored as
fractions in percent, ``mean ± sd``, and ``mean (n=1)`` for a single seed; CSV holds
the numbers unrounded, in the stored units.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from robust_pfl.config import ConfigError

GRID_STORE = "results.csv"
GRID_JSON = "grid.json"
RUN_HISTORY = "history.csv"
RUN_SUMMARY = "summary.json"
#: Columns of the grid store that are not axes.
STORE_COLUMNS = ("cell", "n_clients", "n_byzantine", "status", "error", "round", "metric", "value", "final")
HISTORY_COLUMNS = ("method", "seed", "round", "metric", "value")
PREFERRED_METRICS = ("test_accuracy", "accuracy", "param_error")
#: Metrics that are bookkeeping, never a default.
BOOKKEEPING_METRICS = ("cell_seconds", "seconds", "nonfinite_models")
#: Shown beside the default metric whenever recorded (a backdoor attack's runs).
COMPANION_METRICS = ("attack_success_rate",)
#: Fractions shown in percent besides the accuracies.
PERCENT_METRICS = ("attack_success_rate",)
NOT_RECORDED = "(not recorded)"
FORMATS = ("md", "latex", "csv")
MISSING = "–"


class ResultsError(ConfigError):
    """A results directory that is missing or cannot be read as a store or a run."""


@dataclass(frozen=True)
class Finals:
    """Each run's final value of every metric: ``frame`` has the label columns
    ``labels`` (display order), ``run``, ``seed``, ``metric``, ``value``, its rows in
    run order (the grid's / config's)."""

    frame: pd.DataFrame
    labels: list[str]
    source: Path
    kind: str  # "grid" or "run"

    @property
    def metrics(self) -> list[str]:
        return list(dict.fromkeys(self.frame["metric"]))


# -- loading ----------------------------------------------------------------------------------
def load_finals(path: str | Path) -> Finals:
    """The final values of the grid store or run at ``path`` (a directory, or its
    ``results.csv`` / ``history.csv``).  Raises :class:`ResultsError` naming the path
    when it is missing or malformed."""
    path = Path(path)
    if path.is_file() and path.name in (GRID_STORE, RUN_HISTORY, RUN_SUMMARY):
        path = path.parent
    if not path.exists():
        raise ResultsError(f"{path}: no such directory")
    if not path.is_dir():
        raise ResultsError(f"{path}: not a directory holding {GRID_STORE}, or {RUN_HISTORY} and {RUN_SUMMARY}")
    if (path / GRID_STORE).is_file():
        return _grid_finals(path)
    if (path / RUN_HISTORY).is_file() or (path / RUN_SUMMARY).is_file():
        return _run_finals(path)
    raise ResultsError(
        f"{path}: neither a grid store (no {GRID_STORE}) nor a run's output directory "
        f"(no {RUN_HISTORY} and {RUN_SUMMARY})"
    )


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ResultsError(f"{path}: not a readable CSV ({error})") from None


def _numbers(frame: pd.DataFrame, column: str, source: Path) -> pd.Series:
    """``column`` as floats; "nan" and empty cells are NaN, anything else that is no
    number an error naming the column."""
    text = frame[column].astype(str).str.strip()
    values = pd.to_numeric(text, errors="coerce")
    bad = values.isna() & ~text.str.lower().isin(["nan", ""])
    if bad.any():
        raise ResultsError(f"{source}: column {column!r} holds {frame.loc[bad, column].iloc[0]!r}, not a number")
    return values.astype(float)


def _attack_label(config: Any) -> str:
    try:
        attack = config.get("attack") or {"name": "none"}
        return str(attack.get("label") or attack["name"])
    except (AttributeError, KeyError, TypeError):
        return NOT_RECORDED


def _grid_finals(directory: Path) -> Finals:
    from robust_pfl.grid import read_results

    source = directory / GRID_STORE
    try:
        raw = read_results(source, dtype=str, keep_default_na=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as error:
        raise ResultsError(f"{source}: not a readable CSV ({error})") from None
    axes = [c for c in raw.columns if c not in STORE_COLUMNS]
    raw = raw[raw["status"] == "ok"]
    if raw.empty:
        raise ResultsError(f"{source}: no finished cell with status 'ok'")
    cells = raw.drop_duplicates("cell")  # in the order appended
    keys = [c for c in axes if c in raw.columns]
    latest = cells.drop_duplicates(keys, keep="last")["cell"] if keys else cells["cell"]
    raw = raw[raw["cell"].isin(set(latest)) & (raw["final"].str.strip().str.lower() == "true")].copy()
    recorded, order = recorded_grid(directory / GRID_JSON)
    appended = list(dict.fromkeys(raw["cell"]))
    rank = {cell: index for index, cell in enumerate(dict.fromkeys([*(c for c in order if c in set(appended)),
                                                                     *appended]))}
    raw["_rank"] = raw["cell"].map(rank)
    raw = raw.sort_values("_rank", kind="stable")
    if "attack" not in raw.columns:
        raw["attack"] = raw["cell"].map(lambda cell: _attack_label((recorded.get(cell) or {}).get("config")))
    if "method" not in raw.columns:
        raw["method"] = NOT_RECORDED
    others = [c for c in axes if c not in ("method", "attack", "seed")]
    labels = ["method", "attack", *others]
    frame = pd.DataFrame({
        **{column: raw[column].astype(str) for column in labels},
        "run": raw["cell"],
        "seed": raw["seed"] if "seed" in raw.columns else "",
        "metric": raw["metric"],
        "value": _numbers(raw, "value", source),
    })
    return Finals(frame.reset_index(drop=True), labels, directory, "grid")


def recorded_grid(path: Path) -> tuple[dict[str, Any], list[str]]:
    """``grid.json``'s cells and order (empty where it is absent or unreadable: the
    order is then the store's, the attack not recorded)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cells = data.get("cells") or {}
        order = [str(key) for key in data.get("order") or []]
        return (cells if isinstance(cells, dict) else {}), order
    except (OSError, ValueError, AttributeError, TypeError):
        return {}, []


def _run_finals(directory: Path) -> Finals:
    history, summary_path = directory / RUN_HISTORY, directory / RUN_SUMMARY
    if not summary_path.is_file():
        raise ResultsError(f"{directory}: {RUN_HISTORY} without {RUN_SUMMARY} (the run did not finish)")
    if not history.is_file():
        raise ResultsError(f"{directory}: {RUN_SUMMARY} without {RUN_HISTORY}")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ResultsError(f"{summary_path}: not a readable summary ({error})") from None
    config = summary.get("config") if isinstance(summary, dict) else None
    raw = _read_csv(history)
    missing = [c for c in HISTORY_COLUMNS if c not in raw.columns]
    if missing:
        raise ResultsError(f"{history}: not a run history (no column {', '.join(missing)}; "
                           f"found {', '.join(raw.columns) or 'no columns'})")
    if raw.empty:
        raise ResultsError(f"{history}: no rows")
    extra = [c for c in raw.columns if c not in HISTORY_COLUMNS]
    raw = raw.copy()
    raw["_round"] = _numbers(raw, "round", history)
    run_columns = [*extra, "method", "seed"]
    last = raw.groupby([*run_columns, "metric"], sort=False)["_round"].transform("max")
    raw = raw[raw["_round"] == last]
    raw = raw.drop_duplicates([*run_columns, "metric"], keep="last")
    methods = config_methods(config)
    rank = {method: index for index, method in enumerate(dict.fromkeys([*methods, *raw["method"]]))}
    raw = raw.assign(_rank=raw["method"].map(rank)).sort_values("_rank", kind="stable")
    attack = _attack_label(config) if isinstance(config, dict) else NOT_RECORDED
    run = raw["method"]
    for column in [*extra, "seed"]:
        run = run + "|" + raw[column]
    labels = ["method", "attack", *extra]
    frame = pd.DataFrame({
        "method": raw["method"], "attack": attack, **{column: raw[column] for column in extra},
        "run": run, "seed": raw["seed"], "metric": raw["metric"], "value": _numbers(raw, "value", history),
    })
    return Finals(frame.reset_index(drop=True), labels, directory, "run")


def config_methods(config: Any) -> list[str]:
    """The method labels (else names) of a config recorded as JSON, in its order (none
    where it records no methods): the order tables and figures show them in."""
    if not isinstance(config, dict):
        return []
    return [str(m.get("label") or m.get("name")) for m in config.get("methods") or [] if isinstance(m, dict)]


# -- the tables -------------------------------------------------------------------------------
def choose_metrics(available: Iterable[str], metrics: Sequence[str] | None, source: Any) -> list[str]:
    """``metrics`` if each is available, else the default: ``test_accuracy``, else
    ``accuracy``, else ``param_error``, else the first metric that is no bookkeeping;
    followed by ``attack_success_rate`` where a backdoor attack recorded it."""
    available = list(dict.fromkeys(available))
    if metrics:
        unknown = [m for m in metrics if m not in available]
        if unknown:
            raise ResultsError(f"--metric {', '.join(unknown)}: not in {source}; available: {', '.join(available)}")
        return list(dict.fromkeys(metrics))
    for metric in (*PREFERRED_METRICS, *[m for m in available if m not in BOOKKEEPING_METRICS], *available):
        if metric in available:
            return list(dict.fromkeys([metric, *[m for m in COMPANION_METRICS if m in available]]))
    raise ResultsError(f"{source}: no metric")


def _as_finals(results: str | Path | Finals) -> Finals:
    return results if isinstance(results, Finals) else load_finals(results)


def _percent(values: pd.Series, metric: str) -> bool:
    """Whether a metric is an accuracy held as a fraction (shown in percent)."""
    finite = values[values.map(math.isfinite)]
    named = "accuracy" in metric or metric in PERCENT_METRICS
    return named and bool(finite.between(0.0, 1.0).all())


def _ranked(frame: pd.DataFrame, labels: list[str], order: pd.DataFrame | Mapping[str, Iterable[str]]) -> pd.DataFrame:
    """``frame`` sorted by its labels, each in the order of first appearance in
    ``order[label]`` (method first, then attack, then the other axes)."""
    if frame.empty or not labels:
        return frame.reset_index(drop=True)
    keys = []
    for column in labels:
        rank = {value: index for index, value in enumerate(dict.fromkeys(order[column]))}
        keys.append(frame[column].map(rank).fillna(len(rank)))
    positions = sorted(range(len(frame)), key=lambda i: tuple(key.iloc[i] for key in keys))
    return frame.iloc[positions].reset_index(drop=True)


def summary_table(results: str | Path | Finals, metrics: Sequence[str] | None = None, *,
                  all_labels: bool = False) -> pd.DataFrame:
    """The final metrics of a grid store or a run, one row per method × attack × every
    other label that varies (``all_labels``: every label, varying or not), rows in the
    grid's / config's order.

    Columns: the labels, then per metric ``<metric>_mean``, ``<metric>_sd`` (over
    seeds, ``ddof=1``; NaN for one seed) and ``<metric>_n`` (the runs averaged), in
    the stored units.  ``metrics``: default ``test_accuracy`` (else ``accuracy``, else
    ``param_error``).  ``frame.attrs`` holds ``source``, ``kind``, ``labels``,
    ``metrics`` and ``percent`` (the metrics :func:`render` shows in percent).
    """
    finals = _as_finals(results)
    chosen = choose_metrics(finals.metrics, metrics, finals.source)
    labels = list(finals.labels) if all_labels else shown_labels(finals.frame, finals.labels)
    return _table(finals, chosen, labels)


def _table(finals: Finals, chosen: Sequence[str], labels: list[str]) -> pd.DataFrame:
    """:func:`summary_table`'s frame; a row for every label group of ``finals`` (a
    metric it lacks has NaN statistics and count 0)."""
    frame = finals.frame[finals.frame["metric"].isin(chosen)]
    table = finals.frame.groupby(labels, sort=False, dropna=False).size().reset_index()[labels]
    for metric in chosen:
        values = frame[frame["metric"] == metric].groupby(labels, sort=False, dropna=False)["value"]
        stats = values.agg(["mean", lambda v: v.std(ddof=1), "count"]).reset_index()
        stats.columns = [*labels, f"{metric}_mean", f"{metric}_sd", f"{metric}_n"]
        table = table.merge(stats, on=labels, how="left")
        table[f"{metric}_n"] = table[f"{metric}_n"].fillna(0).astype(int)
    table = _ranked(table, labels, finals.frame)
    table.attrs.update(
        source=str(finals.source), kind=finals.kind, labels=labels, metrics=list(chosen),
        percent=[m for m in chosen if _percent(frame.loc[frame["metric"] == m, "value"], m)],
    )
    return table


def shown_labels(frame: pd.DataFrame, labels: Sequence[str]) -> list[str]:
    """``method``, ``attack`` and the other labels that take more than one value."""
    return [c for c in labels if c in ("method", "attack") or frame[c].nunique(dropna=False) > 1]


def compare_tables(results: str | Path | Finals, other: str | Path | Finals,
                   metrics: Sequence[str] | None = None, *, match: Sequence[str] | None = None,
                   across: Sequence[str] | None = None) -> pd.DataFrame:
    """:func:`summary_table` of ``results`` and of ``other``, matched row by row on
    their labels: per metric ``<metric>_mean``, ``_sd``, ``_n`` (``results``),
    ``<metric>_other_mean``, ``_other_sd``, ``_other_n`` and ``<metric>_diff`` (mean
    minus other mean), and ``present``: ``both``, ``this only`` or ``other only``.

    By default rows match on every label, so two runs under different attacks share no
    row.  ``across`` names labels *not* to match on (``["attack"]``: each method of
    one run against the same method of the other, whatever their attacks); ``match``
    names the only labels to match on (every other label is compared across).  A label
    compared across keeps each side's value, in ``<label>`` and ``<label>_other``; a
    row meets every row of the other side with the same matched labels.  ``seed``
    (averaged over otherwise) may be named in either: the rows are then per seed.

    Labels match by value; a label column that only one side has is left out where it
    is constant there, and otherwise kept (the other side's rows then hold ``""``
    there, so they match none).  Rows: ``results``' order, then those only in
    ``other``."""
    this, that = _as_finals(results), _as_finals(other)
    available = [*this.metrics, *[m for m in that.metrics if m not in this.metrics]]
    chosen = choose_metrics(available, metrics, f"{this.source} or {that.source}")
    named = _compared_labels(this, that, match, across)
    if "seed" in named:  # matched or compared seed by seed: a label, not averaged over
        this, that = (replace(finals, labels=[*finals.labels, "seed"]) for finals in (this, that))
    tables = [_table(finals, chosen, list(finals.labels)) for finals in (this, that)]
    one_sided = [(table, finals, [c for c in finals.labels if c not in other_side.labels])
                 for table, finals, other_side in ((tables[0], this, that), (tables[1], that, this))]
    for index, (table, finals, only) in enumerate(one_sided):
        constant = [c for c in only if finals.frame[c].nunique(dropna=False) <= 1 and c not in named]
        tables[index] = table.drop(columns=constant)
    labels = [c for c in this.labels if c in tables[0].columns]
    labels += [c for c in that.labels if c in tables[1].columns and c not in labels]
    compared = [c for c in labels if c not in match] if match else [c for c in labels if c in (across or ())]
    keys = [c for c in labels if c not in compared]
    for table in tables:
        for column in labels:
            if column not in table.columns:
                table[column] = ""
    values = [c for m in chosen for c in (f"{m}_mean", f"{m}_sd", f"{m}_n")]
    left = tables[0][keys + compared + values]
    renamed = {**{f"{m}_{s}": f"{m}_other_{s}" for m in chosen for s in ("mean", "sd", "n")},
               **{c: f"{c}_other" for c in compared}}
    right = tables[1][keys + compared + values].rename(columns=renamed)
    if keys:
        merged = left.merge(right, on=keys, how="outer", indicator=True, sort=False)
    else:  # nothing matched on: every row meets every row
        merged = left.merge(right, how="cross").assign(_merge="both")
    merged["present"] = merged.pop("_merge").map(
        {"both": "both", "left_only": "this only", "right_only": "other only"}).astype(str)
    for column in [c for c in merged.columns if c in renamed.values() or c in compared]:
        if merged[column].dtype == object:
            merged[column] = merged[column].fillna("")
    for metric in chosen:
        merged[f"{metric}_diff"] = merged[f"{metric}_mean"] - merged[f"{metric}_other_mean"]
        for column in (f"{metric}_n", f"{metric}_other_n"):
            merged[column] = merged[column].fillna(0).astype(int)
    other_columns = [f"{c}_other" for c in compared]
    orders = [{c: (finals.frame[c] if c in finals.frame.columns else [""]) for c in labels} for finals in (this, that)]
    ranks = {**orders[0], **{f"{c}_other": orders[1][c] for c in compared}}
    first = merged[merged["present"] != "other only"]
    second = merged[merged["present"] == "other only"]
    merged = pd.concat([_ranked(first, [*keys, *compared, *other_columns], ranks),
                        _ranked(second, [*keys, *other_columns], {**ranks, **orders[1]})], ignore_index=True)
    pairs = [c for column in compared for c in (column, f"{column}_other")]
    columns = [*keys, *pairs, *[f"{m}_{s}" for m in chosen for s in ("mean", "sd", "n", "other_mean", "other_sd",
                                                                       "other_n", "diff")], "present"]
    merged = merged[columns]
    both = pd.concat([this.frame, that.frame], ignore_index=True)
    shown = [c for c in keys if c in ("method", "attack") or merged[c].nunique(dropna=False) > 1]
    merged.attrs.update(
        source=str(this.source), other=str(that.source), kind="compare", labels=[*shown, *pairs], keys=keys,
        across=compared, metrics=chosen,
        percent=[m for m in chosen if _percent(both.loc[both["metric"] == m, "value"], m)],
    )
    return merged


def _compared_labels(this: Finals, that: Finals, match: Sequence[str] | None,
                     across: Sequence[str] | None) -> list[str]:
    """The labels ``match`` and ``across`` name, checked: one of them at most, each a
    label of either side or ``seed``, ``match`` not empty."""
    if match is not None and across is not None:
        raise ResultsError("give --match (the labels to match on) or --across (the labels not to), not both")
    known = list(dict.fromkeys([*this.labels, *that.labels, "seed"]))
    named = list(match if match is not None else across or ())
    unknown = [name for name in named if name not in known]
    if unknown:
        option = "--match" if match is not None else "--across"
        raise ResultsError(f"{option} {', '.join(unknown)}: not a label of {this.source} or {that.source}; "
                           f"labels: {', '.join(known)}")
    if match is not None and not named:
        raise ResultsError("--match needs at least one label (" + ", ".join(known) + ")")
    return named


# -- rendering --------------------------------------------------------------------------------
def _number(value: float, percent: bool, spread: bool = False, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    if not math.isfinite(value):
        return ("+" if signed and value > 0 else "") + ("inf" if value > 0 else "-inf")
    if percent:
        value *= 100.0
        return f"{value:+.1f}" if signed else f"{value:.1f}"
    if spread:
        return f"{value:.2g}"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def cell_text(mean: float, sd: float, n: int, percent: bool) -> str:
    """``mean ± sd``, ``mean (n=1)`` for one run, ``–`` for none."""
    if not n:
        return MISSING
    text = _number(mean, percent)
    if n == 1:
        return f"{text} (n=1)"
    return f"{text} ± {_number(sd, percent, spread=True)}"


def metric_header(metric: str, percent: bool) -> str:
    return f"{metric} (%)" if percent else metric


def display_table(frame: pd.DataFrame) -> tuple[list[str], list[list[str]], list[str], list[str]]:
    """What :func:`render` shows of a :func:`summary_table` or :func:`compare_tables`
    frame: the header, the rows as text, which columns are labels (``l``) and
    numbers (``r``), and the notes under the table."""
    labels, metrics = list(frame.attrs["labels"]), list(frame.attrs["metrics"])
    percent = set(frame.attrs.get("percent", []))
    compare = frame.attrs.get("kind") == "compare"
    other_sides = {f"{c}_other": f"{c} other" for c in frame.attrs.get("across", [])}
    header = [other_sides.get(c, c) for c in labels]
    for metric in metrics:
        name = metric_header(metric, metric in percent)
        header += [name, f"{name} other", f"Δ {name}"] if compare else [name]
    one_sided = bool(compare and (frame["present"] != "both").any())
    if one_sided:
        header.append("only in")
    rows = []
    for _, row in frame.iterrows():
        shown = [MISSING if str(row[c]) == "" else str(row[c]) for c in labels]
        for metric in metrics:
            is_percent = metric in percent
            shown.append(cell_text(row[f"{metric}_mean"], row[f"{metric}_sd"], row[f"{metric}_n"], is_percent))
            if compare:
                shown.append(cell_text(row[f"{metric}_other_mean"], row[f"{metric}_other_sd"],
                                       row[f"{metric}_other_n"], is_percent))
                both = row[f"{metric}_n"] and row[f"{metric}_other_n"]
                shown.append(_number(row[f"{metric}_diff"], is_percent, signed=True) if both else MISSING)
        if one_sided:
            shown.append({"both": "", "this only": "this", "other only": "other"}[row["present"]])
        rows.append(shown)
    align = ["l"] * len(labels) + ["r"] * (len(header) - len(labels) - one_sided) + ["l"] * one_sided
    counts = [int(n) for m in metrics for column in ([f"{m}_n", f"{m}_other_n"] if compare else [f"{m}_n"])
              for n in frame[column] if n]
    notes = []
    if counts:
        low, high = min(counts), max(counts)
        seeds = f"{low} seed{'s' if low > 1 else ''}" if low == high else f"{low}-{high} seeds"
        notes.append(f"mean ± sd over {seeds} (sd with ddof=1; one seed: the mean and n=1)"
                     if high > 1 else "one seed per row (n=1): no sd")
    if compare:
        notes.append(f"this: {frame.attrs['source']}; other: {frame.attrs['other']}; Δ = this − other")
    else:
        notes.append(f"final values of {frame.attrs['source']}")
    return header, rows, align, notes


def render(frame: pd.DataFrame, fmt: str = "md") -> str:
    """A :func:`summary_table` or :func:`compare_tables` frame as ``md`` (a Markdown
    table and its notes), ``latex`` (a booktabs tabular, notes as comments) or
    ``csv`` (every column, unrounded, stored units)."""
    if fmt == "csv":
        return frame.to_csv(index=False)
    return render_cells(*display_table(frame), fmt)


def render_cells(header: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str],
                 notes: Sequence[str], fmt: str = "md") -> str:
    """Display cells as ``md`` (a Markdown table and its notes) or ``latex`` (a
    booktabs tabular, notes as comments); ``align``: ``"l"`` or ``"r"`` per column."""
    if fmt == "md":
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

        rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
        return "\n".join([line(header), rule, *map(line, rows), "", *notes]) + "\n"
    if fmt == "latex":
        def line(cells: Sequence[str]) -> str:
            return " & ".join(map(latex_escape, cells)) + r" \\"

        body = [r"\begin{tabular}{" + "".join(align) + "}", r"\toprule", line(header), r"\midrule",
                *map(line, rows), r"\bottomrule", r"\end{tabular}"]
        return "\n".join([*body, *(f"% {note}" for note in notes)]) + "\n"
    raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")


LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
    "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "Δ": r"$\Delta$",
    "−": "$-$", "–": "--",
}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(char, char) for char in text)
