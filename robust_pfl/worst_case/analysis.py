"""The worst case over attacks, from a benchmark's finished cells.

Input: a *finals* frame, one row per finished cell, with the axis columns
(:data:`~robust_pfl.worst_case.plan.COLUMNS`), ``section`` (clean, attack, backdoor)
and the final honest metrics (``test_accuracy``, ``validation_accuracy``,
``worst_cluster_test_accuracy``, ``attack_success_rate`` for backdoors), fractions in
[0, 1].

1. **Tuning** (:func:`tune`): per defense, heterogeneity level and Byzantine fraction,
   the candidate setting with the highest *worst-case validation accuracy*: for each
   candidate, the mean over seeds of the final validation accuracy under each
   robustness attack (the clean cell at fraction 0), then its minimum over the attacks.
   Ties go to the candidate listed first.  Only validation columns are read: the test
   split never chooses a setting.  Tuning is per (level, fraction) cell, as ByzFL's
   benchmark does: the step size that survives 30 % Byzantine clients is not the clean
   one, and each heatmap cell then shows what a practitioner who tunes on validation
   data at that cell gets.
2. **Worst case** (:func:`worst_case`): at the chosen setting, each attack's mean test
   accuracy over seeds with a 95 % Student-t interval (:func:`t_interval`); the worst
   attack is the one of lowest mean; the worst honest cluster is the lowest mean of
   ``worst_cluster_test_accuracy`` over the attacks; the clean accuracy is the
   defense's fraction-0 cell at the same level.
3. **Breakdown** (:func:`breakdown`): per defense and level, the largest fraction up to
   which every fraction's worst case stays within ``tolerance`` points of clean (it
   *holds*), and the first fraction where it does not (it *breaks*: too low, or not
   applicable there).
4. **Backdoors** (:func:`backdoor_worst_case`): the highest mean attack success rate
   over the backdoors at the chosen setting.
5. **Best defense** (:func:`best_defense`): per level and fraction, the defense of the
   highest worst-case accuracy.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pandas as pd
from scipy import stats

from robust_pfl.worst_case.plan import BACKDOOR, CLEAN, ROBUST

CELL = ["method", "heterogeneity", "fraction"]
#: The interval every table shows, in words.
INTERVAL = ("95% Student-t interval of the mean over seeds (t with n - 1 degrees of freedom, clipped to "
            "[0, 100]; none for one seed)")
UNIT = (0.0, 1.0)


def t_interval(values: Iterable[float], level: float = 0.95,
               bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float, float]:
    """``(mean, low, high)`` of ``values``: the Student-t interval of the mean,
    ``mean +- t_{(1 + level) / 2, n - 1} * s / sqrt(n)`` (``s`` the sample standard
    deviation), clipped to ``bounds`` (an accuracy's interval stays in [0, 1]);
    ``low = high = nan`` for fewer than two values; a non-finite value makes all
    three nan."""
    array = np.asarray(list(values), dtype=float)
    if array.size == 0 or not np.isfinite(array).all():
        return math.nan, math.nan, math.nan
    mean = float(array.mean())
    if array.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, array.size - 1) * array.std(ddof=1) / math.sqrt(array.size))
    return mean, max(mean - half, bounds[0]), min(mean + half, bounds[1])


def _per_attack(finals: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean over seeds of ``metric`` per (defense, level, fraction, candidate, attack);
    a non-finite value (a diverged run) counts as 0 accuracy."""
    values = finals[metric].where(np.isfinite(finals[metric]), 0.0)
    return (finals.assign(value=values)
            .groupby([*CELL, "candidate", "attack"], sort=False)["value"].mean().reset_index())


def tuning_rows(finals: pd.DataFrame) -> pd.DataFrame:
    """``finals``' rows that tuning reads: the clean cells and the robustness attacks."""
    return finals[finals["section"].isin([CLEAN, ROBUST])]


def tune(finals: pd.DataFrame) -> pd.DataFrame:
    """The chosen candidate per (defense, level, fraction): columns ``method``,
    ``heterogeneity``, ``fraction``, ``candidate``, ``validation_worst`` (its worst-case
    validation accuracy), ``candidates`` (how many were compared).  Reads
    ``validation_accuracy`` only (module docstring, item 1)."""
    rows = tuning_rows(finals)[[*CELL, "candidate", "attack", "seed", "validation_accuracy"]]
    if rows.empty:
        return pd.DataFrame(columns=[*CELL, "candidate", "validation_worst", "candidates"])
    per_attack = _per_attack(rows, "validation_accuracy")
    worst = per_attack.groupby([*CELL, "candidate"], sort=False)["value"].min().reset_index()
    order = {c: i for i, c in enumerate(dict.fromkeys(finals["candidate"]))}
    worst["order"] = worst["candidate"].map(order)
    worst = worst.sort_values([*CELL, "value", "order"], ascending=[True, True, True, False, True], kind="stable")
    chosen = worst.groupby(CELL, sort=False).head(1)
    counts = worst.groupby(CELL, sort=False)["candidate"].count().rename("candidates").reset_index()
    out = chosen.rename(columns={"value": "validation_worst"}).drop(columns="order").merge(counts, on=CELL)
    return out.reset_index(drop=True)


def at_chosen(finals: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """``finals``' rows at each cell's chosen candidate."""
    keys = chosen[[*CELL, "candidate"]]
    return finals.merge(keys, on=[*CELL, "candidate"], how="inner")


def worst_case(finals: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """One row per (defense, level, fraction) at the chosen candidate: ``worst``
    (worst-case mean test accuracy), ``low``/``high`` (its interval), ``worst_attack``,
    ``attacks`` (how many ran), ``seeds``, ``worst_cluster`` (lowest mean worst-cluster
    test accuracy over the attacks), ``clean`` (the fraction-0 cell's mean test
    accuracy at that level), ``candidate``."""
    rows = at_chosen(tuning_rows(finals), chosen)
    out = []
    clean = _clean(rows)
    for key, group in rows.groupby(CELL, sort=False):
        stats_by_attack = []
        for attack, runs in group.groupby("attack", sort=False):
            accuracy = runs["test_accuracy"].where(np.isfinite(runs["test_accuracy"]), 0.0)
            mean, low, high = t_interval(accuracy, bounds=UNIT)
            cluster = runs["worst_cluster_test_accuracy"] if "worst_cluster_test_accuracy" in runs else accuracy
            stats_by_attack.append((mean, attack, low, high, float(cluster.fillna(0.0).mean()), len(runs)))
        mean, attack, low, high, _, seeds = min(stats_by_attack, key=lambda s: (s[0], s[1]))
        method, level, fraction = key
        out.append({"method": method, "heterogeneity": level, "fraction": fraction, "worst": mean,
                    "low": low, "high": high, "worst_attack": attack, "attacks": len(stats_by_attack),
                    "seeds": seeds, "worst_cluster": min(s[4] for s in stats_by_attack),
                    "clean": clean.get((method, level), math.nan),
                    "candidate": group["candidate"].iloc[0]})
    return pd.DataFrame(out, columns=["method", "heterogeneity", "fraction", "worst", "low", "high", "worst_attack",
                                      "attacks", "seeds", "worst_cluster", "clean", "candidate"])


def _clean(rows: pd.DataFrame) -> dict[tuple[str, str], float]:
    clean = rows[rows["section"] == CLEAN]
    return {key: float(group["test_accuracy"].fillna(0.0).mean())
            for key, group in clean.groupby(["method", "heterogeneity"], sort=False)}


def breakdown(table: pd.DataFrame, fractions: Iterable[float], tolerance: float, chance: float = 0.0) -> pd.DataFrame:
    """Per (defense, level): ``holds_up_to``, the largest fraction ``f`` such that at
    every fraction ``<= f`` of ``fractions`` the worst case ran and stayed within
    ``tolerance`` points (accuracies in [0, 1], so ``tolerance / 100``) of clean; and
    ``breaks_at``, the first fraction where it did not (nan: it holds everywhere),
    with ``why`` ("below clean - tolerance", "not applicable", "no clean accuracy").
    ``vacuous``: the clean accuracy is within ``tolerance`` of ``chance`` (1 / classes),
    so staying near it tells a defense from one that learns nothing not at all."""
    fractions = sorted(fractions)
    out = []
    for (method, level), group in table.groupby(["method", "heterogeneity"], sort=False):
        by_fraction = {float(row.fraction): row for row in group.itertuples()}
        holds, breaks, why = math.nan, math.nan, ""
        for fraction in fractions:
            row = by_fraction.get(float(fraction))
            if row is None:
                breaks, why = fraction, "not applicable"
            elif not math.isfinite(row.clean):
                breaks, why = fraction, "no clean accuracy"
            elif not row.worst >= row.clean - tolerance / 100:
                breaks, why = fraction, f"below clean - {tolerance:g} points under {row.worst_attack}"
            else:
                holds = fraction
                continue
            break
        clean = group["clean"].dropna()
        vacuous = bool(len(clean)) and float(clean.iloc[0]) <= chance + tolerance / 100
        out.append({"method": method, "heterogeneity": level, "holds_up_to": holds, "breaks_at": breaks,
                    "why": why, "vacuous": vacuous})
    return pd.DataFrame(out, columns=["method", "heterogeneity", "holds_up_to", "breaks_at", "why", "vacuous"])


def backdoor_worst_case(finals: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """Per (defense, level, fraction) at the chosen candidate: ``success`` (the highest
    mean attack success rate over the backdoors), ``success_low``/``success_high`` (its
    interval), ``backdoor`` (which), ``accuracy`` (the mean test accuracy under it)."""
    rows = finals[finals["section"] == BACKDOOR]
    rows = at_chosen(rows, chosen) if not rows.empty else rows
    out = []
    for (method, level, fraction), group in rows.groupby(CELL, sort=False):
        best = None
        for attack, runs in group.groupby("attack", sort=False):
            mean, low, high = t_interval(runs["attack_success_rate"].fillna(1.0), bounds=UNIT)
            if best is None or mean > best[0]:
                best = (mean, low, high, attack, float(runs["test_accuracy"].fillna(0.0).mean()))
        out.append({"method": method, "heterogeneity": level, "fraction": fraction, "success": best[0],
                    "success_low": best[1], "success_high": best[2], "backdoor": best[3], "accuracy": best[4]})
    return pd.DataFrame(out, columns=["method", "heterogeneity", "fraction", "success", "success_low",
                                      "success_high", "backdoor", "accuracy"])


def best_defense(table: pd.DataFrame) -> pd.DataFrame:
    """Per (level, fraction): the defense of the highest worst-case accuracy (ties: the
    one listed first), with that accuracy."""
    out = []
    for (level, fraction), group in table.groupby(["heterogeneity", "fraction"], sort=False):
        row = group.loc[group["worst"].idxmax()] if group["worst"].notna().any() else None
        out.append({"heterogeneity": level, "fraction": fraction,
                    "best": None if row is None else row["method"],
                    "worst": math.nan if row is None else row["worst"]})
    return pd.DataFrame(out, columns=["heterogeneity", "fraction", "best", "worst"])
