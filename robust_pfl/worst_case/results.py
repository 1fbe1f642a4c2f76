"""``robust-pfl results`` on a benchmark's output directory: its worst-case table
(Markdown, LaTeX or CSV) with intervals and the worst attack, read back from the
files the benchmark wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from robust_pfl.summaries import ResultsError
from robust_pfl.worst_case.allocation import Rule
from robust_pfl.worst_case.report import render_worst_case
from robust_pfl.worst_case.runner import RECORD


def is_benchmark(path: str | Path) -> bool:
    """Whether ``path`` is a benchmark's output directory (it holds :data:`RECORD`)."""
    return Path(path).is_dir() and (Path(path) / RECORD).is_file()


#: The columns of a benchmark's tables that hold labels the file wrote (a defense, a
#: level, a candidate, an attack): read back as written, never as a number or missing.
LABEL_COLUMNS = ("method", "heterogeneity", "candidate", "attack", "worst_attack", "decided_by")


def read_table(path: Path) -> pd.DataFrame:
    """A table the benchmark wrote, its :data:`LABEL_COLUMNS` as the strings written (a
    defense labelled ``NA`` or a level labelled ``1`` stay text; an empty cell, which no
    label is, stays missing) and the other columns as pandas reads them."""
    table = pd.read_csv(path)
    labels = [column for column in LABEL_COLUMNS if column in table.columns]
    if labels:
        text = pd.read_csv(path, usecols=labels, dtype=str, keep_default_na=False)
        for column in labels:
            table[column] = text[column].where(text[column] != "", None)
    return table


def worst_case_text(path: str | Path, fmt: str = "md") -> str:
    """The worst-case table of the benchmark written to ``path``, in ``fmt``."""
    path = Path(path)
    try:
        record = json.loads((path / RECORD).read_text(encoding="utf-8"))
        table = read_table(path / "worst_case.csv")
        skipped = read_table(path / "not_applicable.csv")
    except (OSError, ValueError) as error:
        raise ResultsError(f"{path}: not a finished benchmark's output ({error})") from None
    rule = record.get("rule")
    rule = None if rule is None else Rule(tuple(rule["seeds"]), rule["initial"], rule["racing"], rule["confidence"],
                                          rule.get("compare"))
    return render_worst_case(table, record["fractions"], record["heterogeneity"], record["defenses"], skipped, rule,
                             fmt)
