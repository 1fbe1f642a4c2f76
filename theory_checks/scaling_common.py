"""What every scaling study returns, and the steps they share: tidy rows of measured
errors, one power law per swept variable fitted to the mean over the repeats
(:func:`theory_checks.fitting.fit_mean_power_law`), the hidden constant of the bound
(:func:`theory_checks.bounds.fit_constant`) and the theorem's hypotheses as measured."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from theory_checks.bounds import fit_constant
from theory_checks.controls import control_against
from theory_checks.fitting import fit_mean_power_law
from theory_checks.types import FittedConstant, Hypothesis, NegativeControl, PowerLaw, RateVerdict
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


Formula = Callable[[Mapping[str, np.ndarray]], np.ndarray]
"""A bound's right-hand side (its hidden constant 1) from its named arguments (``T``,
``L``, ``F0``, ``rho``, ``n``, ``separation``...), each an array over instances."""

#: How far past the sweep a formula's claimed exponent is read: decades beyond the largest value.
TAIL_DECADES = (12.0, 13.0)


def evaluate(formula: Formula, arguments: Sequence[Mapping[str, float]]) -> np.ndarray:
    """``formula`` at each of ``arguments`` (one mapping per instance, same keys)."""
    if not arguments:
        return np.empty(0)
    stacked = {key: np.array([float(entry[key]) for entry in arguments]) for key in arguments[0]}
    return np.asarray(formula(stacked), float)


def tail_exponent(formula: Formula, at: Mapping[str, float], variable: str) -> float:
    """The exponent ``formula`` claims along ``variable``: its log-slope between
    ``10^12`` and ``10^13`` times ``at[variable]`` (the other arguments as at ``at``),
    where its slowest term alone is left.  ``nan`` when the formula is not positive
    and finite there (no rate is claimed)."""
    points = float(at[variable]) * 10.0 ** np.array(TAIL_DECADES)
    arguments = {key: np.full(points.shape, float(value)) for key, value in at.items()}
    arguments[variable] = points
    values = np.asarray(formula(arguments), float)
    if not (np.all(np.isfinite(values)) and np.all(values > 0)):
        return float("nan")
    return float(np.diff(np.log(values))[0] / np.diff(np.log(points))[0])


@dataclass(frozen=True)
class BoundFormula:
    """A study's bound as a formula of named instance constants, with its arguments at
    every swept value of ``variable`` (the constants the runs measured there), so that
    another formula can be judged on the same runs (:func:`reformulated`)."""

    formula: Formula
    variable: str
    arguments: tuple[Mapping[str, float], ...]

    def claimed(self) -> float:
        """The exponent the formula claims along ``variable`` (:func:`tail_exponent`)."""
        return tail_exponent(self.formula, self.arguments[-1], self.variable)


#: A sweep whose exponent interval reaches this far above the claimed exponent cannot
#: see a bound missing a first power of its constant: its "holds" is inconclusive.
UNSEEN_POWER = 1.0


@dataclass(frozen=True)
class ConstantSweep:
    """One constant of the instance (``sigma``, ``F0``, ``L``, ``n``...) swept over three
    or more values at one horizon, beside the sweep in ``T``.  A bound with a hidden
    absolute constant claims the same constant for every admissible instance, so along
    each constant the error must follow the bound's own dependence on it: the rule of
    every rate (:func:`theory_checks.verdicts.rate_verdict`) with the exponent the
    formula claims along the constant (:func:`tail_exponent`, its slowest term as the
    constant grows), a variable that the hypotheses bound (``bounded``) never failing
    by growth.

    Where the swept size is not itself one of the bound's arguments but moves several
    of them at once (``covarying``: a data scale that moves every measured constant),
    no one exponent of the formula is its claim; the sweep is then judged by the ratio
    error / bound itself, which one hidden constant needs flat: its exponent along the
    size against 0, by the same rule.

    ``key`` is the constant's name among the bound's arguments (for a ``covarying``
    sweep, the size's name in ``arguments``), ``arguments`` those arguments at each
    value, ``admissible`` whether the theorem's hypotheses held there (only those
    instances count), ``rhs`` the bound and ``claimed`` its exponent (0 for the ratio
    of a ``covarying`` sweep)."""

    variable: str
    key: str
    values: tuple[float, ...]
    errors: np.ndarray  # [len(values), repeats]
    arguments: tuple[Mapping[str, float], ...]
    admissible: tuple[bool, ...]
    rhs: tuple[float, ...]
    claimed: float
    bounded: bool = False
    covarying: bool = False

    @classmethod
    def of(cls, variable: str, key: str, values: Sequence[float], errors: np.ndarray,
           arguments: Sequence[Mapping[str, float]], admissible: Sequence[bool], formula: Formula,
           bounded: bool = False, covarying: bool = False) -> "ConstantSweep":
        """The sweep with ``formula`` evaluated at its instances and its claimed exponent."""
        sweep = cls(variable, key, tuple(float(v) for v in values), np.asarray(errors, float), tuple(arguments),
                    tuple(bool(a) for a in admissible), (), float("nan"), bounded, covarying)
        return sweep.with_formula(formula)

    def with_formula(self, formula: Formula) -> "ConstantSweep":
        """This sweep judged against ``formula``: its values and claimed exponent."""
        claimed = 0.0 if self.covarying else tail_exponent(formula, self.arguments[-1], self.key)
        return replace(self, rhs=tuple(float(v) for v in evaluate(formula, self.arguments)), claimed=claimed)

    def used(self) -> np.ndarray:
        return np.array(self.admissible, bool)

    def law(self, seed: int, of_ratio: bool = False) -> PowerLaw | None:
        """The power law of the error (``of_ratio``: of error / bound) along the constant
        over its admissible values, fitted to the mean over the repeats; ``None`` with
        fewer than two, or (``of_ratio``) where the bound is not positive."""
        used, rhs = self.used(), np.array(self.rhs, float)
        if used.sum() < 2 or (of_ratio and np.any(rhs[used] <= 0)):
            return None
        measured = self.errors[used] / rhs[used, None] if of_ratio else self.errors[used]
        return fit_mean_power_law(np.array(self.values)[used], measured, seed=seed)

    def verdict(self, seed: int) -> RateVerdict:
        """The error's exponent along the constant against the one the formula claims
        (:func:`theory_checks.verdicts.rate_verdict`): ``fails`` when the error grows
        faster in the constant than any multiple of the bound can follow;
        ``inconclusive`` for a "holds" whose interval reaches :data:`UNSEEN_POWER` above
        the claim along a constant the hypotheses do not bound."""
        law = self.law(seed, of_ratio=self.covarying)
        if law is None:
            return RateVerdict("inconclusive", f"fewer than two admissible values of {self.variable}")
        verdict = rate_verdict(law, self.claimed, self.bounded)
        if verdict.verdict == "holds" and not self.bounded and law.high >= self.claimed + UNSEEN_POWER:
            return RateVerdict("inconclusive", f"the exponent's interval [{law.low:+.2f}, {law.high:+.2f}] reaches "
                                               f"{UNSEEN_POWER:g} above the claimed {self.claimed:+.2f}: a factor "
                                               f"{self.variable} missing from the bound would not be seen")
        return verdict

    def summary(self, seed: int) -> dict[str, Any]:
        """What the report shows: values, mean errors, bounds, ratios, admissibility,
        the claimed and fitted exponents, the ratio's exponent over the sweep and the
        verdict."""
        means = self.errors.mean(axis=1)
        law, ratio, verdict = self.law(seed), self.law(seed, of_ratio=True), self.verdict(seed)
        return {"variable": self.variable, "values": list(self.values), "mean_errors": [float(m) for m in means],
                "rhs": list(self.rhs), "ratios": [float(m / r) if r > 0 else float("inf")
                                                  for m, r in zip(means, self.rhs)],
                "admissible": list(self.admissible), "arguments": [dict(a) for a in self.arguments],
                "claimed": self.claimed, "bounded": self.bounded, "covarying": self.covarying,
                "exponent": None if law is None else law.exponent,
                "interval": None if law is None else [law.low, law.high],
                "ratio_exponent": None if ratio is None else ratio.exponent,
                "verdict": verdict.verdict, "direction": verdict.direction}


def constant_spread(sweeps: Sequence[ConstantSweep]) -> float | None:
    """The largest over the smallest error / bound ratio across the admissible
    instances of ``sweeps`` (1: one constant fits them all exactly)."""
    ratios = [m / r for sweep in sweeps for m, r, ok in zip(sweep.errors.mean(axis=1), sweep.rhs, sweep.admissible)
              if ok and r > 0]
    return float(max(ratios) / min(ratios)) if ratios else None


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
        controls: the clustering controls (no clustering, a wrong partition, a random
            assignment: :mod:`theory_checks.assigned_controls`), each of which must
            violate a bound about clustering.
        bound: the bound as a formula with its arguments along the swept variable,
            where the study has one (the claimed exponent is then the formula's own).
        constant_sweeps: the instance's constants swept beside the variable.
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
    controls: tuple[NegativeControl, ...] = ()
    bound: BoundFormula | None = None
    constant_sweeps: tuple[ConstantSweep, ...] = ()


def _constant(table: Sequence[Mapping[str, Any]], sweeps: Sequence[ConstantSweep]) -> FittedConstant:
    """The smallest ``C`` covering every swept value and every admissible instance."""
    measured = [t["mean_error"] for t in table]
    rhs = [t["rhs"] for t in table]
    for sweep in sweeps:
        for mean, bound, ok in zip(sweep.errors.mean(axis=1), sweep.rhs, sweep.admissible):
            if ok:
                measured.append(float(mean))
                rhs.append(float(bound))
    return fit_constant(measured, rhs)


def assemble(theorem: str, sweeps: Sequence[Sweep], settings: dict[str, Any], seed: int,
             findings: dict[str, Any] | None = None, hypotheses: Sequence[Hypothesis] = (),
             control: NegativeControl | None = None, controls: Sequence[NegativeControl] = (),
             bound: BoundFormula | None = None, constant_sweeps: Sequence[ConstantSweep] = ()) -> ScalingStudy:
    """Rows, laws (fitted to the mean over the repeats) and the constant of ``sweeps``
    and ``constant_sweeps`` (every sweep needs two or more values and positive mean
    errors; the bootstrap is seeded by ``seed``)."""
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
    constant = _constant(table, constant_sweeps)
    return ScalingStudy(theorem, rows, laws, {s.variable: s.claimed for s in sweeps}, constant, table,
                        settings, findings or {}, tuple(hypotheses), control, tuple(controls), bound,
                        tuple(constant_sweeps))


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
    constant = _constant(table, study.constant_sweeps)

    def again(control: NegativeControl) -> NegativeControl:
        return control_against(control, rhs, claimed) if control.details.get("variable") == variable else control

    return replace(study, claimed={**study.claimed, variable: claimed}, constant=constant, claimed_rhs=table,
                   control=None if study.control is None else again(study.control),
                   controls=tuple(again(control) for control in study.controls))


def remeasured(study: ScalingStudy, variable: str, errors: np.ndarray, seed: int = 0) -> ScalingStudy:
    """``study`` with another algorithm's measurements ``errors[len(values), repeats]``
    along ``variable`` (the same bound, hypotheses and controls): what the algorithm
    mutations of the mutation tests judge, a method without its clustering in place
    of the method."""
    errors = np.asarray(errors, float)
    values = [entry["x"] for entry in study.claimed_rhs if entry["variable"] == variable]
    if errors.shape[0] != len(values):
        raise ValueError(f"{variable!r} has {len(values)} swept values, got errors of shape {errors.shape}")
    means = iter(errors.mean(axis=1))
    table = [dict(entry, mean_error=float(next(means))) if entry["variable"] == variable else dict(entry)
             for entry in study.claimed_rhs]
    rows = [row for row in study.rows if row["variable"] != variable]
    rows += Sweep(variable, tuple(values), errors, (), 0.0).rows()
    laws = {**study.laws, variable: fit_mean_power_law(values, errors, seed=seed)}
    return replace(study, rows=rows, laws=laws, claimed_rhs=table, constant=_constant(table, study.constant_sweeps))


def reformulated(study: ScalingStudy, formula: Formula) -> ScalingStudy:
    """``study`` judged against another bound *formula* on the same runs: its values
    along the swept variable and at every instance of the constant sweeps, the claimed
    exponent read from the formula itself (:func:`tail_exponent`, ``nan`` where it is
    not positive), the constant refitted and every control judged again.  What the
    mutation tests perturb: a slip in a bound's formula must move the verdict."""
    if study.bound is None:
        raise ValueError(f"{study.theorem} keeps no bound formula to re-evaluate")
    bound = replace(study.bound, formula=formula)
    rhs = evaluate(formula, bound.arguments)
    sweeps = tuple(sweep.with_formula(formula) for sweep in study.constant_sweeps)
    moved = replace(study, constant_sweeps=sweeps, bound=bound)
    return rejudged(moved, bound.variable, list(rhs), bound.claimed())


def describe_laws(laws: dict[str, PowerLaw], claimed: dict[str, float], bounded: frozenset[str] = frozenset()) -> str:
    """One line: every fitted exponent with its interval beside the claimed one, and its
    verdict with the direction of any departure (:func:`theory_checks.verdicts.rate_verdict`)."""
    parts = []
    for name, law in laws.items():
        verdict = rate_verdict(law, claimed[name], name in bounded)
        parts.append(f"{name}: {law.exponent:+.2f} [{law.low:+.2f}, {law.high:+.2f}] vs claimed "
                     f"{claimed[name]:+.2f} ({verdict.verdict}: {verdict.direction})")
    return "; ".join(parts)
