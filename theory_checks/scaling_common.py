"""What every scaling study returns, and the steps they share: tidy rows of measured
errors, one power law per swept variable fitted to the mean over the repeats
(:func:`theory_checks.fitting.fit_mean_power_law`), the hidden constant of the bound
(:func:`theory_checks.bounds.fit_constant`) and the theorem's hypotheses as measured."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Sequence

import numpy as np

from theory_checks.bounds import fit_constant
from theory_checks.controls import control_against
from theory_checks.fitting import fit_mean_power_law
from theory_checks.types import FittedConstant, Hypothesis, NegativeControl, PowerLaw
from theory_checks.verdicts import rate_verdict

Budget = Literal["quick", "full"]
Row = dict[str, Any]
"""``{"variable": str, "x": float, "repeat": int, "error": float}``."""

ROW_KEYS = ("variable", "x", "repeat", "error")


@dataclass(frozen=True)
class Sweep:
    """One swept variable: its rows, the bound's right-hand side at each swept value
    (same order as ``values``) and the exponent the paper claims for it."""

    variable: str
    values: tuple[float, ...]
    errors: np.ndarray  # [len(values), repeats]
    rhs: tuple[float, ...]
    claimed: float

    def rows(self) -> list[Row]:
        return [
            {"variable": self.variable, "x": float(value), "repeat": repeat, "error": float(error)}
            for value, errors in zip(self.values, self.errors)
            for repeat, error in enumerate(errors)
        ]


@dataclass(frozen=True)
class ScalingStudy:
    """A scaling study's outcome.

    Attributes:
        theorem: ``"thm3.1"``, ``"thm3.3"`` or ``"thm3.4"``.
        rows: tidy rows ``{"variable", "x", "repeat", "error"}``.
        laws: the fitted power law of every swept variable.
        claimed: the exponent the paper claims for every swept variable.
        constant: the smallest ``C`` with mean error ``<= C * rhs`` at every swept
            value of every variable (the theorems bound expectations, so the mean over
            the repeats is compared).
        claimed_rhs: ``{"variable", "x", "mean_error", "rhs"}`` per swept value.
        settings: the sizes and parameters used.
        findings: measurements beside the sweeps (named, with a short reason).
        hypotheses: the theorem's hypotheses as measured on the study's instances.
        control: the negative control run on the same instances
            (:mod:`theory_checks.controls`), where the study has one.
    """

    theorem: str
    rows: list[Row]
    laws: dict[str, PowerLaw]
    claimed: dict[str, float]
    constant: FittedConstant
    claimed_rhs: list[dict[str, float | str]]
    settings: dict[str, Any] = field(default_factory=dict)
    findings: dict[str, Any] = field(default_factory=dict)
    hypotheses: tuple[Hypothesis, ...] = ()
    control: NegativeControl | None = None


def assemble(theorem: str, sweeps: Sequence[Sweep], settings: dict[str, Any], seed: int,
             findings: dict[str, Any] | None = None, hypotheses: Sequence[Hypothesis] = (),
             control: NegativeControl | None = None) -> ScalingStudy:
    """Rows, laws (fitted to the mean over the repeats) and the constant of ``sweeps``
    (every sweep needs two or more values and positive mean errors; the bootstrap is
    seeded by ``seed``)."""
    rows: list[Row] = []
    laws: dict[str, PowerLaw] = {}
    table: list[dict[str, float | str]] = []
    for sweep in sweeps:
        rows.extend(sweep.rows())
        laws[sweep.variable] = fit_mean_power_law(sweep.values, sweep.errors, seed=seed)
        means = sweep.errors.mean(axis=1)
        table.extend(
            {"variable": sweep.variable, "x": float(x), "mean_error": float(m), "rhs": float(b)}
            for x, m, b in zip(sweep.values, means, sweep.rhs)
        )
    constant = fit_constant([t["mean_error"] for t in table], [t["rhs"] for t in table])
    return ScalingStudy(theorem, rows, laws, {s.variable: s.claimed for s in sweeps}, constant, table,
                        settings, findings or {}, tuple(hypotheses), control)


def rejudged(study: ScalingStudy, variable: str, rhs: Sequence[float], claimed: float) -> ScalingStudy:
    """``study`` against another bound along ``variable``: right-hand sides ``rhs`` (one
    per swept value) and ``claimed`` exponent; the measurements and fitted exponents
    are kept, the constant is refitted and a rate control along ``variable`` is judged
    again (:func:`theory_checks.controls.control_against`).  What the mutation tests
    perturb: a checker whose verdict did not move with its bound would not be checking
    the bound."""
    rhs = [float(value) for value in rhs]
    positions = [index for index, entry in enumerate(study.claimed_rhs) if entry["variable"] == variable]
    if len(positions) != len(rhs):
        raise ValueError(f"{variable!r} has {len(positions)} swept values, got {len(rhs)} right-hand sides")
    table = [dict(entry) for entry in study.claimed_rhs]
    for index, value in zip(positions, rhs):
        table[index]["rhs"] = value
    constant = fit_constant([t["mean_error"] for t in table], [t["rhs"] for t in table])
    control = study.control
    if control is not None and control.details.get("variable") == variable:
        control = control_against(control, rhs, claimed)
    return replace(study, claimed={**study.claimed, variable: claimed}, constant=constant, claimed_rhs=table,
                   control=control)


def describe_laws(laws: dict[str, PowerLaw], claimed: dict[str, float], bounded: frozenset[str] = frozenset()) -> str:
    """One line: every fitted exponent with its interval beside the claimed one, and its
    verdict with the direction of any departure (:func:`theory_checks.verdicts.rate_verdict`)."""
    parts = []
    for name, law in laws.items():
        verdict = rate_verdict(law, claimed[name], name in bounded)
        parts.append(f"{name}: {law.exponent:+.2f} [{law.low:+.2f}, {law.high:+.2f}] vs claimed "
                     f"{claimed[name]:+.2f} ({verdict.verdict}: {verdict.direction})")
    return "; ".join(parts)
