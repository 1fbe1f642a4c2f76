"""Result types shared by the estimators, the bound fits and the statement checks.

Every estimate carries what it was computed from (the arg-max or arg-min instance and
the sample size), so a researcher can look at the client or pair that decided it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Extreme = Literal["max", "min", "value"]


@dataclass(frozen=True)
class Estimate:
    """One estimated constant.

    Attributes:
        name: which constant (``"A2"``, ``"Delta2"``, ``"sigma2"``, ``"L"``, ...).
        value: the estimate (``inf`` / ``nan`` only where the definition gives them).
        extreme: ``"max"`` / ``"min"`` when ``value`` is the largest / smallest of
            ``samples`` candidates (sup- or inf-type constants), ``"value"`` otherwise.
        samples: how many candidates (clients, pairs, points, models) it ran over.
        where: the instance that decided it, e.g. ``{"model": 3, "client": 7}``.
        details: anything else worth keeping (per-client values as lists, ...).
    """

    name: str
    value: float
    extreme: Extreme = "value"
    samples: int = 1
    where: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def combined(self, other: "Estimate") -> "Estimate":
        """The estimate over both candidate sets (``max`` / ``min`` estimates only; a
        chunked evaluation combines its chunks with this)."""
        if self.name != other.name or self.extreme != other.extreme or self.extreme == "value":
            raise ValueError(f"cannot combine {self.name}/{self.extreme} with {other.name}/{other.extreme}")
        pick_other = _better(other.value, self.value, self.extreme)
        best = other if pick_other else self
        return Estimate(
            self.name, best.value, self.extreme, self.samples + other.samples, dict(best.where), dict(best.details)
        )


def _better(candidate: float, current: float, extreme: Extreme) -> bool:
    """Whether ``candidate`` beats ``current`` for a ``max``/``min`` estimate.  NaN wins,
    as in torch's reductions: a combined estimate is NaN whenever a part is, whatever
    the chunking."""
    if math.isnan(current):
        return False
    if math.isnan(candidate):
        return True
    return candidate > current if extreme == "max" else candidate < current


@dataclass(frozen=True)
class FittedConstant:
    """The smallest constant ``C`` with ``measured <= C * rhs`` on every instance (an
    upper bound), or the largest ``c`` with ``measured >= c * rhs`` (a lower bound).

    ``ratios`` are ``measured / rhs`` per instance; ``decisive`` the index of the
    instance that sets the constant."""

    value: float
    kind: Literal["upper", "lower"]
    instances: int
    decisive: int
    ratios: tuple[float, ...] = ()


@dataclass(frozen=True)
class PowerLaw:
    """A fitted ``y ~ prefactor * x ** exponent`` (least squares in log-log) with a
    bootstrap confidence interval ``[low, high]`` for the exponent."""

    exponent: float
    low: float
    high: float
    prefactor: float
    level: float = 0.95
    points: int = 0

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


Verdict = Literal["holds", "fails", "inconclusive"]


@dataclass(frozen=True)
class RateVerdict:
    """What a fitted exponent says about a claimed one (:func:`theory_checks.verdicts.rate_verdict`).

    ``verdict``: ``holds`` (as claimed, or faster: the bound is loose), ``fails`` (the
    error / bound ratio grows without limit along the variable) or ``inconclusive``
    (the interval holds both the claimed rate and no decay); ``direction`` says which
    way the measurement departs from the claim, in words."""

    verdict: Verdict
    direction: str


@dataclass(frozen=True)
class Hypothesis:
    """One hypothesis of a theorem, measured on the instances a check ran.

    ``name`` cites it (``"Assumption 9"``), ``requirement`` states it as checked,
    ``measured`` / ``required`` are the compared numbers (``holds``: their comparison
    came out as the theorem needs), ``where`` the instance that decided it."""

    name: str
    requirement: str
    measured: float
    required: float
    holds: bool
    where: str = ""

    def describe(self) -> str:
        state = "met" if self.holds else "unmet"
        at = f" at {self.where}" if self.where else ""
        return f"{self.name} {state}: {self.requirement}; measured {self.measured:.3g}, needs {self.required:.3g}{at}"


@dataclass(frozen=True)
class NegativeControl:
    """A broken algorithm or a violated hypothesis, run in the same check on the same
    instances, chosen so that a true bound must be violated by it (no clustering, the
    wrong clustering, a frozen model, Byzantine rows admitted, a step above 1/L...).

    A "holds" is evidence only when its control is violated: a bound that the broken
    run also meets does not tell the algorithm from a broken one on that family
    (:func:`theory_checks.controls.finalised` turns such a status into ``vacuous``).

    Attributes:
        description: what was broken, in words.
        ratio: the control's value of ``statistic`` (for a rate, its error / bound
            ratio at the largest budget; for an exact claim, its smallest margin).
        violated: whether the control violates the claim by the check's own rule (a
            rate: its ratio grows without limit along the swept variable; an exact
            claim: a margin below the tolerance).
        statistic: what ``ratio`` measures.
        real: the same statistic for the real algorithm (shown beside the control's).
        details: anything else the control measured (its exponent, its ratios).
    """

    description: str
    ratio: float
    violated: bool
    statistic: str = "error / bound at the largest budget"
    real: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


Status = Literal["holds", "holds_with_constant", "loose", "vacuous", "fails", "inconclusive", "hypotheses_unmet"]


@dataclass(frozen=True)
class CheckResult:
    """What a statement check found.

    * ``holds``: true on every instance tried (``instances``, with ``worst_slack``:
      the smallest ``rhs - lhs`` or relative margin seen; >= 0 up to rounding).
    * ``holds_with_constant``: a bound with a hidden constant; ``constant`` is the
      fitted one, ``exponents`` maps a variable name to ``(fitted PowerLaw, claimed
      exponent)``.
    * ``fails``: ``counterexample`` is the smallest instance found (after shrinking),
      with the two sides of the claim evaluated on it; for a rate, the family along
      which the error / bound ratio grows, every instance of it meeting the
      theorem's hypotheses.
    * ``inconclusive``: a rate whose measurements cannot tell the claimed decay from
      none (``verdicts`` says which variable).
    * ``hypotheses_unmet``: some of ``hypotheses`` do not hold on the instances run,
      so the measurements decide nothing about the theorem.
    * ``vacuous``: the checks found no violation, but ``negative_control`` (a broken
      algorithm or violated hypothesis) did not violate the claim either: the bound
      does not tell the algorithm from a broken one on the instances run.
    * ``loose``: holds with a violated control, but the bound is more than
      :data:`theory_checks.controls.LOOSE_FACTOR` times the error at every point.

    ``negative_control`` is the control's measurement (required for a "holds");
    ``slack`` the constant and the error / bound ratio at the largest budget.
    ``clustering_controls`` are, for a statement about a clustering algorithm, the
    algorithm without its clustering (no clustering, a wrong partition, a random
    assignment), each of which must violate the claim too.

    ``hypotheses`` are the theorem's hypotheses as measured; ``verdicts`` the verdict
    of every fitted exponent.  ``evidence`` is one line for the report's table;
    ``figures`` lists files written.
    """

    statement: str
    status: Status
    instances: int = 0
    worst_slack: float | None = None
    constant: FittedConstant | None = None
    exponents: dict[str, tuple[PowerLaw, float]] = field(default_factory=dict)
    counterexample: dict[str, Any] | None = None
    evidence: str = ""
    figures: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    hypotheses: tuple[Hypothesis, ...] = ()
    verdicts: dict[str, RateVerdict] = field(default_factory=dict)
    negative_control: NegativeControl | None = None
    slack: dict[str, Any] = field(default_factory=dict)
    clustering_controls: tuple[NegativeControl, ...] = ()

    def unmet(self) -> list[Hypothesis]:
        """The hypotheses that do not hold."""
        return [hypothesis for hypothesis in self.hypotheses if not hypothesis.holds]

    def disagreements(self) -> list[str]:
        """Variables whose claimed exponent lies outside the fitted interval."""
        return [name for name, (law, claimed) in self.exponents.items() if not law.contains(claimed)]
