"""What makes a "holds" evidence: a negative control beside every check that can hold,
and the slack between the bound and the error.

A check that cannot fail is not evidence.  Every statement that can be reported as
holding runs, in the same check and on the same instances, a *negative control*: a
broken algorithm (no clustering, the wrong clustering, a frozen model, Byzantine rows
admitted) or a violated hypothesis, chosen so that a true bound must be violated by
it.  :func:`finalised` (applied to every registered check by
:func:`theory_checks.statements.registry.register`) then decides the reported status:

* ``holds`` / ``holds_with_constant`` only when the control, and every clustering
  control of a statement about clustering (no clustering, a wrong partition, a random
  assignment), violates the claim; otherwise **vacuous**: the bound does not tell the
  algorithm from a broken one on the instances run (a check without a control is
  vacuous too);
* **loose** when, moreover, the bound is more than :data:`LOOSE_FACTOR` times the
  error at every point measured (the claim is true there and says little).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from theory_checks.fitting import fit_mean_power_law
from theory_checks.types import CheckResult, NegativeControl, PowerLaw
from theory_checks.verdicts import rate_verdict

#: A holding bound more than this many times the error at every point is ``loose``.
LOOSE_FACTOR = 100.0
HOLDING = ("holds", "holds_with_constant")


def margin_control(description: str, margins: np.ndarray, what: str, tolerance: float,
                   details: dict[str, Any] | None = None) -> NegativeControl:
    """The control of an exact claim: the claim's margins (below ``-tolerance`` is a
    violation, as for the real instances) on instances that break a hypothesis."""
    margins = np.asarray(margins, float).ravel()
    worst = float(margins.min()) if margins.size else float("inf")
    violated = bool(margins.size) and worst < -tolerance
    return NegativeControl(description, worst, violated, statistic=f"smallest {what}",
                           details={"instances": int(margins.size),
                                    "violations": int((margins < -tolerance).sum()), **(details or {})})


def rate_control(description: str, values: Any, errors: np.ndarray, rhs: Any, claimed: float, *,
                 variable: str = "T", real_ratio: float | None = None, seed: int = 0,
                 bounded: bool = False) -> NegativeControl:
    """The control of a rate: the control's measurements ``errors[len(values),
    repeats]`` against the same right-hand sides ``rhs`` and claimed exponent, judged
    by the rule every rate check uses (:func:`theory_checks.verdicts.rate_verdict`):
    violated when its error / bound ratio grows without limit along ``variable``."""
    errors = np.asarray(errors, float)
    law = fit_mean_power_law(values, errors, seed=seed)
    means = errors.mean(axis=1)
    return _judged(description, law, means, rhs, claimed, variable, real_ratio, bounded)


def _judged(description: str, law: PowerLaw, means: np.ndarray, rhs: Any, claimed: float, variable: str,
            real_ratio: float | None, bounded: bool) -> NegativeControl:
    verdict = rate_verdict(law, claimed, bounded)
    ratios = np.asarray(means, float) / np.asarray(rhs, float)
    return NegativeControl(description, float(ratios[-1]), verdict.verdict == "fails",
                           statistic=f"error / bound at the largest {variable}", real=real_ratio,
                           details={"variable": variable, "exponent": law.exponent, "interval": [law.low, law.high],
                                    "claimed": claimed, "verdict": verdict.verdict, "direction": verdict.direction,
                                    "bounded": bounded, "means": [float(m) for m in means],
                                    "ratios": [float(r) for r in ratios]})


def control_against(control: NegativeControl, rhs: Any, claimed: float, real_ratio: float | None = None
                    ) -> NegativeControl:
    """A rate control (:func:`rate_control`) judged again against another bound: the
    right-hand sides ``rhs`` and ``claimed`` exponent along the same variable (the
    measurements and their fitted exponent kept)."""
    details = control.details
    low, high = details["interval"]
    law = PowerLaw(details["exponent"], low, high, 1.0)
    return _judged(control.description, law, np.asarray(details["means"]), rhs, claimed, details["variable"],
                   real_ratio, details["bounded"])


def ratio_slack(ratios: list[float] | np.ndarray, at_largest: float, where: str = "") -> dict[str, Any]:
    """The slack of a bound read as ``error / bound`` per point: the largest ratio (the
    constant the data need), the ratio at the largest budget, and whether the bound
    is more than :data:`LOOSE_FACTOR` times the error at every point."""
    ratios = np.asarray(ratios, float).ravel()
    finite = ratios[np.isfinite(ratios)]
    largest = float(finite.max()) if finite.size else float("nan")
    return {"largest_ratio": largest, "ratio_at_largest_budget": float(at_largest), "at": where,
            "loose": bool(finite.size == ratios.size and finite.size and largest < 1.0 / LOOSE_FACTOR)}


def finalised(result: CheckResult) -> CheckResult:
    """``result`` with its status decided by its negative control and its slack (see
    the module docstring); statuses other than a "holds" pass through unchanged."""
    if result.status not in HOLDING:
        return result
    control = result.negative_control
    unviolated = [c for c in (control, *result.clustering_controls) if c is not None and not c.violated]
    if control is None or unviolated:
        reason = ("no negative control was run" if control is None else "; ".join(
            f"the control {c.description} meets the claim too: {c.statistic} {c.ratio:.3g}"
            + ("" if c.real is None else f" against {c.real:.3g}") for c in unviolated))
        return dataclasses.replace(result, status="vacuous",
                                   evidence=f"{result.evidence}; vacuous: {reason}".lstrip("; "))
    if result.slack.get("loose"):
        return dataclasses.replace(
            result, status="loose",
            evidence=f"{result.evidence}; loose: the bound is over {LOOSE_FACTOR:g}x the error at every point "
                     f"(largest error / bound {result.slack['largest_ratio']:.3g})")
    return result
