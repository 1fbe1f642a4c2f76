"""A threshold-clustering defense's breaks read against Werner et al.'s Thm 3.1 (the
guarantee of one Threshold-Clustering step): was the run inside the theorem's
hypotheses, so that the break contradicts the guarantee, or outside them?

For every *breaks* verdict of FC, MC, Myopic or PFL-TC, the benchmark makes one more
run of the breaking cell (its chosen candidate, the attack that decided it, the first
seed) with the diagnostics on: ``record_balls`` (what each centre's ball holds,
:mod:`defenses.ball_diagnostics`) and the ``[theory]`` tracker's estimates of the
constants (:mod:`theory_checks.tracking`: ``Delta`` and ``sigma`` of the gradients for
FC and Myopic, of the momenta for MC and PFL-TC).  At the run's end it reads:

* ``delta`` = ``n_i / N`` (a cluster's honest clients among all) and ``beta`` = ``B / N``:
  Thm 3.1 assumes ``beta_i <~ delta_i``;
* the **Byzantine ratio inside a ball**: the largest count of Byzantine messages in a
  centre's ball over the honest messages of its own cluster in it.  An attacker at the
  ball's edge moves the centre by ``(beta / delta) tau``; the guarantee needs the ratio
  below 1 (below a constant the paper leaves unspecified);
* the **radius** the run used (the median of its balls') against the theorem's
  ``tau* = sqrt(delta sigma Delta)`` (constant unspecified);
* **separation**: ``Delta delta / sigma``, which Thm 3.1 assumes ``>~ 1``.

The reading is *inside the hypotheses* when ``beta <= delta``, the in-ball ratio is
below 1, the radius is within a factor :data:`RADIUS_FACTOR` of ``tau*`` and the
separation is at least 1; *outside* when a measured one fails, naming each; and
*undetermined* when none fails but one could not be measured (NaN: the diagnostic run
recorded no balls or no tracker rows).
With the constants unspecified, "inside" reads every ``<~`` as ``<=`` with constant 1.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd

from robust_pfl.worst_case.plan import ComboKey, Plan

#: The defenses that cluster with Threshold-Clustering (Alg. 3).
THRESHOLD_CLUSTERING = frozenset({"fc", "mc", "myopic", "pfl_tc"})
#: Those whose clustered messages are momenta (the theory tracker's ``momentum`` estimates).
MOMENTA = frozenset({"mc", "pfl_tc"})
#: How far the run's radius may be from the theorem's and still count as its radius.
RADIUS_FACTOR = 10.0
#: The candidate label of a diagnostic run.
DIAGNOSTIC = "theorem diagnostic"
#: Measurements along a diagnostic run.
MEASUREMENTS = 5


@dataclass(frozen=True)
class Diagnostic:
    """One breaking cell's diagnostic run: the combination it repeats and its own key."""

    breaking: ComboKey
    key: ComboKey
    payload: dict[str, Any]


def diagnostics(plan: Plan, breaks: Mapping[ComboKey, str]) -> list[Diagnostic]:
    """The diagnostic runs of the breaking cells ``breaks`` (combination -> method
    name) whose method clusters by thresholds."""
    out = []
    for key, name in breaks.items():
        if name not in THRESHOLD_CLUSTERING or key not in plan.combos:
            continue
        config = plan.combos[key].config
        payload = copy.deepcopy(config.model_dump(exclude={"plugins"}))
        payload["plugins"] = config.plugins
        rounds = config.rounds
        every = max(1, rounds // MEASUREMENTS)
        payload["seeds"] = [plan.seeds[0]]
        payload["eval_every"] = every
        payload["methods"][0]["record_balls"] = True
        payload["theory"] = {"estimate": ["Delta", "sigma", *(["momentum"] if name in MOMENTA else [])],
                             "every": every, "budget": math.inf}
        method, candidate, level, fraction, attack = key
        out.append(Diagnostic(key, (method, f"{candidate} ({DIAGNOSTIC})", level, fraction, attack), payload))
    return out


def readings(finals: pd.DataFrame, items: list[Diagnostic], plan: Plan) -> pd.DataFrame:
    """One row per diagnostic run finished in ``finals`` (its final metrics by
    column): the hypotheses' quantities and the reading (module docstring)."""
    rows = []
    by_key = {tuple(r[c] for c in ("method", "candidate", "heterogeneity", "fraction", "attack")): r
              for r in finals.to_dict("records")}
    for item in items:
        found = by_key.get(item.key)
        if found is None:
            continue
        combo = plan.combos[item.breaking]
        name = combo.config.methods[0].name
        clients, byzantine = combo.n_clients, combo.n_byzantine
        delta = combo.config.task.clients_per_cluster / clients
        beta = byzantine / clients
        prefix = "theory_momentum_" if name in MOMENTA else "theory_"
        sigma2 = found.get(f"{prefix}sigma2" if name in MOMENTA else "theory_sigma2_batch", math.nan)
        separation2 = found.get(f"{prefix}Delta2", math.nan)
        sigma, separation = _root(sigma2), _root(separation2)
        theorem_radius = math.sqrt(delta * sigma * separation) if sigma * separation >= 0 else math.nan
        radius = found.get("ball_radius", math.nan)
        ratio = found.get("ball_byzantine_ratio", math.nan)
        # NaN (not measured) stays NaN, so that it is named, never read as a pass
        factor = radius / theorem_radius if theorem_radius > 0 else (math.inf if theorem_radius == 0 else math.nan)
        spread = separation * delta / sigma if sigma > 0 else (math.inf if sigma == 0 else math.nan)
        checks = ((ratio, ratio < 1, f"Byzantine ratio in a ball {ratio:.2f} >= 1", "the Byzantine ratio in a ball"),
                  (factor, 1 / RADIUS_FACTOR <= factor <= RADIUS_FACTOR, f"radius {factor:.3g} x the theorem's",
                   "the radius against the theorem's"),
                  (spread, spread >= 1, f"separation Delta delta / sigma {spread:.2f} < 1", "the separation"))
        broken = [f"beta {beta:.2f} > delta {delta:.2f}"] if beta > delta else []
        broken += [why for value, holds, why, _ in checks if not math.isnan(value) and not holds]
        unmeasured = [name for value, _, _, name in checks if math.isnan(value)]
        rows.append({"method": item.key[0], "heterogeneity": item.key[2], "fraction": item.key[3],
                     "attack": item.key[4], "candidate": item.breaking[1], "delta": delta, "beta": beta,
                     "ball_byzantine_ratio": ratio, "ball_byzantine_share": found.get("ball_byzantine_share",
                                                                                       math.nan),
                     "radius": radius, "theorem_radius": theorem_radius, "radius_factor": factor,
                     "sigma": sigma, "Delta": separation, "separation": spread,
                     "reading": _reading(broken, unmeasured)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _reading(broken: list[str], unmeasured: list[str]) -> str:
    """Outside when a measured hypothesis fails; undetermined when none fails but one
    could not be measured (a diagnostic run without balls or tracker rows); else inside."""
    missing = f"not measured: {', '.join(unmeasured)}" if unmeasured else ""
    if broken:
        return "outside the hypotheses: " + "; ".join(broken + ([missing] if missing else []))
    if missing:
        return "undetermined: " + missing
    return ("inside the hypotheses as read here (values at the run's end, constants 1): "
            "the break is not explained by them")


COLUMNS = ["method", "heterogeneity", "fraction", "attack", "candidate", "delta", "beta", "ball_byzantine_ratio",
           "ball_byzantine_share", "radius", "theorem_radius", "radius_factor", "sigma", "Delta", "separation",
           "reading"]


def _root(value: Any) -> float:
    value = float(value) if value is not None else math.nan
    return math.sqrt(value) if math.isfinite(value) and value >= 0 else math.nan


def markdown(table: pd.DataFrame) -> str:
    """The page's section body."""
    if table.empty:
        return "No threshold-clustering defense breaks in a decided verdict here."
    lines = ["Each break of FC, MC, Myopic or PFL-TC rerun once (its chosen setting, the attack that decided it, "
             "the first seed) with the ball diagnostics and the theory tracker on; values at the run's end "
             "(robust_pfl.worst_case.theorem). Thm 3.1 assumes beta <~ delta, a ball whose Byzantine messages are "
             "fewer than its own cluster's (ratio < 1), a radius of order tau* = sqrt(delta sigma Delta) and "
             f"Delta delta / sigma >~ 1; read with constant 1 (radius: within {RADIUS_FACTOR:g}x).", "",
             "| defense | heterogeneity | f | attack | delta | beta | Byzantine ratio in a ball | radius / tau* | "
             "Delta delta / sigma | reading |", "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for row in table.itertuples():
        lines.append(f"| {row.method} | {row.heterogeneity} | {row.fraction:g} | {row.attack} | {row.delta:.2f} | "
                     f"{row.beta:.2f} | {row.ball_byzantine_ratio:.3g} | {row.radius_factor:.3g} | "
                     f"{row.separation:.3g} | {row.reading} |")
    return "\n".join(lines)
